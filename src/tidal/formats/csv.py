"""CSV and TSV (also .gz/.zst): parsed by Arrow in segments, opened at any row.

A record ends at a newline outside double quotes (RFC 4180: a quote inside a quoted field is
doubled; ``\\n`` or ``\\r\\n`` line ends); empty lines are not records; the first record is the
header. Scanning finds record boundaries with numpy (quote parity, no per-line Python) and
keeps a checkpoint every ``SEGMENT_ROWS`` rows: row, byte offset, line. A reader parses the
segment holding the rows asked for (at most ``SEGMENT_ROWS`` rows, one kept in memory),
so opening at any row costs one segment, never the file up to it.

Column types are inferred once, at scan, from the whole file (Arrow's inference; a column
whose values do not all convert is read as strings), so every segment of every reader parses
to the same schema. A row with the wrong number of fields is a
:class:`~tidal.errors.RecordError` naming the file and line, or is dropped under
``errors="skip"``; a value that does not convert to its column's type fails its whole
segment the same way.

A compressed file is decompressed into memory when a reader opens it (its checkpoints are
found then): fine for the small files people compress; store large ones plain or as Parquet.
It is also decompressed whole when scanned, every byte checked (:mod:`tidal.formats.codecs`),
so a truncated or corrupt one fails its scan. A segment that does not parse to the rows the
scan found (a file damaged or changed since) is a FormatError naming the file and line,
handed to the ``errors`` policy like a bad row, its rows skipped under ``errors="skip"``.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pc

from tidal.errors import FormatError, RecordError, SchemaError
from tidal.formats import Errors, Options, Piece, bad, data_errors, source
from tidal.formats.binary import mapped, read_all

NAME = "csv"
__all__ = ["NAME", "SEGMENT_ROWS", "columns", "open", "records", "scan"]

SEGMENT_ROWS = 4096
_WINDOW = 1 << 24


def _delimiter(path: str) -> str:
    stem = path.lower()
    for c in (".gz", ".zst", ".zstd", ".bz2"):
        stem = stem.removesuffix(c)
    return "\t" if stem.endswith(".tsv") else ","


def records(data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start and end byte offsets of the non-empty records of ``data`` (a uint8 array)."""
    starts: list[np.ndarray] = []
    ends: list[np.ndarray] = []
    parity = 0
    record_start = 0
    for w in range(0, len(data), _WINDOW):
        chunk = data[w : w + _WINDOW]
        quotes = np.cumsum(chunk == 34, dtype=np.int64) + parity
        cut = np.flatnonzero((chunk == 10) & (quotes % 2 == 0)) + w
        parity = int(quotes[-1]) % 2
        e = cut
        s = np.concatenate([[record_start], cut[:-1] + 1]) if len(cut) else np.zeros(0, dtype=np.int64)
        if len(cut):
            record_start = int(cut[-1]) + 1
        starts.append(s)
        ends.append(e)
    if record_start < len(data):  # a last record without a newline
        starts.append(np.array([record_start]))
        ends.append(np.array([len(data)]))
    s = np.concatenate(starts) if starts else np.zeros(0, dtype=np.int64)
    e = np.concatenate(ends) if ends else np.zeros(0, dtype=np.int64)
    length = e - s
    keep = length > 0
    cr = keep & (length == 1)
    if cr.any():  # a line holding only "\r" is empty too
        keep[cr] = data[s[cr]] != 13
    return s[keep].astype(np.int64), e[keep].astype(np.int64)


def _line(data: np.ndarray, offset: int) -> int:
    return int(np.count_nonzero(data[:offset] == 10)) + 1


def _layout(path: str, data: np.ndarray) -> tuple[bytes, list[list[int]], int]:
    """The header record, checkpoints ``[row, offset, line]`` and the number of rows."""
    if len(data) == 0:
        raise FormatError(f"{path}: empty: a CSV file needs at least a header line")
    starts, ends = records(data)
    if len(starts) == 0:
        raise FormatError(f"{path}: no header line")
    header = data[starts[0] : ends[0]].tobytes()
    rows = len(starts) - 1
    at = np.arange(1, len(starts), SEGMENT_ROWS)
    checkpoints = []
    line, prev = 1, 0
    for r in at.tolist():
        offset = int(starts[r])
        line += int(np.count_nonzero(data[prev:offset] == 10))  # linear in the file, once
        checkpoints.append([r - 1, offset, line])
        prev = offset
    return header, checkpoints, rows


def _is_utf8(data: np.ndarray) -> bool:
    """Whether ``data`` is valid UTF-8, checked by Arrow without a copy."""
    offsets = pa.py_buffer(np.array([0, len(data)], dtype=np.int64))
    try:
        pa.LargeStringArray.from_buffers(1, offsets, pa.py_buffer(data)).validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True


def _utf8_records(data: np.ndarray) -> tuple[bytes, np.ndarray, np.ndarray]:
    """The records of ``data`` that are valid UTF-8, one per line; their indices among all its
    records; and where each record starts. Arrow decodes a row it cannot parse to hand it to
    a Python handler, so bytes that are not UTF-8 must be taken out before parsing."""
    starts, ends = records(data)
    good = []
    for i, (a, z) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
        try:
            data[a:z].tobytes().decode()
        except UnicodeDecodeError:
            continue
        good.append(i)
    kept = b"".join(data[starts[i] : ends[i]].tobytes() + b"\n" for i in good)
    return kept, np.array(good, dtype=np.int64), starts


def _schema(path: str, header: bytes, data: Any, delimiter: str) -> pa.Schema:
    """Column names and types inferred over the whole file; columns that do not convert become strings."""
    parse = pc.ParseOptions(delimiter=delimiter, invalid_row_handler=lambda row: "skip")
    try:
        names = pc.read_csv(
            pa.py_buffer(header + b"\n"), parse_options=pc.ParseOptions(delimiter=delimiter)
        ).column_names
    except pa.ArrowException as exc:
        raise FormatError(f"{path}: unreadable header: {exc}") from None
    if len(set(names)) != len(names):
        raise FormatError(f"{path}: duplicate column names in the header: {names}")
    read = pc.ReadOptions(use_threads=False, block_size=1 << 26)
    try:
        # types from the first 64 MiB, checked against the rest; memory: one block
        reader = pc.open_csv(pa.BufferReader(pa.py_buffer(data)), read_options=read, parse_options=parse)
        schema = reader.schema
        for _ in reader:
            pass
    except pa.ArrowInvalid:  # a column whose later values do not convert: strings
        schema = pa.schema([(n, pa.string()) for n in names])
    except pa.ArrowException as exc:
        raise FormatError(f"{path}: not readable as CSV: {exc}") from None
    return pa.schema([(f.name, pa.string() if pa.types.is_null(f.type) else f.type) for f in schema])


def _bytes(path: str, src: Any, compression: str | None) -> np.ndarray:
    if compression is None:
        return mapped(path, src)
    return np.frombuffer(read_all(path, src, compression), dtype=np.uint8)


def scan(path: str, compression: str | None, file: str | None = None) -> dict:
    data = _bytes(path, file or path, compression)
    header, checkpoints, rows = _layout(path, data)
    text = data if _is_utf8(data) else np.frombuffer(_utf8_records(data)[0], dtype=np.uint8)
    schema = _schema(path, header, text, _delimiter(path))
    info: dict = {
        "rows": rows,
        "records": rows,  # the index keeps "rows" apart; the reader needs the count too
        "columns": dict.fromkeys(schema.names, ""),  # names only: inferred types may differ by file
        "schema": base64.b64encode(schema.serialize().to_pybytes()).decode(),
    }
    if compression is None:
        info["checkpoints"] = checkpoints
    return info


def columns(info: dict) -> list[str]:
    return list(info["columns"])


class CsvReader:
    def __init__(self, path: str, compression: str | None, info: dict, columns: list[str] | None, errors: Errors):
        self.path = path
        self._data = _bytes(path, source(path, info), compression)
        self._rows = int(info["records"])
        self._checkpoints: list[list[int]] = info.get("checkpoints") or []
        if "checkpoints" not in info:  # compressed: found now, in the decompressed bytes
            _, self._checkpoints, self._rows = _layout(path, self._data)
        self._schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(info["schema"])))
        missing = [c for c in columns or [] if c not in self._schema.names]
        if missing:
            raise SchemaError(f"{path}: no column {missing[0]!r} (columns: {', '.join(self._schema.names)})")
        self._columns = columns
        self._errors = errors
        self._delimiter = _delimiter(path)
        self._cached: tuple[int, pa.Table | None, np.ndarray | None] = (-1, None, None)
        self._bad_rows: list[RecordError] = []  # the bad records of the cached segment, for the rows read

    def _segment(self, k: int) -> tuple[pa.Table | None, np.ndarray | None]:
        """Segment ``k``'s rows (only those kept) and which were kept (None: all). Its bad records
        are kept in ``_bad_rows``: :meth:`read` hands those of the rows it reads to the policy."""
        if self._cached[0] == k:
            return self._cached[1], self._cached[2]
        self._bad_rows = []
        row, start, line = self._checkpoints[k]
        stop = self._checkpoints[k + 1][1] if k + 1 < len(self._checkpoints) else len(self._data)
        expected = min(SEGMENT_ROWS, self._rows - row)
        data = self._data[start:stop]
        wrong: list[int] = []
        buffer, parsed = pa.py_buffer(data), None  # parsed: the segment's rows that were parsed, if not all
        if not _is_utf8(data):
            text, parsed, starts = _utf8_records(data)
            if len(starts) != expected:
                return self._lost(
                    k,
                    expected,
                    FormatError(
                        f"{self.path}: {len(starts)} rows from line {line}, expected {expected}; is it damaged?"
                    ),
                )
            for i in sorted(set(range(expected)) - set(parsed.tolist())):
                at = _line(data, int(starts[i])) + line - 1
                self._bad_rows.append(RecordError("not UTF-8", path=self.path, line=at, row=row + i))
            buffer = pa.py_buffer(text)

        def invalid(row: Any) -> str:
            wrong.append(int(row.number) - 1)
            return "skip"

        try:
            table = pc.read_csv(
                buffer,
                # the segment as one block: Arrow's default block (1 MiB) refuses a longer record
                read_options=pc.ReadOptions(
                    column_names=self._schema.names, use_threads=False, block_size=min(len(data) + 1, (1 << 31) - 1)
                ),
                parse_options=pc.ParseOptions(delimiter=self._delimiter, invalid_row_handler=invalid),
                convert_options=pc.ConvertOptions(
                    column_types=self._schema, include_columns=self._columns or self._schema.names
                ),
            )
        except data_errors() as exc:
            return self._lost(
                k, expected, RecordError(f"unreadable rows {row}..{row + expected}: {exc}", path=self.path, line=line)
            )
        parsed_rows = expected if parsed is None else len(parsed)
        if table.num_rows + len(wrong) != parsed_rows or any(not 0 <= i < parsed_rows for i in wrong):
            return self._lost(
                k,
                expected,
                FormatError(
                    f"{self.path}: {table.num_rows + len(wrong)} rows from line {line}, expected {expected}; "
                    "is it damaged, or was it changed after indexing?"
                ),
            )
        kept: np.ndarray | None = None
        if wrong or parsed is not None:
            rows = np.arange(expected) if parsed is None else parsed  # row in the segment of each parsed row
            if wrong:
                starts, _ = records(data)
                for i in rows[wrong].tolist():
                    at = int(starts[i]) if i < len(starts) else 0
                    self._bad_rows.append(
                        RecordError(
                            "wrong number of fields", path=self.path, line=_line(data, at) + line - 1, row=row + i
                        )
                    )
            kept = np.zeros(expected, dtype=bool)
            kept[rows] = True
            kept[rows[wrong]] = False
        self._bad_rows.sort(key=lambda e: e.row or 0)  # in file order
        self._cached = (k, table, kept)
        return table, kept

    def _lost(self, k: int, expected: int, error: Exception) -> tuple[None, np.ndarray]:
        """Segment ``k`` could not be read: the error to the policy, all its rows skipped if it returns."""
        assert isinstance(error, (RecordError, FormatError))
        self._bad_rows = []  # the whole segment is lost: one error says so
        bad(self._errors, error)
        none = np.zeros(expected, dtype=bool)
        self._cached = (k, None, none)
        return None, none

    def read(self, start: int, stop: int) -> Piece:
        parts: list[pa.Table] = []
        valid: np.ndarray | None = None
        pos = start
        while pos < stop:
            k = pos // SEGMENT_ROWS
            base = k * SEGMENT_ROWS
            end = min(stop, base + SEGMENT_ROWS)
            table, kept = self._segment(k)
            for error in self._bad_rows:
                if error.row is not None and pos <= error.row < end:
                    bad(self._errors, error)
            if kept is None:
                assert table is not None
                parts.append(table.slice(pos - base, end - pos))
            else:
                if valid is None:
                    valid = np.ones(stop - start, dtype=bool)
                valid[pos - start : end - start] = kept[pos - base : end - base]
                if table is not None:
                    before = int(np.count_nonzero(kept[: pos - base]))
                    parts.append(table.slice(before, int(np.count_nonzero(kept[pos - base : end - base]))))
            pos = end
        if not parts:
            parts = [self._schema.empty_table().select(self._columns or self._schema.names)]
        return Piece(pa.concat_tables(parts), valid)

    def close(self) -> None:
        self._cached = (-1, None, None)


def open(  # noqa: A001
    path: str,
    compression: str | None,
    info: dict,
    columns: list[str] | None,
    errors: Errors,
    options: Options | None = None,
) -> CsvReader:
    return CsvReader(path, compression, info, columns, errors)
