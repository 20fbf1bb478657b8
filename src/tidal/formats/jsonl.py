"""JSON lines: one JSON object per non-empty line, kept as Python dicts."""

from __future__ import annotations

from typing import Any

import numpy as np
from orjson import JSONDecodeError, loads

from tidal.errors import RecordError
from tidal.formats import Errors, Options, Piece
from tidal.formats.lines import LineReader, scan

NAME = "jsonl"
__all__ = ["NAME", "open", "scan"]


class JsonlReader:
    def __init__(self, path: str, compression: str | None, info: dict, columns: list[str] | None, errors: Errors):
        self._lines = LineReader(path, compression, info)
        self._path = path
        self._columns = columns
        self._errors = errors

    def read(self, start: int, stop: int) -> Piece:
        records: list[Any] = []
        valid: np.ndarray | None = None
        columns = self._columns
        rows, lines = self._lines.read_rows(start, stop)
        for i, data in enumerate(rows):
            try:
                rec = loads(data)
                if not isinstance(rec, dict):
                    raise ValueError(f"expected a JSON object, got {type(rec).__name__}")
                if columns is not None:
                    missing = [c for c in columns if c not in rec]
                    if missing:
                        raise ValueError(f"no field {missing[0]!r} (fields: {', '.join(sorted(rec)) or 'none'})")
                    rec = {c: rec[c] for c in columns}
            except (JSONDecodeError, ValueError) as exc:
                if self._errors == "raise":
                    raise RecordError(f"malformed JSON record: {exc}", path=self._path, line=lines[i]) from None
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
