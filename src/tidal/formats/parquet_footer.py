"""The bytes of each column of a Parquet file, read from its footer's Thrift without pyarrow's
``RowGroupMetaData.column()``.

That accessor builds the C++ column-chunk metadata outside pyarrow's exception handling
(pyarrow 26's ``libparquet.pxd`` declares ``RowGroupMetaData::ColumnChunk`` without
``except +``): a damaged footer (a level histogram of the wrong length, say) throws a
``parquet::ParquetException`` nothing catches, and the process aborts ("terminate called after
throwing an instance of 'parquet::ParquetException'"). Reading the data reports the same damage
as an ``OSError``, so only this one look at the footer needs its own way in: the footer pyarrow
parsed, written back out by a documented call (``FileMetaData.write_metadata_file``), and
decoded here with Thrift's compact protocol.

No upstream issue was found for the abort (apache/arrow). The report to file, "[Python][Parquet]
RowGroupMetaData.column() aborts the process on a damaged footer (ColumnChunk lacks except +)",
with pyarrow 26.0.1 on Linux x86-64 and CPython 3.11, has this reproducer::

    import pyarrow as pa, pyarrow.parquet as pq
    table = pa.table({"id": pa.array([1, None, 3] * 20, pa.int64()), "text": ["x", None, "yz"] * 20,
                      "tokens": [[1, 2], None, []] * 20})
    pq.write_table(table, "good.parquet", row_group_size=25)
    raw = bytearray(open("good.parquet", "rb").read())
    start = len(raw) - 8 - int.from_bytes(raw[-8:-4], "little")
    raw[start + 44] = 19  # one byte of the footer: column 2's definition level histogram, 4 entries not 3
    open("bad.parquet", "wb").write(raw)
    pq.read_table("bad.parquet")  # OSError: Definition level histogram size mismatch, size: 4, expected: 3
    pq.ParquetFile("bad.parquet").metadata.row_group(0).column(2)  # SIGABRT, no Python exception
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from tidal.errors import FormatError

# compact protocol types
_STOP, _TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT = range(13)
_MAX_DEPTH = 64

# field ids in parquet.thrift
_FILE_ROW_GROUPS = 4
_GROUP_COLUMNS = 1
_CHUNK_META = 3
_META_PATH, _META_COMPRESSED = 3, 7


class Reader:
    """Thrift's compact protocol over ``buf``: every struct as ``{field id: value}``; a
    FormatError naming ``path`` where the bytes are not that."""

    def __init__(self, buf: bytes, path: str):
        self.buf, self.at, self.path = buf, 0, path
        self.short = False  # whether it ran off the end of ``buf`` (a value read in part)

    def damaged(self, why: str) -> FormatError:
        return FormatError(f"{self.path}: corrupt Parquet footer: {why}")

    def byte(self) -> int:
        if self.at >= len(self.buf):
            self.short = True
            raise self.damaged("it ends inside a value")
        self.at += 1
        return self.buf[self.at - 1]

    def varint(self) -> int:
        shift = value = 0
        while True:
            b = self.byte()
            value |= (b & 0x7F) << shift
            if b < 0x80:
                return value
            shift += 7
            if shift > 70:
                raise self.damaged("a varint longer than 10 bytes")

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def take(self, n: int) -> bytes:
        if n < 0 or self.at + n > len(self.buf):
            self.short = n >= 0
            raise self.damaged("it ends inside a value")
        self.at += n
        return self.buf[self.at - n : self.at]

    def value(self, kind: int, depth: int) -> Any:
        if depth > _MAX_DEPTH:
            raise self.damaged("values nested too deep")
        if kind in (_TRUE, _FALSE):  # a bool field is its type; in a list, one byte
            return kind == _TRUE
        if kind == _BYTE:
            return self.byte()
        if kind in (_I16, _I32, _I64):
            return self.zigzag()
        if kind == _DOUBLE:
            return self.take(8)
        if kind == _BINARY:
            return self.take(self.varint())
        if kind in (_LIST, _SET):
            head = self.byte()
            size, item = head >> 4, head & 0x0F
            if size == 15:
                size = self.varint()
            if item in (_TRUE, _FALSE):
                return [self.byte() == 1 for _ in range(size)]
            return [self.value(item, depth + 1) for _ in range(size)]
        if kind == _MAP:
            size = self.varint()
            if not size:
                return {}
            types = self.byte()
            if types >> 4 in (_LIST, _SET, _MAP, _STRUCT):
                raise self.damaged("a map whose keys are not plain values")  # parquet.thrift has none
            return {self.value(types >> 4, depth + 1): self.value(types & 0x0F, depth + 1) for _ in range(size)}
        if kind == _STRUCT:
            return self.struct(depth + 1)
        raise self.damaged(f"unknown Thrift type {kind}")

    def struct(self, depth: int = 0) -> dict[int, Any]:
        fields: dict[int, Any] = {}
        last = 0
        while True:
            head = self.byte()
            kind = head & 0x0F
            if kind == _STOP:
                return fields
            delta = head >> 4
            last = last + delta if delta else self.zigzag()
            fields[last] = self.value(kind, depth)


def serialized(metadata: Any) -> bytes:
    """The Thrift bytes of ``metadata`` (a ``pyarrow.parquet.FileMetaData``), as pyarrow writes
    a footer: the metadata-only file ``write_metadata_file`` makes is ``PAR1``, the footer, its
    length (4 bytes) and ``PAR1``."""
    sink = pa.BufferOutputStream()
    metadata.write_metadata_file(sink)
    data = sink.getvalue()
    return data.slice(4, data.size - 12).to_pybytes()


def footer(metadata: Any, path: str) -> dict[int, Any]:
    """``metadata`` (a ``pyarrow.parquet.FileMetaData``) as Thrift fields."""
    return Reader(serialized(metadata), path).struct()


def column_bytes(path: str, metadata: Any) -> dict[str, int]:
    """Compressed bytes of each top-level column over every row group of ``metadata``;
    FormatError naming ``path`` where the footer lacks them."""
    sizes: dict[str, int] = {}
    for g, group in enumerate(footer(metadata, path).get(_FILE_ROW_GROUPS, [])):
        for c, chunk in enumerate(group.get(_GROUP_COLUMNS, [])):
            meta = chunk.get(_CHUNK_META)
            names = meta.get(_META_PATH) if isinstance(meta, dict) else None
            size = meta.get(_META_COMPRESSED) if isinstance(meta, dict) else None
            if not names or not isinstance(names[0], bytes) or not isinstance(size, int) or size < 0:
                raise FormatError(f"{path}: corrupt Parquet footer: row group {g}, column {c} has no path or size")
            top = names[0].decode("utf-8", "replace")
            sizes[top] = sizes.get(top, 0) + size
    return sizes
