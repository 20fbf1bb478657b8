"""Plain text: one record ``{"text": line}`` per non-empty line, decoded as UTF-8."""

from __future__ import annotations

from typing import Any

import numpy as np

from tidal.errors import RecordError, SchemaError
from tidal.formats import Errors, Options, Piece
from tidal.formats.bad_data import bad
from tidal.formats.lines import LineReader, scan

NAME = "text"
__all__ = ["NAME", "around", "columns", "open", "scan"]


def columns(info: dict) -> list[str]:
    return ["text"]


def around(info: dict, start: int, stop: int, row: int) -> tuple[int, int]:
    """The rows a point read of ``row`` reads: the line alone, decoded as the slice's are."""
    return row, row + 1


class TextReader:
    def __init__(self, path: str, compression: str | None, info: dict, columns: list[str] | None, errors: Errors):
        if columns is not None and list(columns) != ["text"]:
            raise SchemaError(f"{path}: a text file has one column, 'text'; asked for {columns}")
        self._lines = LineReader(path, compression, info)
        self._path = path
        self._errors = errors

    def read(self, start: int, stop: int) -> Piece:
        rows, lines = self._lines.read_rows(start, stop)
        try:
            return Piece([{"text": str(data, "utf-8")} for data in rows])
        except UnicodeDecodeError:
            pass  # find the bad lines one by one
        records: list[Any] = []
        valid = np.ones(len(rows), dtype=bool)
        for i, data in enumerate(rows):
            try:
                records.append({"text": str(data, "utf-8")})
            except UnicodeDecodeError as exc:
                error = RecordError(f"not UTF-8 text: {exc}", path=self._path, line=lines[i], row=start + i)
                bad(self._errors, error)
                valid[i] = False
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
) -> TextReader:
    return TextReader(path, compression, info, columns, errors)
