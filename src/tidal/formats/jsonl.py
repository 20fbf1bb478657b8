"""JSON lines: one JSON object per non-empty line, kept as Python dicts.

A line that is not a JSON object, or (with ``columns=``) an object without one of the
columns, is a :class:`~tidal.errors.RecordError` naming the file and line, handed to the
``errors`` policy. JSON lines have no schema, so a column missing from every record of a
block is a :class:`~tidal.errors.SchemaError` raised by the source stage, not a skip per row.

Lines are parsed with orjson when it is installed (``tidal[fast]``) and with the standard
library otherwise: the same records and the same errors either way (:mod:`tidal.formats._json`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tidal.errors import RecordError
from tidal.formats import Errors, Options, Piece, _json, bad
from tidal.formats.lines import LineReader, scan

NAME = "jsonl"
__all__ = ["NAME", "open", "scan"]


class JsonlReader:
    def __init__(self, path: str, compression: str | None, info: dict, columns: list[str] | None, errors: Errors):
        self._lines = LineReader(path, compression, info)
        self._path = path
        self._columns = tuple(columns) if columns is not None else None
        self._errors = errors

    def read(self, start: int, stop: int) -> Piece:
        rows, lines = self._lines.read_rows(start, stop)
        columns = self._columns
        try:  # the common case at C speed: every line an object with the fields asked for, in order
            records = list(map(_json.loads, rows))
        except ValueError:
            pass
        else:
            if set(map(type, records)) <= {dict} and (columns is None or all(map(columns.__eq__, map(tuple, records)))):
                return Piece(records, None)
        return self._read_each(rows, lines, start, stop)

    def _read_each(self, rows: list[bytes | memoryview], lines: list[int], start: int, stop: int) -> Piece:
        """Line by line: the records, and each bad line handed to the errors policy."""
        records: list[Any] = []
        valid: np.ndarray | None = None
        columns = self._columns
        loads = _json.loads
        for i, data in enumerate(rows):
            error: RecordError | None = None
            try:
                rec = loads(data)
            except ValueError as exc:  # orjson's JSONDecodeError and the standard library's are ValueErrors
                why = _json.reason(data, exc)
                error = RecordError(f"malformed JSON record: {why}", path=self._path, line=lines[i])
            else:
                if not isinstance(rec, dict):
                    error = RecordError(
                        f"malformed JSON record: expected a JSON object, got {type(rec).__name__}",
                        path=self._path,
                        line=lines[i],
                    )
                elif columns is not None and tuple(rec) != columns:  # fields as asked for: the record as it is
                    try:
                        rec = {c: rec[c] for c in columns}
                    except KeyError:
                        missing = next(c for c in columns if c not in rec)
                        fields = ", ".join(sorted(rec)) or "none"
                        error = RecordError(
                            f"malformed JSON record: no field {missing!r} (fields: {fields})",
                            path=self._path,
                            line=lines[i],
                            column=missing,
                        )
            if error is not None:
                bad(self._errors, error)
                if valid is None:
                    valid = np.ones(stop - start, dtype=bool)
                valid[i] = False
                continue
            records.append(rec)
        return Piece(records, valid)

    def close(self) -> None:
        self._lines.close()


def open(  # noqa: A001
    path: str,
    compression: str | None,
    info: dict,
    columns: list[str] | None,
    errors: Errors,
    options: Options | None = None,
) -> JsonlReader:
    return JsonlReader(path, compression, info, columns, errors)
