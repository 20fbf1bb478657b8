"""Parquet: column projection, opened at any row through its row groups.

``path`` names the file in errors. The bytes are read from ``file`` when it is given
(``info["file"]`` or ``file=``): a local path (a remote shard's copy in the shard cache), a
binary file, or a function that opens one (a remote file read in place by byte ranges, for
a few columns of a large file). The index keeps each top-level column's compressed size,
which is how the reader decides between the two.

Each file's column types are kept in the index (``info["types"]``), so that a dataset whose
files drifted (int32 and int64 ids, a column added later) reads as one schema: see
:mod:`tidal.formats.schemas` (and ``format_options={"column_types": {...}}``, which declares a
column's type). A column asked for that a file lacks is null in its records.

What is checked: the footer when a file is scanned; each data page's CRC when it is read,
where the writer stored one (``pq.write_table(..., write_page_checksum=True)``; Arrow
does not by default); and every row read is validated (offsets, and UTF-8 in string
columns), so a damaged page is an error, not garbage or a crash further on. Rows that cannot
be read are a :class:`~tidal.errors.RecordError` naming the file and the first of them: what
is skipped under ``errors="skip"`` is at most the strip of ``STRIP_ROWS`` rows of its row
group that a damaged page is in (the part of it a slice's read meets; the whole row group
where its page headers are damaged). A file read in place by ranges has no page headers read:
a strip is decoded from its group's first row, so every strip from the damaged one to the
group's end is skipped. A string that is not UTF-8 is an error naming its row (only that row
skipped).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import IO, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tidal.errors import FormatError, RecordError, StorageError
from tidal.formats import Errors, Options, Piece, check_options, schemas, source
from tidal.formats.bad_data import bad, data_errors
from tidal.formats.parquet_footer import column_bytes
from tidal.formats.parquet_pages import Groups, Pages, bytes_to
from tidal.formats.parquet_skipping import Retyped, skipping
from tidal.tables import keep

NAME = "parquet"
STREAM_ROWS = 1024
# What bad data costs: a strip of this many rows of a row group (from its first row) that does
# not decode is skipped whole, decoded alone. It is also what a point read of one row decodes
# (tidal.stages.points), so that its verdict is the block read's: a few pages, not the row group.
STRIP_ROWS = 256
BUFFER = 1 << 20  # a local file is read 1 MiB at a time as its pages are decoded, not a column chunk at once
LEAN_BUFFER = 1 << 20  # what a point read of a remote file fetches past its estimate: a page

Source = str | IO[bytes] | Callable[[], IO[bytes]]

DECODES_WITHOUT_GIL = True  # pyarrow decodes with the GIL released: see tidal.formats.threaded
ARROW_SCHEMA = True  # its scan keeps each file's Arrow schema: a column has one type over the dataset


def _open_file(path: str, file: Any = None) -> pq.ParquetFile:
    source = path if file is None else file() if callable(file) else file
    try:
        local = isinstance(source, str)
        return pq.ParquetFile(
            source, pre_buffer=not local, buffer_size=BUFFER if local else 0, page_checksum_verification=True
        )
    except StorageError:
        raise
    except data_errors() as exc:
        raise FormatError(f"{path}: not a readable Parquet file: {exc}") from None


def scan(path: str, compression: str | None, file: Source | None = None) -> dict:
    if compression is not None:
        raise FormatError(f"{path}: Parquet compresses inside the file; a {compression} wrapper is not supported")
    pf = _open_file(path, file)
    try:
        meta = pf.metadata
        names = pf.schema_arrow.names
        types = schemas.encode(pf.schema_arrow)
        groups = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        sizes = column_bytes(path, meta)  # not meta.row_group(g).column(c): a damaged footer aborts the process there
    except StorageError:
        raise
    except data_errors() as exc:
        raise FormatError(f"{path}: corrupt Parquet footer: {exc}") from None
    finally:
        pf.close()  # its own handle; a file object it was given stays open
    if sum(groups) != meta.num_rows or min(groups, default=0) < 0:
        raise FormatError(f"{path}: corrupt Parquet footer: row groups of {groups} rows, {meta.num_rows} in all")
    return {"rows": meta.num_rows, "row_groups": groups, "column_bytes": sizes, "names": names, "types": types}


def preload() -> None:
    """What a process works out once, before DataLoader workers are forked from it
    (:func:`tidal.transport.warmup.preload_readers`): not again in each of them."""
    skipping()


def columns(info: dict) -> list[str] | None:
    """The top-level columns (from an older index without them: those the row groups hold)."""
    if "names" in info:
        return list(info["names"])
    return list(info.get("column_bytes", {})) if info.get("row_groups") else None


def around(info: dict, start: int, stop: int, row: int) -> tuple[int, int]:
    """The rows a point read of ``row`` (of a slice ``[start, stop)``) reads so that it finds what
    reading the slice does: the strip of ``row`` (its ``STRIP_ROWS`` rows of its row group), whole,
    within the slice or not. A slice read that meets damage decodes each of its strips alone and
    skips those that fail (:meth:`ParquetReader._strips`): a strip that decodes serves its rows
    either way, and a point read that meets anything falls back to the slice read
    (:mod:`tidal.stages.blocks`)."""
    starts = np.cumsum(info["row_groups"])
    g = int(np.searchsorted(starts, row, side="right"))
    first = int(starts[g - 1]) if g else 0
    strip = first + (row - first) // STRIP_ROWS * STRIP_ROWS
    return strip, min(int(starts[g]), strip + STRIP_ROWS)


class ParquetReader:
    def __init__(self, path: str, info: dict, columns: list[str] | None, errors: Errors):
        self._path = path
        where = source(path, info)
        self._file = _open_file(path, where)
        self._local = where if isinstance(where, str) and os.path.isfile(where) else None  # pages can be read
        self._where = where
        self._lean: pq.ParquetFile | None = None  # a remote file read as far as a point read needs (point)
        self._pointing, self._until = False, 0
        self._groups: Groups | None = None  # the footer's row groups, where a point read asks
        self._pages: Pages | None = None
        try:
            names = self._file.schema_arrow.names
        except data_errors() as exc:
            raise FormatError(f"{path}: not a readable Parquet file: {exc}") from None
        if "names" in info and names != info["names"]:
            raise FormatError(f"{path}: its columns {names} are not the {info['names']} it was indexed with; damaged?")
        # the dataset's schema where this file's differs (tidal.formats.schemas), or nulls for
        # the columns asked for that it lacks; its rows are cast to it as they are read
        self._target = schemas.target(info, columns)
        missing = [c for c in columns or [] if c not in names]
        if missing and (self._target is None or any(c not in self._target.names for c in missing)):
            # the dataset's types unknown (an index without them): nulls of no type, joined in the block
            own, known = self._file.schema_arrow, self._target
            self._target = pa.schema(
                [
                    known.field(c)
                    if known is not None and c in known.names
                    else own.field(c)
                    if c in names
                    else pa.field(c, pa.null())
                    for c in columns or []
                ]
            )
        self._columns = [c for c in columns if c in names] if columns is not None else None
        self._errors = errors
        self._starts = np.concatenate([[0], np.cumsum(info["row_groups"])]).astype(np.int64)
        self._stream: _Stream | _Columns | None = None  # the row group being decoded front to back

    def _streamed(self, g: int, a: int, z: int) -> pa.Table | None:
        """Rows ``[a, z)`` of row group ``g``, decoded front to back a few thousand rows at a
        time; None when they must be read strip by strip (damaged: see :meth:`_strips`)."""
        try:
            stream = self._stream
            if stream is None or stream.group != g or stream.row > a or self._leaps(stream, a):
                self._drop_stream()
                stream = self._stream = self._start(g, a, z)
            table = stream.take(a, z)
        except StorageError:
            raise  # the network, not the data: never skipped as a bad row group
        except data_errors():
            self._drop_stream()
            return None
        if stream.row >= stream.rows:
            self._drop_stream()  # read to its end: in epoch order no slice comes back to it
        return table

    def _leaps(self, stream: _Stream | _Columns, a: int) -> bool:
        """Whether decoding row ``a`` of ``stream``'s group on from its pages beats decoding on to
        it: a gap of a batch or more (rows another reader read before an elastic restore), where
        every column asked for has a page that starts past the stream's row."""
        if a - stream.row < STREAM_ROWS or self._pages is None:
            return False
        starts, patches = self._pages.skips(stream.group, a)
        names = self._columns or self._file.schema_arrow.names
        return bool(patches) and all(starts.get(name, 0) > stream.row for name in names) and skipping()

    def _start(self, g: int, a: int, z: int, exact: bool = False) -> _Stream | _Columns:
        """Row group ``g`` decoded from row ``a`` on, for rows up to ``z`` first: each column from
        the page ``a`` is in, where its pages can be skipped, else from the group's first row. A
        group whose page headers are damaged is a ValueError (see :mod:`tidal.formats.parquet_pages`).
        ``exact`` (a strip read alone) and point reads: a column entered at a later page decodes
        to ``z`` and no further."""
        rows = int(self._starts[g + 1] - self._starts[g])
        exact = exact or self._pointing

        # A group of one batch is checked whole as it is decoded (see _Stream.take); a longer one
        # by its page headers where they can be read, before any row is served. Its batches may be
        # fewer rows, as many as are asked for. A point read decodes each column at least as far as
        # any strip it reads would alone (see _strips), so that one that decodes finds what they
        # would: to the end of its last strip and no further, from the first row a strip at a time
        # (strips end at multiples of STRIP_ROWS), entered at a later page in one batch (a page
        # and a strip at most: memory stays bounded).
        def batch(row: int, end: int) -> int:
            if exact:
                return end - row if row > 0 else STRIP_ROWS
            return min(STREAM_ROWS, end - row)

        pages = self._page_headers() if rows > STREAM_ROWS else None
        if pages is None:
            if rows <= STREAM_ROWS:
                return _Stream(self._file, g, rows, self._columns)
            if not (self._pointing and self._local is None and callable(self._where)):
                return _Stream(self._file, g, rows, self._columns, batch=batch(0, z))
            until = max(z, min(rows, self._until - int(self._starts[g])))  # the point reads' last row here
            return _Stream(self._lean_file(g, until), g, rows, self._columns, batch=batch(0, until))
        damage = pages.damage(g, rows)
        if damage is not None:
            raise ValueError(damage)
        starts, patches = pages.skips(g, a) if a else ({}, [])
        names = self._columns or self._file.schema_arrow.names
        if not patches or len(set(names)) < len(names) or not skipping():  # skipping(): pyarrow as expected
            return _Stream(self._file, g, rows, self._columns, batch=batch(0, z))
        retyped = pq.ParquetFile(
            Retyped(pages.fd, patches),
            metadata=self._file.metadata,
            pre_buffer=False,
            buffer_size=BUFFER,
            page_checksum_verification=True,
        )
        by_start: dict[int, list[str]] = {}
        for name in names:
            by_start.setdefault(starts.get(name, 0), []).append(name)
        streams = [
            _Stream(retyped if row else self._file, g, rows, cols, row, batch(row, z)) for row, cols in by_start.items()
        ]
        return _Columns(streams, names, self._file.schema_arrow, retyped)

    def _lean_file(self, g: int, z: int) -> pq.ParquetFile:
        """For point reads of a file read by ranges, up to row ``z`` of a row group: the file read
        a buffer at a time as its pages are decoded, not the group's column chunks fetched whole
        first (``pre_buffer``): a record's strip, decoded from its group's first row, needs the
        group only up to it. The buffer: about the bytes of ``z`` rows and a page, so that a
        column's part is one GET, not one per buffer. The footer is the one read already."""
        assert callable(self._where)
        if self._lean is not None:
            self._lean.close(force=True)  # the last point read's: no stream reads it any more
        if self._groups is None:
            self._groups = Groups(self._file.metadata)
        guess = bytes_to(self._groups, g, z, self._columns) or 0  # (a footer it cannot read: a page at a time)
        buffer = min(int(1.1 * guess) + LEAN_BUFFER, 1 << 30)
        self._lean = pq.ParquetFile(
            self._where(),
            metadata=self._file.metadata,
            pre_buffer=False,
            buffer_size=buffer,
            page_checksum_verification=True,
        )
        return self._lean

    def _page_headers(self) -> Pages | None:
        """The file's page headers, where it is a local file whose footer says where they are."""
        if self._pages is None and self._local is not None:
            try:
                schema = self._file.schema
                repeated = [schema.column(i).max_repetition_level > 0 for i in range(len(schema))]
                self._pages = Pages(self._local, self._file.metadata, repeated, self._path)
            except OSError:
                self._local = None
        return self._pages

    def _drop_stream(self) -> None:
        if self._stream is not None:  # no module global looked up: this also runs at interpreter exit
            self._stream.close()
        self._stream = None

    def _strips(self, g: int, a: int, z: int) -> tuple[pa.Table | None, np.ndarray]:
        """Rows ``[a, z)`` of row group ``g``, which did not decode in one stream: each strip of
        ``STRIP_ROWS`` rows they are in decoded alone (whole, so that its verdict is the same
        from every slice and every point read of it), those that fail handed to the errors
        policy; the rows kept, and which were."""
        tables: list[pa.Table] = []
        kept = np.ones(z - a, dtype=bool)
        for s in range(a // STRIP_ROWS * STRIP_ROWS, z, STRIP_ROWS):
            lo, hi = max(a, s), min(z, s + STRIP_ROWS)
            table, ok = self._strip(g, s, lo, hi)
            if table is not None and table.num_rows:
                tables.append(table)
            if ok is not None:
                kept[lo - a : hi - a] = ok
        return (pa.concat_tables(tables) if tables else None), kept

    def _strip(self, g: int, s: int, lo: int, hi: int) -> tuple[pa.Table | None, np.ndarray | None]:
        """Rows ``[lo, hi)`` of the strip of row group ``g`` that starts at its row ``s``, decoded
        alone: those kept, and which were (None: all)."""
        row = int(self._starts[g])
        e = min(s + STRIP_ROWS, int(self._starts[g + 1]) - row)
        table: pa.Table | None = None
        try:
            stream = self._start(g, s, e, exact=True)
            try:
                table = stream.take(s, e, validate=False)
            finally:
                stream.close()
            table.validate(full=True)
            return table.slice(lo - s, hi - lo), None
        except StorageError:
            raise  # the network, not the data: never skipped as bad rows
        except data_errors() as exc:
            failure = exc
        if table is not None:  # decoded, but not valid: without the strings that are not UTF-8, if that is all
            utf8 = _utf8_rows(table)
            if utf8 is not None:
                ok = utf8[lo - s : hi - s]
                for i in np.flatnonzero(~ok).tolist():
                    bad(self._errors, RecordError("a string that is not UTF-8", path=self._path, row=row + lo + i))
                try:
                    good = keep(table.slice(lo - s, hi - lo), ok.tolist())
                    assert isinstance(good, pa.Table)
                    good.validate(full=True)
                    return good, ok
                except data_errors():
                    pass
        error = RecordError(
            f"unreadable row group {g} (rows {row + lo}..{row + hi}): {failure}", path=self._path, row=row + lo
        )
        bad(self._errors, error)
        return None, np.zeros(hi - lo, dtype=bool)

    def point(self, start: int, stop: int, until: int | None = None) -> Piece:
        """:meth:`read`, for a point read (:mod:`tidal.stages.points`): the same rows, but of a file
        read by ranges only the bytes up to them are fetched, not their row group's whole.
        ``until``: the end of the last of the point reads of this file that follow (a GET each, not
        one per read)."""
        self._pointing, self._until = True, max(stop, until or 0)
        try:
            return self.read(start, stop)
        finally:
            self._pointing = False

    def read(self, start: int, stop: int) -> Piece:
        if self._columns == []:  # asked only for columns this file lacks: nulls, nothing to decode
            assert self._target is not None
            return Piece(_nulls(self._target, stop - start))
        table, valid = self._read(start, stop)
        if self._target is None:
            return Piece(table, valid)
        rows = np.arange(start, stop) if valid is None else start + np.flatnonzero(valid)
        table, kept = schemas.cast(table, self._target, self._path, rows, self._errors)
        if kept is not None:
            if valid is None:
                valid = np.ones(stop - start, dtype=bool)
            valid[rows[~kept] - start] = False
        return Piece(table, valid)

    def _read(self, start: int, stop: int) -> tuple[pa.Table, np.ndarray | None]:
        """Rows ``[start, stop)`` as the file holds them, and which were kept (None: all)."""
        parts: list[pa.Table] = []
        valid: np.ndarray | None = None
        pos = start
        g = int(np.searchsorted(self._starts, start, side="right")) - 1
        while pos < stop:
            g_start, g_stop = int(self._starts[g]), int(self._starts[g + 1])
            end = min(stop, g_stop)
            table = self._streamed(g, pos - g_start, end - g_start)
            if table is None:  # damaged: strip by strip, the rows skipped counted, not yielded
                table, kept = self._strips(g, pos - g_start, end - g_start)
                if not kept.all():
                    if valid is None:
                        valid = np.ones(stop - start, dtype=bool)
                    valid[pos - start : end - start] = kept
            if table is not None:
                parts.append(table)
            pos, g = end, g + 1
        if not parts:
            schema = self._file.schema_arrow
            parts = [schema.empty_table().select(self._columns if self._columns is not None else schema.names)]
        return pa.concat_tables(parts), valid

    def close(self) -> None:
        self._drop_stream()
        if self._pages is not None:
            self._pages.close()
        if self._lean is not None:
            self._lean.close(force=True)
        self._file.close(force=True)  # also a file object it was given


class _Stream:
    """One row group decoded front to back, ``STREAM_ROWS`` rows at a time. A block reads a
    slice of a few thousand rows of each of its files, and the next block the next slice:
    decoding only those rows keeps memory at a block and the work the same for every block,
    where decoding whole row groups cost a burst of every file's group at once (the loop
    then waited on one DataLoader worker while the others sat idle) and held them all."""

    def __init__(
        self,
        file: pq.ParquetFile,
        group: int,
        rows: int,
        columns: list[str] | None,
        start: int = 0,
        batch: int = STREAM_ROWS,
    ):
        self.group, self.rows = group, rows
        self.row = start  # the group's row ``_left`` (or the next batch) starts at: pages before ``start`` skipped
        self._batch = max(1, batch)  # rows a batch decodes
        self._batches = file.iter_batches(self._batch, row_groups=[group], columns=columns, use_threads=False)
        self._left: pa.Table | None = None
        self._decoded = start  # the group's rows the batches so far end at

    def take(self, a: int, z: int, validate: bool = True) -> pa.Table:
        """Rows ``[a, z)`` of the group (``a`` at or past the rows already taken), validated."""
        parts: list[pa.Table] = []
        while self.row < z:
            rows = self._left if self._left is not None else self._next()
            self._left = None
            end = self.row + rows.num_rows
            lo, hi = max(a, self.row), min(z, end)
            if lo < hi:
                parts.append(rows.slice(lo - self.row, hi - lo))
            if hi < end:
                self._left = rows.slice(hi - self.row)
                self.row = hi
            else:
                self.row = end
        if not parts:
            raise ValueError(f"row group {self.group}: no rows {a}..{z}")
        table = parts[0] if len(parts) == 1 else pa.concat_tables(parts)
        if validate:
            table.validate(full=True)
        return table

    def _next(self) -> pa.Table:
        """The group's next batch of rows or so (fewer where a batch's strings would pass 2 GiB),
        or all that is left of it where that is no more: counted then, so that a group of one
        batch is checked whole before any of it is served (a page pyarrow passed over leaves it
        short; a longer group's page headers are checked before it is decoded)."""
        if self.rows - self._decoded > self._batch:
            batch = next(self._batches, None)
            batches = [] if batch is None else [batch]
            self._decoded += batch.num_rows if batch is not None else 0
            short = batch is None or self._decoded > self.rows
        else:
            batches = list(self._batches)
            self._decoded += sum(b.num_rows for b in batches)
            short = self._decoded != self.rows
        if short:
            raise ValueError(f"row group {self.group}: {self._decoded} rows decoded, the footer says {self.rows}")
        return pa.Table.from_batches(batches)

    def close(self) -> None:
        """Nothing of its own: its file is the reader's."""


class _Columns:
    """A row group decoded from a different row for each set of its columns (those whose pages
    before the slice were skipped, and those decoded from the group's start), put back together
    as the table one stream of them all would give."""

    def __init__(self, streams: list[_Stream], names: list[str], schema: pa.Schema, retyped: pq.ParquetFile):
        self.group, self.rows = streams[0].group, streams[0].rows
        self._streams, self._retyped = streams, retyped
        self._schema = pa.schema([schema.field(n) for n in names], metadata=schema.metadata)

    @property
    def row(self) -> int:
        return min(s.row for s in self._streams)

    def take(self, a: int, z: int, validate: bool = True) -> pa.Table:
        columns: dict[str, pa.ChunkedArray] = {}
        for stream in self._streams:
            table = stream.take(a, z, validate)
            columns.update(zip(table.column_names, table.columns, strict=True))
        return pa.Table.from_arrays([columns[f.name] for f in self._schema], schema=self._schema)

    def close(self) -> None:
        self._retyped.close(force=True)


def _nulls(schema: pa.Schema, n: int) -> pa.Table:
    """``n`` records of ``schema``, every value null."""
    return pa.Table.from_arrays([pa.nulls(n, f.type) for f in schema], schema=schema)


def _utf8_rows(table: pa.Table) -> np.ndarray | None:
    """Which rows hold only valid UTF-8 in their top-level string columns, or None when the
    table's other columns are damaged too (or nothing here is a string)."""
    strings = [
        n
        for n, t in zip(table.column_names, table.schema.types, strict=True)
        if pa.types.is_string(t) or pa.types.is_large_string(t)
    ]
    if not strings:
        return None
    kept = np.ones(table.num_rows, dtype=bool)
    for name in strings:
        binary = table.column(name).cast(pa.large_binary())
        for i, value in enumerate(binary.to_pylist()):
            if value is not None:
                try:
                    value.decode()
                except UnicodeDecodeError:
                    kept[i] = False
    return None if kept.all() else kept


def open(  # noqa: A001
    path: str,
    compression: str | None,
    info: dict,
    columns: list[str] | None,
    errors: Errors,
    options: Options | None = None,
) -> ParquetReader:
    check_options(NAME, options)  # column_types: decided over the dataset (formats.agreement), cast by info["cast"]
    return ParquetReader(path, info, columns, errors)
