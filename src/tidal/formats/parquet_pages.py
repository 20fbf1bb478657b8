"""Skipping the pages of a Parquet row group that lie before a row, without decompressing them.

pyarrow 26 decodes a row group from its first row: it has no row-range read and uses no page
index. A slice that starts deep in a row group (a resume, or the first block of a worker whose
share starts in the middle of a group) would decode every row before it, up to a whole group
per file. But each data page's header says how many rows it holds, for a column that is not
repeated, and pyarrow passes over pages of a kind it does not decode (``INDEX_PAGE``) unread.
So the headers of the pages wholly before the slice are read here, and the file handed to
pyarrow says ``INDEX_PAGE`` in each of them: one byte changed in what is read, never in the
file. Each top-level column is then decoded from the page its slice starts in.

Anything unexpected (a repeated or nested column, a header this does not parse, page rows
that do not add up to the group's) means no skipping for that column: it is decoded from the
group's first row, as before.
"""

from __future__ import annotations

import io
import os
from bisect import bisect_left
from typing import Any

from tidal.errors import FormatError
from tidal.formats.parquet_footer import Reader, footer

# parquet.thrift field ids
_FILE_ROW_GROUPS = 4
_GROUP_COLUMNS = 1
_CHUNK_META = 3
_META_PATH, _META_COMPRESSED, _META_DATA_PAGE, _META_DICTIONARY_PAGE = 3, 7, 9, 11
_PAGE_TYPE, _PAGE_COMPRESSED, _PAGE_V1, _PAGE_V2 = 1, 3, 5, 8
_V1_VALUES, _V2_ROWS = 1, 3
DATA_PAGE, INDEX_PAGE, DATA_PAGE_V2 = 0, 1, 3

_TYPE_FIELD = 0x15  # field 1 (delta 1), an i32: how a header's page type begins
_ZIGZAG = {DATA_PAGE: 0, INDEX_PAGE: 2, DATA_PAGE_V2: 6}  # the page types as one-byte zigzag varints
_HEADER_READ = 4096  # a header's first read; one with long statistics is read again, larger
_HEADER_MAX = 16 << 20


def pages(fd: int, begin: int, end: int, rows: int, path: str) -> list[tuple[int, int]] | None:
    """``(offset of its header, its first row)`` of each data page of the column chunk at
    ``[begin, end)`` of the open file ``fd``; None where the headers cannot say (they do not
    parse, or their rows do not add up to ``rows``)."""
    out: list[tuple[int, int]] = []
    at, row = begin, 0
    while at < end:
        header = _header(fd, at, path)
        if header is None:
            return None
        fields, length = header
        kind, size = fields.get(_PAGE_TYPE), fields.get(_PAGE_COMPRESSED)
        if not isinstance(size, int) or size < 0:
            return None
        if kind in (DATA_PAGE, DATA_PAGE_V2):
            inner = fields.get(_PAGE_V1 if kind == DATA_PAGE else _PAGE_V2)
            n = inner.get(_V1_VALUES if kind == DATA_PAGE else _V2_ROWS) if isinstance(inner, dict) else None
            if not isinstance(n, int) or n < 0:
                return None
            out.append((at, row))
            row += n
        at += length + size
    return out if at == end and row == rows else None


def _header(fd: int, at: int, path: str) -> tuple[dict[int, Any], int] | None:
    """The page header at ``at``: its fields and its length in bytes."""
    want = _HEADER_READ
    while want <= _HEADER_MAX:
        buf = os.pread(fd, want, at)
        reader = Reader(buf, path)
        try:
            return reader.struct(), reader.at
        except FormatError:
            if not reader.short or len(buf) < want:
                return None  # damaged, or the file ends inside it
            want *= 16  # statistics longer than the read: read more
    return None


class Chunks:
    """The leaf columns of one row group as the footer has them: where each one's pages are."""

    def __init__(self, metadata: Any, path: str):
        self._groups = footer(metadata, path).get(_FILE_ROW_GROUPS, [])

    def leaves(self, group: int) -> list[tuple[str, int, int]] | None:
        """``(top-level column, first byte, end)`` of each column chunk of ``group``."""
        if group >= len(self._groups):
            return None
        out = []
        for chunk in self._groups[group].get(_GROUP_COLUMNS, []):
            meta = chunk.get(_CHUNK_META) if isinstance(chunk, dict) else None
            if not isinstance(meta, dict):
                return None
            names, size = meta.get(_META_PATH), meta.get(_META_COMPRESSED)
            data, dictionary = meta.get(_META_DATA_PAGE), meta.get(_META_DICTIONARY_PAGE)
            if not names or not isinstance(names[0], bytes) or not isinstance(size, int) or not isinstance(data, int):
                return None
            begin = dictionary if isinstance(dictionary, int) and 0 < dictionary < data else data
            out.append((names[0].decode("utf-8", "replace"), begin, begin + size))
        return out


def skips(
    fd: int, chunks: Chunks, group: int, rows: int, row: int, repeated: list[bool], path: str
) -> tuple[dict[str, int], list[int]]:
    """For a slice of ``group`` (of ``rows`` rows) starting at ``row``: the row each top-level
    column can be decoded from (the first row of the page ``row`` is in; 0 where it cannot
    skip), and the header offsets whose page type to change. ``repeated``: whether each leaf
    column (in the footer's order) is repeated."""
    leaves = chunks.leaves(group) or []
    if len(leaves) != len(repeated):
        return {}, []
    counts: dict[str, int] = {}
    for name, _, _ in leaves:
        counts[name] = counts.get(name, 0) + 1
    starts: dict[str, int] = {}
    patches: list[int] = []
    for (name, begin, end), many in zip(leaves, repeated, strict=True):
        found = pages(fd, begin, end, rows, path) if counts[name] == 1 and not many else None
        firsts = [first for _, first in found or []]
        k = bisect_left(firsts, row + 1) - 1  # the page ``row`` is in
        offsets = [at for at, _ in (found or [])[: max(k, 0)]]
        if k <= 0 or not all(_retypable(fd, at) for at in offsets):
            starts[name] = 0
            continue
        starts[name] = firsts[k]
        patches += offsets
    return starts, patches


def _retypable(fd: int, at: int) -> bool:
    head = os.pread(fd, 2, at)
    return len(head) == 2 and head[0] == _TYPE_FIELD and head[1] in (_ZIGZAG[DATA_PAGE], _ZIGZAG[DATA_PAGE_V2])


class Retyped(io.RawIOBase):
    """A local file read as it is, except that each header at ``patches`` says ``INDEX_PAGE``."""

    def __init__(self, path: str, patches: list[int]):
        self._fd = os.open(path, os.O_RDONLY)
        self._size = os.fstat(self._fd).st_size
        self._at = 0
        self._patches = sorted(p + 1 for p in patches)  # the byte after the field header: the type's value

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._at, io.SEEK_END: self._size}[whence]
        self._at = max(0, base + offset)
        return self._at

    def tell(self) -> int:
        return self._at

    def read(self, size: int = -1) -> bytes:
        """One ``pread``: pyarrow reads a buffer at a time, and a copy more would cost as much."""
        size = self._size - self._at if size < 0 else size
        data = os.pread(self._fd, size, self._at)
        lo, hi = bisect_left(self._patches, self._at), bisect_left(self._patches, self._at + len(data))
        if lo < hi:
            patched = bytearray(data)
            for p in self._patches[lo:hi]:
                patched[p - self._at] = _ZIGZAG[INDEX_PAGE]
            data = bytes(patched)
        self._at += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(memoryview(buffer).cast("B")))
        memoryview(buffer).cast("B")[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            os.close(self._fd)
        super().close()
