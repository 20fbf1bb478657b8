"""JSON lines: one JSON object per non-empty line, kept as Python dicts.

A line that is not a JSON object is a :class:`~tidal.errors.RecordError` naming the file and
line, handed to the ``errors`` policy. Records need not have the same fields (an optional
``"lang"``): with ``columns=``, each record has exactly those, ``None`` for a field it lacks,
and the fields not asked for dropped. JSON lines have no schema, so a column asked for that no
record of a block has is taken for a typo: a :class:`~tidal.errors.SchemaError` raised by the
source stage.

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
        """Line by line: the records, each bad line handed to the errors policy, and (with
        ``columns=``) the missing fields filled with None."""
        records: list[Any] = []
        valid: np.ndarray | None = None
        columns = self._columns
        missed: dict[str, str] = {}  # columns some record lacked: where first
        found: set[str] = set()  # columns some record had
        loads = _json.loads
        for i, data in enumerate(rows):
            error: RecordError | None = None
            try:
                rec = loads(data)
            except ValueError as exc:  # orjson's JSONDecodeError and the standard library's are ValueErrors
                why = _json.reason(data, exc)
                error = RecordError(f"malformed JSON record: {why}", path=self._path, line=lines[i], row=start + i)
            else:
                if not isinstance(rec, dict):
                    error = RecordError(
                        f"malformed JSON record: expected a JSON object, got {type(rec).__name__}",
                        path=self._path,
                        line=lines[i],
                        row=start + i,
                    )
                elif columns is not None and tuple(rec) != columns:  # fields as asked for: the record as it is
                    for c in columns:
                        if c in rec:
                            found.add(c)
                        elif c not in missed:
                            fields = ", ".join(sorted(rec)) or "none"
                            missed[c] = f"{self._path}, line {lines[i]} has the fields {fields}"
                    rec = {c: rec.get(c) for c in columns}
                elif columns is not None:
                    found.update(columns)
            if error is not None:
                bad(self._errors, error)
                if valid is None:
                    valid = np.ones(stop - start, dtype=bool)
                valid[i] = False
                continue
            records.append(rec)
        absent = {c: where for c, where in missed.items() if c not in found}
        return Piece(records, valid, absent)

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
