"""Arrow IPC: the file format (``.arrow``, ``.feather`` v2, ``.ipc``) and the stream format
(``.arrows``, or any of those endings: the first bytes tell), with column projection, opened
at any row.

A file-format file has a footer that locates every record batch, so a reader memory-maps it
and reads just the batches a slice needs. A stream has no footer: scan records the byte
offset of every record batch message, and a reader seeks to the batch it needs and decodes
that one message against the stream's schema. Either way opening at a row costs one record
batch. Streams with dictionary-encoded columns (whose dictionaries come as separate messages)
are read from the start instead: correct, just not cheap to open late.

The index keeps each batch's row count (and, for streams, offset), so rows map to batches
without opening the file, and the file's column types (``info["types"]``), so that a dataset
whose files drifted reads as one schema, as Parquet does (:mod:`tidal.formats.schemas`,
``format_options={"column_types": {...}}``); a column asked for that a file lacks is null in
its records.

Arrow IPC has no checksums. Each record batch read is validated whole (buffers, offsets, UTF-8
of strings), so a damaged one is a :class:`~tidal.errors.RecordError` naming the file and the
batch's first row (its rows skipped under ``errors="skip"``), never a crash or garbage. A
stream cut at a message boundary reads as a shorter stream: the format cannot tell.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from tidal.errors import FormatError, RecordError, StorageError
from tidal.formats import Errors, Options, Piece, check_options, schemas, source
from tidal.formats.bad_data import bad, data_errors
from tidal.formats.binary import open_stream

NAME = "arrow"
__all__ = ["NAME", "columns", "open", "scan"]

FILE_MAGIC = b"ARROW1"

DECODES_WITHOUT_GIL = True  # pyarrow decodes with the GIL released: see tidal.formats.threaded
ARROW_SCHEMA = True  # its scan keeps each file's Arrow schema: a column has one type over the dataset


def _is_file(path: str, src: Any) -> bool:
    f = open_stream(path, src)
    try:
        return f.read(6) == FILE_MAGIC
    finally:
        f.close()


def _arrow_error(path: str, exc: Exception) -> FormatError:
    return FormatError(f"{path}: not a readable Arrow IPC file or stream: {exc}")


def scan(path: str, compression: str | None, file: Any = None) -> dict:
    src = file or path
    if compression is not None:
        raise FormatError(f"{path}: Arrow IPC compresses inside the file; a {compression} wrapper is not supported")
    try:
        if _is_file(path, src):
            with _native(path, src) as f:
                reader = pa.ipc.open_file(f)
                batches = [reader.get_batch(i).num_rows for i in range(reader.num_record_batches)]
                schema = reader.schema
            return {"rows": sum(batches), "batches": batches, "kind": "file", **_schema(schema)}
        return _scan_stream(path, src)
    except (FormatError, StorageError):
        raise
    except data_errors() as exc:
        raise _arrow_error(path, exc) from None


def columns(info: dict) -> list[str]:
    return list(info["names"] if "names" in info else info["columns"])  # "columns": an index of the first scan


def _scan_stream(path: str, src: Any) -> dict:
    offsets: list[int] = []
    dictionaries = False
    with _native(path, src) as f:
        messages = pa.ipc.MessageReader.open_stream(f)
        try:
            first = messages.read_next_message()
        except StopIteration:
            raise FormatError(f"{path}: an empty Arrow stream: no schema") from None
        if first.type != "schema":
            raise FormatError(f"{path}: an Arrow stream must start with its schema, not a {first.type} message")
        while True:
            at = f.tell()
            try:
                msg = messages.read_next_message()
            except StopIteration:
                break
            dictionaries |= msg.type == "dictionary"
            if msg.type == "record batch":
                offsets.append(at)
    with _native(path, src) as f:  # rows per batch: the reader that resolves dictionaries
        reader = pa.ipc.open_stream(f)
        batches = [b.num_rows for b in reader]
        schema = reader.schema
    info: dict = {"rows": sum(batches), "batches": batches, "kind": "stream", **_schema(schema)}
    if not dictionaries:
        info["offsets"] = offsets
    return info


def _native(path: str, src: Any) -> Any:
    """A local file memory-mapped, so that a damaged length reads past its end as an Arrow
    error (read through Python, it would ask for that many bytes: a MemoryError)."""
    return pa.memory_map(src) if isinstance(src, str) else open_stream(path, src)


def _columns(schema: pa.Schema) -> dict[str, str]:
    return {f.name: str(f.type) for f in schema}


def _schema(schema: pa.Schema) -> dict:
    """What the index keeps of a file's schema: its columns' names, and their types."""
    return {"names": schema.names, "types": schemas.encode(schema)}


class ArrowReader:
    def __init__(self, path: str, info: dict, columns: list[str] | None, errors: Errors):
        self.path = path
        self._src = source(path, info)
        self._kind = info.get("kind", "file")
        self._starts = np.concatenate([[0], np.cumsum(info["batches"])]).astype(np.int64)
        self._offsets = info.get("offsets")
        self._file: Any = None
        try:
            if self._kind == "file":
                self._file = _native(path, self._src)
                self._reader = pa.ipc.open_file(self._file)
                self._schema = self._reader.schema
            else:
                self._file = _native(path, self._src)
                self._schema = pa.ipc.open_stream(self._file).schema
            found = _columns(self._schema)  # also decodes the names: a damaged one fails here
        except StorageError:
            raise
        except data_errors() as exc:
            raise _arrow_error(path, exc) from None
        if "columns" in info and found != info["columns"]:
            raise FormatError(f"{path}: its schema {found} is not the {info['columns']} it was indexed with; damaged?")
        if "types" in info and schemas.encode(self._schema) != info["types"]:
            raise FormatError(f"{path}: its schema {found} is not the one it was indexed with; damaged?")
        names = self._schema.names
        # the dataset's schema where this file's differs (tidal.formats.schemas), or nulls for the
        # columns asked for that it lacks (of no type where the index has no types: joined in the block)
        self._target = schemas.target(info, columns)
        known = self._target
        if any(c not in names and (known is None or c not in known.names) for c in columns or []):
            self._target = pa.schema(
                [
                    known.field(c)
                    if known is not None and c in known.names
                    else self._schema.field(c)
                    if c in names
                    else pa.field(c, pa.null())
                    for c in columns or []
                ]
            )
        self._columns = [c for c in columns if c in names] if columns is not None else None
        self._errors = errors
        self._all: pa.Table | None = None  # a stream without offsets, read whole once

    def _batch(self, i: int) -> pa.RecordBatch | pa.Table | None:
        """Record batch ``i``, fully validated (Arrow trusts IPC buffers: a damaged file must not
        crash a decode), or None when it is unreadable and the policy skips it."""
        rows = int(self._starts[i + 1] - self._starts[i])
        try:
            batch = self._read_batch(i)
            if batch.num_rows != rows:
                raise ValueError(f"{batch.num_rows} rows, the index says {rows}")
            if batch.schema != self._schema:
                raise ValueError(f"its schema differs from the file's: {batch.schema}")
            batch.validate(full=True)
            return batch
        except StorageError:
            raise
        except data_errors() as exc:
            row = int(self._starts[i])
            bad(
                self._errors,
                RecordError(f"unreadable record batch {i} (rows {row}..{row + rows}): {exc}", path=self.path, row=row),
            )
            return None

    def _read_batch(self, i: int) -> pa.RecordBatch | pa.Table:
        if self._kind == "file":
            return self._reader.get_batch(i)
        if self._offsets is None:
            if self._all is None:
                self._file.seek(0)
                self._all = pa.ipc.open_stream(self._file).read_all()
            return self._all.slice(int(self._starts[i]), int(self._starts[i + 1] - self._starts[i]))
        self._file.seek(self._offsets[i])
        return pa.ipc.read_record_batch(pa.ipc.read_message(self._file), self._schema)

    def read(self, start: int, stop: int) -> Piece:
        if self._columns == []:  # asked only for columns this file lacks: nulls, nothing to decode
            assert self._target is not None
            schema = self._target
            return Piece(pa.Table.from_arrays([pa.nulls(stop - start, f.type) for f in schema], schema=schema))
        piece = self._read(start, stop)
        if self._target is None:
            return piece
        valid = piece.valid
        rows = np.arange(start, stop) if valid is None else start + np.flatnonzero(valid)
        assert isinstance(piece.table, pa.Table)
        table, kept = schemas.cast(piece.table, self._target, self.path, rows, self._errors)
        if kept is not None:
            if valid is None:
                valid = np.ones(stop - start, dtype=bool)
            valid[rows[~kept] - start] = False
        return Piece(table, valid)

    def _read(self, start: int, stop: int) -> Piece:
        parts = []
        valid: np.ndarray | None = None
        b = int(np.searchsorted(self._starts, start, side="right")) - 1
        pos = start
        while pos < stop:
            b_start, b_stop = int(self._starts[b]), int(self._starts[b + 1])
            end = min(stop, b_stop)
            batch = self._batch(b)
            if batch is None:  # skipped: its rows are counted, not yielded
                if valid is None:
                    valid = np.ones(stop - start, dtype=bool)
                valid[pos - start : end - start] = False
            else:
                if self._columns is not None:
                    batch = batch.select(self._columns)
                part = batch.slice(pos - b_start, end - pos)
                parts.append(part if isinstance(part, pa.Table) else pa.Table.from_batches([part]))
            pos, b = end, b + 1
        if not parts:
            names = self._columns if self._columns is not None else self._schema.names
            return Piece(self._schema.empty_table().select(names), valid)
        return Piece(pa.concat_tables(parts), valid)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        self._file = None
        self._all = None


def open(  # noqa: A001
    path: str,
    compression: str | None,
    info: dict,
    columns: list[str] | None,
    errors: Errors,
    options: Options | None = None,
) -> ArrowReader:
    check_options(NAME, options)  # column_types: decided over the dataset (formats.agreement), cast by info["cast"]
    return ArrowReader(path, info, columns, errors)
