"""CSV and TSV (also .gz/.zst): parsed by Arrow in segments, opened at any row.

A record ends at a newline outside double quotes (RFC 4180: a quote inside a quoted field is
doubled; ``\\n`` or ``\\r\\n`` line ends); empty lines are not records; the first record is the
header. Scanning finds record boundaries with numpy (quote parity, no per-line Python) and
keeps a checkpoint every ``SEGMENT_ROWS`` rows: row, byte offset, line. A reader parses the
segment holding the rows asked for (at most ``SEGMENT_ROWS`` rows, one kept in memory),
so opening at any row costs one segment, never the file up to it.

Column types are inferred once, at scan, from the whole file (Arrow's inference; a column
whose values do not all convert is text, and so is a column of numbers whose text a number
would not give back: ``01234``, ``+1555``, ``0x1F``), and the dataset's type of each column is
agreed over its files (:func:`agree`: the type they share; integers and floats, float64; else
text), or declared (``format_options={"column_types": {"zip": "string"}}``), so every segment
of every file parses to the dataset's one schema. A row with the wrong number of fields is a
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
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pc

from tidal.errors import ArgumentError, FormatError, RecordError, SchemaError
from tidal.formats import Errors, Options, Piece, check_options, source
from tidal.formats.bad_data import bad, data_errors
from tidal.formats.binary import mapped, read_all

NAME = "csv"
__all__ = ["NAME", "SEGMENT_ROWS", "agree", "check_column_types", "column_types", "columns", "open", "records", "scan"]

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
    """Column names and types inferred over the whole file: a column whose values do not all
    convert to the type its first values took is text, and so is a column of numbers whose text
    a number would not give back (:func:`_lossy`); a column with no value is null (the dataset
    decides: :func:`agree`)."""
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
    schema: pa.Schema | None = None
    try:
        # types from the first 64 MiB, checked against the rest; memory: one block
        reader = pc.open_csv(pa.BufferReader(pa.py_buffer(data)), read_options=read, parse_options=parse)
        schema = reader.schema
        for _ in reader:
            pass
    except pa.ArrowInvalid:  # a column whose later values do not convert: found one by one
        if schema is None:
            return pa.schema([(n, pa.string()) for n in names])
        schema = pa.schema([(f.name, _holds(data, parse, f)) for f in schema])
    except pa.ArrowException as exc:
        raise FormatError(f"{path}: not readable as CSV: {exc}") from None
    lossy = _lossy(data, parse, [f.name for f in schema if pa.types.is_integer(f.type) or pa.types.is_floating(f.type)])
    return pa.schema([(f.name, pa.string() if f.name in lossy else f.type) for f in schema])


def _holds(data: Any, parse: pc.ParseOptions, field: pa.Field) -> pa.DataType:
    """``field``'s type if every value of its column converts to it, else text."""
    if pa.types.is_string(field.type) or pa.types.is_null(field.type):
        return field.type
    try:
        for _ in _column_batches(data, parse, {field.name: field.type}):
            pass
    except pa.ArrowInvalid:
        return pa.string()
    return field.type


def _column_batches(data: Any, parse: pc.ParseOptions, types: dict[str, pa.DataType]) -> Any:
    """The batches of the columns ``types`` names, of those types, a block (64 MiB) at a time:
    the memory of one block, whatever the file's size."""
    return pc.open_csv(
        pa.BufferReader(pa.py_buffer(data)),
        read_options=pc.ReadOptions(use_threads=False, block_size=1 << 26),
        parse_options=parse,
        convert_options=pc.ConvertOptions(column_types=types, include_columns=list(types)),
    )


# Text a number does not give back: a leading zero ("007", "-01", "00.5": ZIP codes, IDs), a
# leading "+" (phone numbers), a hexadecimal "0x1F".
_LOSSY = r"^\s*(?:\+|-?0[0-9xXbBoO_])"


def _lossy(data: Any, parse: pc.ParseOptions, numeric: list[str]) -> set[str]:
    """The columns of ``numeric`` (inferred as numbers) some of whose text a number would not
    give back: read as text, so that ``01234`` stays ``"01234"``."""
    found: set[str] = set()
    if not numeric:
        return found
    for batch in _column_batches(data, parse, dict.fromkeys(numeric, pa.string())):
        found.update(n for n in numeric if n not in found and _any_lossy(batch.column(n)))
        if len(found) == len(numeric):
            break
    return found


def _any_lossy(values: pa.Array) -> bool:
    import pyarrow.compute as compute

    return bool(compute.any(compute.match_substring_regex(values, _LOSSY)).as_py())


def column_types(options: Options | None) -> dict[str, pa.DataType]:
    """The types ``format_options={"column_types": {...}}`` declares, by column (checked names:
    :func:`check_column_types`)."""
    declared = (options or {}).get("column_types") or {}
    return {name: pa.type_for_alias(kind) for name, kind in declared.items()}


def check_column_types(value: Any) -> dict[str, str]:
    """``column_types`` as a user gives it (column to a type's name, or a pyarrow type), as
    names pyarrow knows; an ArgumentError naming what is not."""
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise ArgumentError(f"column_types must map column names to type names, not {value!r}")
    out = {}
    for name, kind in value.items():
        text = str(kind) if isinstance(kind, pa.DataType) else kind
        try:
            pa.type_for_alias(text)
        except (ValueError, TypeError, KeyError):
            raise ArgumentError(
                f"column_types: {kind!r} (column {name!r}) is not a type; use a name pyarrow knows: "
                "string, int64, int32, float64, float32, bool, date32, timestamp[s], timestamp[ms], ..."
            ) from None
        out[name] = text
    return out


def agree(infos: list[dict], options: Options | None = None) -> list[dict]:
    """The scans of a dataset's CSV files, each made to say the dataset's type of every column:
    the one ``column_types`` declares, else the one its files agree on (a file with no value
    in a column has no say; integers and floats agree on float64; files that disagree
    otherwise, on text), so a column's records are of one type whichever file holds them. A
    column all of whose files are empty is text."""
    declared = column_types(options)
    schemas = {info["schema"]: _read_schema(info["schema"]) for info in infos}
    names = next(iter(schemas.values())).names if schemas else []
    unknown = [n for n in declared if schemas and all(n not in s.names for s in schemas.values())]
    if unknown:
        raise SchemaError(f"column_types names {unknown[0]!r}, which no CSV file has (columns: {', '.join(names)})")
    fields = []
    for name in names:
        found = {s.field(name).type for s in schemas.values() if name in s.names}
        fields.append(pa.field(name, declared.get(name) or _one_type(found)))
    one = base64.b64encode(pa.schema(fields).serialize().to_pybytes()).decode()
    return [info if info["schema"] == one else {**info, "schema": one} for info in infos]


def _one_type(types: set[pa.DataType]) -> pa.DataType:
    """The type a column takes over files whose own are ``types``."""
    known = {t for t in types if not pa.types.is_null(t)}
    if len(known) == 1:
        return known.pop()
    if known and all(pa.types.is_integer(t) or pa.types.is_floating(t) for t in known):
        return pa.float64()
    return pa.string()


def _read_schema(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


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
        "columns": dict.fromkeys(schema.names, ""),  # names only: the dataset's types are agreed over its files
        "schema": base64.b64encode(schema.serialize().to_pybytes()).decode(),
    }
    if compression is None:
        info["checkpoints"] = checkpoints
    return info


def columns(info: dict) -> list[str]:
    return list(info["columns"])


class CsvReader:
    def __init__(
        self,
        path: str,
        compression: str | None,
        info: dict,
        columns: list[str] | None,
        errors: Errors,
        declared: dict[str, pa.DataType] | None = None,
    ):
        self.path = path
        self._data = _bytes(path, source(path, info), compression)
        self._rows = int(info["records"])
        self._checkpoints: list[list[int]] = info.get("checkpoints") or []
        if "checkpoints" not in info:  # compressed: found now, in the decompressed bytes
            _, self._checkpoints, self._rows = _layout(path, self._data)
        schema = _read_schema(info["schema"])
        types = declared or {}
        unknown = [n for n in types if n not in schema.names]
        if unknown:
            raise SchemaError(
                f"{path}: column_types names {unknown[0]!r}, which it does not have (columns: {', '.join(schema.names)})"
            )
        self._schema = pa.schema(
            [(f.name, types.get(f.name) or (pa.string() if pa.types.is_null(f.type) else f.type)) for f in schema]
        )
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
    return CsvReader(path, compression, info, columns, errors, column_types(check_options(NAME, options)))
