"""The page headers of a local Parquet file's row group: checked before it is decoded, and used
to skip the pages before a slice without decompressing them.

**Checked.** pyarrow passes over a page whose type it does not decode. So one damaged byte in
a page header (the type) drops that page's rows from its column without an error, and every
later row of the column moves up; only the group's end shows the shortfall, after the wrong
rows were served. For a group decoded in several batches the headers are read here first: a
page of another type, a second dictionary, or data pages whose rows do not add up to the
group's (a column that is not repeated) make the group damaged, before any of it is decoded.
(A group of one batch is counted as it is decoded.)

**Skipped.** A data page's header says how many rows it holds (a column that is not
repeated): :meth:`Pages.skips` finds the pages wholly before a slice, which
:mod:`tidal.formats.parquet_skipping` has pyarrow pass over unread, where that is safe; and
the dictionary page too where no page from the slice on is dictionary-encoded. A writer fills
a dictionary (1 MB by default) with a text column's first values, then writes the rest plain:
a slice past them decoded the dictionary (2 MB of snappy for long texts) for nothing.

A header this does not parse (pyarrow will say what is wrong with it when it reads it) means
no skipping for its column, and no verdict on it.
"""

from __future__ import annotations

import logging
import os
from bisect import bisect_left
from typing import Any, NamedTuple

from tidal.errors import FormatError
from tidal.formats.parquet_footer import Reader, serialized

# parquet.thrift field ids, and compact protocol types
_STOP, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT = (
    0,
    2,
    3,
    4,
    5,
    6,
    7,
    8,
    9,
    10,
    11,
    12,
)
_FILE_ROW_GROUPS = 4
_GROUP_COLUMNS, _GROUP_ROWS = 1, 3
_CHUNK_META = 3
_META_PATH, _META_VALUES, _META_COMPRESSED, _META_DATA_PAGE, _META_DICTIONARY_PAGE = 3, 5, 7, 9, 11
_PAGE_TYPE, _PAGE_COMPRESSED, _PAGE_V1, _PAGE_V2 = 1, 3, 5, 8
_V1_VALUES, _V2_ROWS = 1, 3
_V1_ENCODING, _V2_ENCODING = 2, 4
_DICTIONARY_ENCODINGS = (2, 8)  # PLAIN_DICTIONARY, RLE_DICTIONARY
DATA_PAGE, INDEX_PAGE, DICTIONARY_PAGE, DATA_PAGE_V2 = 0, 1, 2, 3

_TYPE_FIELD = 0x15  # field 1 (delta 1), an i32: how a header's page type begins
ZIGZAG = {DATA_PAGE: 0, INDEX_PAGE: 2, DICTIONARY_PAGE: 4, DATA_PAGE_V2: 6}  # page types as one-byte zigzag varints
_log = logging.getLogger("tidal")

_HEADER_READ = 4096  # a header's first read; one with long statistics is read again, larger
_HEADER_MAX = 16 << 20


class Page(NamedTuple):
    at: int  # where its header starts in the file
    kind: int
    held: int  # rows (a v2 data page; a v1 one of a column that is not repeated), else values
    retypable: bool  # whether its type is the header's first byte after the field's
    plain: bool = False  # a data page whose values are not dictionary-encoded


class Leaf(NamedTuple):
    column: str  # the top-level column it is part of
    repeated: bool
    pages: list[Page] | None  # None: a header that does not parse


class Pages:
    """The page headers of one local Parquet file, read a row group at a time. ``path`` names
    the file in messages; ``local`` is where its bytes are, opened once (what :class:`Retyped`
    reads too: the file the footer was read from, even if the path is replaced)."""

    def __init__(self, local: str, metadata: Any, repeated: list[bool], path: str):
        self._path, self._repeated = path, repeated
        self.fd = os.open(local, os.O_RDONLY)
        self._close = os.close  # held: a reader may be closed at interpreter exit, its modules gone
        self._groups = Groups(metadata)
        self._last: tuple[int, list[Leaf] | None] = (-1, None)

    def leaves(self, group: int) -> list[Leaf] | None:
        """Each leaf column's pages in ``group`` (the last group asked for is kept); None where
        the footer does not say where they are."""
        if self._last[0] != group:
            self._last = (group, self._read(group))
        return self._last[1]

    def _read(self, group: int) -> list[Leaf] | None:
        found = self._groups.get(group)
        if found is None or len(found[1]) != len(self._repeated):
            return None
        rows, chunks = found
        out = []
        for meta, repeated in zip(chunks, self._repeated, strict=True):
            names, size = meta.get(_META_PATH), meta.get(_META_COMPRESSED)
            data, dictionary = meta.get(_META_DATA_PAGE), meta.get(_META_DICTIONARY_PAGE)
            values = meta.get(_META_VALUES)
            if not names or not isinstance(size, int) or not isinstance(data, int) or not isinstance(values, int):
                return None
            begin = dictionary if isinstance(dictionary, int) and 0 < dictionary < data else data
            column = names[0].decode("utf-8", "replace")
            most = max(rows, values) + 64  # pages: one holds at least a row or a value, but for a few
            try:
                pages = _pages(self.fd, begin, begin + size, most, self._path)
            except OSError:
                return None  # no verdict: reading the group will say what is wrong
            out.append(Leaf(column, repeated, pages))
        return out

    def close(self) -> None:
        if self.fd >= 0:
            self._close(self.fd)
            self.fd = -1

    def damage(self, group: int, rows: int) -> str | None:
        """What is wrong with ``group``'s page headers (of ``rows`` rows), or None."""
        for leaf in self.leaves(group) or []:
            if leaf.pages is None:
                continue
            kinds = [p.kind for p in leaf.pages]
            where = f"row group {group}, column {leaf.column!r}"
            for page in leaf.pages:
                if page.kind not in (DATA_PAGE, DICTIONARY_PAGE, DATA_PAGE_V2):
                    return f"{where}: a page of unknown type {page.kind} at byte {page.at}"
            if DICTIONARY_PAGE in kinds[1:]:
                return f"{where}: a dictionary page after its first page"
            held = sum(p.held for p in leaf.pages if p.kind != DICTIONARY_PAGE)
            if not leaf.repeated and held != rows:  # a repeated column's pages count values
                return f"{where}: its pages hold {held} rows, the row group {rows}"
        return None

    def skips(self, group: int, row: int) -> tuple[dict[str, int], list[int]]:
        """For a slice of ``group`` starting at ``row``: the row each top-level column can be
        decoded from (the first row of the page ``row`` is in; 0 where it cannot skip), and the
        headers whose page type :class:`Retyped` changes. For a group whose :meth:`damage` is None
        (the reader checks it as it starts the group)."""
        leaves = self.leaves(group) or []
        per_column: dict[str, int] = {}
        for leaf in leaves:
            per_column[leaf.column] = per_column.get(leaf.column, 0) + 1
        starts: dict[str, int] = {}
        patches: list[int] = []
        for leaf in leaves:
            data = [p for p in leaf.pages or [] if p.kind != DICTIONARY_PAGE]
            firsts = [0]
            for page in data:
                firsts.append(firsts[-1] + page.held)
            k = bisect_left(firsts, row + 1) - 1  # the page ``row`` is in
            skippable = leaf.pages is not None and not leaf.repeated and per_column[leaf.column] == 1
            if not skippable or k <= 0 or not all(p.retypable for p in data[:k]):
                starts[leaf.column] = 0
                continue
            starts[leaf.column] = firsts[k]
            patches += [p.at for p in data[:k]]
            first = leaf.pages[0] if leaf.pages else None
            if (
                first is not None
                and first.kind == DICTIONARY_PAGE
                and first.retypable
                and all(p.plain for p in data[k:])
            ):
                patches.append(first.at)  # no page from here on needs it
        return starts, patches


def bytes_to(groups: Groups, group: int, row: int, columns: list[str] | None) -> int | None:
    """About the bytes a column chunk of ``group`` (the largest of ``columns``, None: all) is read
    to decode its rows up to ``row``, from the footer alone: its dictionary page, and its data in
    proportion. What a point read of a file read by ranges fetches at once (:mod:`tidal.formats.parquet`);
    None where the footer does not say."""
    found = groups.get(group)
    if found is None:
        return None
    rows, chunks = found
    most = 0
    for meta in chunks:
        names, size = meta.get(_META_PATH), meta.get(_META_COMPRESSED)
        data, dictionary = meta.get(_META_DATA_PAGE), meta.get(_META_DICTIONARY_PAGE)
        if not names or not isinstance(size, int) or not isinstance(data, int):
            return None
        if columns is not None and names[0].decode("utf-8", "replace") not in columns:
            continue
        head = data - dictionary if isinstance(dictionary, int) and 0 < dictionary < data else 0
        most = max(most, head + (size - head) * min(row, rows) // max(1, rows))
    return most


class Groups:
    """The row groups of a footer, read from its Thrift as far as asked for, each group's column
    chunks only where their pages are. A footer of hundreds of groups is 100s of KB; read from the
    middle (a resume), half of it is passed over, at about 0.1 µs a byte. The bytes are pyarrow's
    own serialization of the footer it parsed (:func:`~tidal.formats.parquet_footer.serialized`):
    well formed, or not read at all."""

    def __init__(self, metadata: Any):
        self._buf = serialized(metadata)
        self._read: list[tuple[int, list[dict[int, Any]]]] = []  # (rows, each chunk's fields)
        try:
            self._at, self._left = self._find_groups()
        except (IndexError, RecursionError, ValueError):
            self._at, self._left = 0, 0  # not what pyarrow writes: no verdict

    def _find_groups(self) -> tuple[int, int]:
        """Where the footer's first row group starts, and how many there are."""
        buf, at, last = self._buf, 0, 0
        while True:
            kind, last, at = _field(buf, at, last)
            if kind == _STOP:
                return at, 0
            if last == _FILE_ROW_GROUPS and kind == _LIST:
                item, size, at = _list(buf, at)
                return at, size if item == _STRUCT else 0
            at = _skip(buf, at, kind, 0)

    def get(self, group: int) -> tuple[int, list[dict[int, Any]]] | None:
        """``group``'s rows and each column chunk's ``ColumnMetaData`` fields this reads."""
        try:
            while len(self._read) <= group and self._left:
                self._at = self._group(self._at)
                self._left -= 1
        except (IndexError, RecursionError, ValueError):
            self._left = 0  # not what pyarrow writes: no verdict on the groups after
        return self._read[group] if group < len(self._read) else None

    def _group(self, at: int) -> int:
        """Read the ``RowGroup`` at ``at``; where it ends."""
        buf, last, rows = self._buf, 0, -1
        chunks: list[dict[int, Any]] = []
        while True:
            kind, last, at = _field(buf, at, last)
            if kind == _STOP:
                self._read.append((rows, chunks))
                return at
            if last == _GROUP_ROWS and kind in (_I32, _I64):
                rows, at = _zigzag(buf, at)
            elif last == _GROUP_COLUMNS and kind == _LIST:
                _, size, at = _list(buf, at)
                for _ in range(size):
                    fields, at = _chunk(buf, at)
                    chunks.append(fields)
            else:
                at = _skip(buf, at, kind, 0)


def _chunk(buf: bytes, at: int) -> tuple[dict[int, Any], int]:
    """The ``ColumnChunk`` at ``at``: the fields of its ``ColumnMetaData`` this reads, and its end."""
    fields: dict[int, Any] = {}
    last = 0
    while True:
        kind, last, at = _field(buf, at, last)
        if kind == _STOP:
            return fields, at
        if last != _CHUNK_META or kind != _STRUCT:
            at = _skip(buf, at, kind, 0)
            continue
        inner = 0
        while True:
            kind, inner, at = _field(buf, at, inner)
            if kind == _STOP:
                break
            if inner == _META_PATH and kind == _LIST:
                _, size, at = _list(buf, at)
                path = []
                for _ in range(size):
                    n, at = _varint(buf, at)
                    path.append(buf[at : at + n])
                    at += n
                fields[inner] = path
            elif inner in (_META_VALUES, _META_COMPRESSED, _META_DATA_PAGE, _META_DICTIONARY_PAGE) and kind in (
                _I32,
                _I64,
            ):
                fields[inner], at = _zigzag(buf, at)
            else:
                at = _skip(buf, at, kind, 0)


def _field(buf: bytes, at: int, last: int) -> tuple[int, int, int]:
    """The struct field header at ``at`` (``last``: the field before): its type (``_STOP`` at the
    struct's end), its id, and where its value starts."""
    head = buf[at]
    kind, delta = head & 0x0F, head >> 4
    if kind == _STOP or delta:
        return kind, last + delta, at + 1
    field, at = _varint(buf, at + 1)
    return kind, (field >> 1) ^ -(field & 1), at


def _list(buf: bytes, at: int) -> tuple[int, int, int]:
    """The list header at ``at``: its items' type, how many, and where they start."""
    head = buf[at]
    size, at = (head >> 4, at + 1) if head >> 4 != 15 else _varint(buf, at + 1)
    return head & 0x0F, size, at


def _varint(buf: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = buf[at]
        at += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, at
        shift += 7


def _zigzag(buf: bytes, at: int) -> tuple[int, int]:
    n, at = _varint(buf, at)
    return (n >> 1) ^ -(n & 1), at


def _skip(buf: bytes, at: int, kind: int, depth: int) -> int:
    """Pass over one Thrift value of ``kind`` at ``at``; where it ends."""
    if depth > 64:
        raise ValueError("values nested too deep")
    if kind <= _FALSE:
        return at
    if kind == _BYTE:
        return at + 1
    if kind <= _I64:
        while buf[at] & 0x80:
            at += 1
        return at + 1
    if kind == _DOUBLE:
        return at + 8
    if kind == _BINARY:
        n, at = _varint(buf, at)
        return at + n
    if kind in (_LIST, _SET):
        item, size, at = _list(buf, at)
        if item <= _BYTE:  # bools (a byte each in a list) and bytes
            return at + size
        for _ in range(size):
            at = _skip(buf, at, item, depth + 1)
        return at
    if kind == _MAP:
        size, at = _varint(buf, at)
        if size:
            types = buf[at]
            at += 1
            for _ in range(size):
                at = _skip(buf, _skip(buf, at, types >> 4, depth + 1), types & 0x0F, depth + 1)
        return at
    if kind == _STRUCT:
        while True:
            head = buf[at]
            at += 1
            if head & 0x0F == _STOP:
                return at
            if not head >> 4:
                at = _skip(buf, at, _I16, depth)
            at = _skip(buf, at, head & 0x0F, depth + 1)
    raise ValueError(f"unknown Thrift type {kind}")


def _pages(fd: int, begin: int, end: int, most: int, path: str) -> list[Page] | None:
    """The pages of the column chunk at ``[begin, end)``; None where a header does not parse,
    the pages do not end where the chunk does, or there are more than ``most``."""
    out: list[Page] = []
    at = begin
    while at < end:
        if len(out) >= most:
            return None
        header = _header(fd, at, path)
        if header is None:
            return None
        fields, length, head = header
        kind, size = fields.get(_PAGE_TYPE), fields.get(_PAGE_COMPRESSED)
        if not isinstance(kind, int) or not isinstance(size, int) or size < 0:
            return None
        inner = fields.get(_PAGE_V2 if kind == DATA_PAGE_V2 else _PAGE_V1)
        count = inner.get(_V2_ROWS if kind == DATA_PAGE_V2 else _V1_VALUES) if isinstance(inner, dict) else 0
        if not isinstance(count, int) or count < 0:
            return None
        retypable = head[0] == _TYPE_FIELD and head[1] in (
            ZIGZAG[DATA_PAGE],
            ZIGZAG[DATA_PAGE_V2],
            ZIGZAG[DICTIONARY_PAGE],
        )
        encoding = (
            inner.get(_V2_ENCODING if kind == DATA_PAGE_V2 else _V1_ENCODING) if isinstance(inner, dict) else None
        )
        plain = kind != DICTIONARY_PAGE and isinstance(encoding, int) and encoding not in _DICTIONARY_ENCODINGS
        out.append(Page(at, kind, count, retypable, plain))
        at += length + size
    return out if at == end else None


def _header(fd: int, at: int, path: str) -> tuple[dict[int, Any], int, bytes] | None:
    """The page header at ``at``: its fields, its length in bytes, and its first two bytes."""
    want = _HEADER_READ
    while want <= _HEADER_MAX:
        buf = os.pread(fd, want, at)
        reader = Reader(buf, path)
        try:
            return reader.struct(), reader.at, buf[:2]
        except FormatError:
            if not reader.short or len(buf) < want:
                return None  # damaged, or the file ends inside it
            want *= 16  # statistics longer than the read: read more
    return None
