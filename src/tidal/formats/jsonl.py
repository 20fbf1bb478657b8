"""JSON lines: one JSON object per non-empty line, kept as Python dicts.

A line that is not a JSON object is a :class:`~tidal.errors.RecordError` naming the file and
line, handed to the ``errors`` policy. Records need not have the same fields (an optional
``"lang"``): with ``columns=``, each record has exactly those, ``None`` for a field it lacks,
and the fields not asked for dropped. JSON lines have no schema, so a column asked for that no
record of a block has is taken for a typo: a :class:`~tidal.errors.SchemaError` raised by the
source stage.

The source stage holds a block as its lines (:meth:`JsonlReader.unparsed`) and parses each
batch as it is cut (:func:`parse`, ``PARSED_PER_BATCH``): a bad line meets the policy when the
batch that holds it is made, by the reader that yields it.

Lines are parsed with orjson (a core dependency), by its rules: UTF-8 only (no byte order
mark, no lone surrogate, raw or escaped), no ``NaN`` or ``Infinity``, no number past a double's
range, arrays and objects nested at most 1,024 deep, each a bad line. An integer outside
``[-2**63, 2**64)`` is read as the nearest float.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
from orjson import loads

from tidal.errors import RecordError
from tidal.formats import Errors, Options, Piece
from tidal.formats.bad_data import bad
from tidal.formats.lines import LineReader, scan
from tidal.tables import Unparsed

NAME = "jsonl"
PARSED_PER_BATCH = True
__all__ = ["NAME", "PARSED_PER_BATCH", "around", "open", "parse", "scan"]

Lines = Sequence[bytes | memoryview]


def parse(
    rows: Lines, columns: tuple[str, ...] | None
) -> tuple[list[Any], list[tuple[int, str]], dict[str, tuple[int, str]]]:
    """The records of ``rows`` (lines' bytes) that are JSON objects, with ``columns`` each
    exactly those fields; ``(index, why)`` of each line that is not one; and of the columns
    asked for that no record has, the index of the first record and its fields."""
    try:  # the common case at C speed: every line an object with the fields asked for, in order
        records = list(map(loads, rows))
    except ValueError:
        pass
    else:
        if set(map(type, records)) <= {dict} and (columns is None or all(map(columns.__eq__, map(tuple, records)))):
            return records, [], {}
    kept: list[Any] = []
    bad_rows: list[tuple[int, str]] = []
    missed: dict[str, tuple[int, str]] = {}  # columns some record lacked: where first
    found: set[str] = set()  # columns some record had
    for i, data in enumerate(rows):
        try:
            rec = loads(data)
        except ValueError as exc:  # orjson's JSONDecodeError
            bad_rows.append((i, f"malformed JSON record: {reason(data, exc)}"))
            continue
        if not isinstance(rec, dict):
            bad_rows.append((i, f"malformed JSON record: expected a JSON object, got {type(rec).__name__}"))
            continue
        if columns is not None and tuple(rec) != columns:  # fields as asked for: the record as it is
            for c in columns:
                if c in rec:
                    found.add(c)
                elif c not in missed:
                    missed[c] = (i, ", ".join(sorted(rec)) or "none")
            rec = {c: rec.get(c) for c in columns}
        elif columns is not None:
            found.update(columns)
        kept.append(rec)
    return kept, bad_rows, {c: where for c, where in missed.items() if c not in found}


def around(info: dict, start: int, stop: int, row: int) -> tuple[int, int]:
    """The rows a point read of ``row`` (of a slice ``[start, stop)``) reads: the line alone, which
    is what reading the slice gives of it (:mod:`tidal.stages.blocks`)."""
    return row, row + 1


def reason(data: bytes | memoryview, exc: ValueError) -> str:
    """Why orjson refused ``data``: its words, but where the bytes are not UTF-8, which byte
    (orjson names column 1 and, for any bad byte, surrogates)."""
    if "not valid UTF-8" in str(exc):
        try:
            bytes(data).decode()
        except UnicodeDecodeError as bad_byte:
            return f"not UTF-8: {bad_byte.reason} at byte {bad_byte.start}"
    return str(exc)


class JsonlReader:
    def __init__(self, path: str, compression: str | None, info: dict, columns: list[str] | None, errors: Errors):
        self._lines = LineReader(path, compression, info)
        self._path = path
        self._columns = tuple(columns) if columns is not None else None
        self._errors = errors

    def read(self, start: int, stop: int) -> Piece:
        rows, lines = self._lines.read_rows(start, stop)
        records, bad_rows, absent = parse(rows, self._columns)
        valid: np.ndarray | None = None
        for i, why in bad_rows:  # in file order
            bad(self._errors, RecordError(why, path=self._path, line=lines[i], row=start + i))
            if valid is None:
                valid = np.ones(stop - start, dtype=bool)
            valid[i] = False
        return Piece(records, valid, self._where(absent, lines))

    def unparsed(self, start: int, stop: int) -> Piece:
        """Rows ``[start, stop)`` as their lines (:class:`~tidal.tables.Unparsed`), to be parsed
        batch by batch. Of the columns asked for, those no record has are found without parsing
        where a column's quoted name is in the bytes read (it may be in a value, or in a line
        beside the slice: then a column no record has passes, as None, where parsing would have
        caught it); the rest by parsing."""
        rows, lines = self._lines.read_rows(start, stop)
        absent: dict[str, str] = {}
        if self._columns is not None and rows:
            buffers = list({id(b): b for b in (r.obj if isinstance(r, memoryview) else r for r in rows)}.values())
            unseen = [c for c in self._columns if not any(_quoted(c) in b for b in buffers)]  # type: ignore[operator]
            if unseen:
                absent = {c: w for c, w in self._where(parse(rows, self._columns)[2], lines).items() if c in unseen}
        return Piece(Unparsed(line=list(rows), number=np.asarray(lines, dtype=np.int64)), None, absent)

    def _where(self, absent: dict[str, tuple[int, str]], lines: list[int]) -> dict[str, str]:
        return {c: f"{self._path}, line {lines[i]} has the fields {fields}" for c, (i, fields) in absent.items()}

    def close(self) -> None:
        self._lines.close()


def _quoted(column: str) -> bytes:
    return json.dumps(column, ensure_ascii=False).encode()


def open(  # noqa: A001
    path: str,
    compression: str | None,
    info: dict,
    columns: list[str] | None,
    errors: Errors,
    options: Options | None = None,
) -> JsonlReader:
    return JsonlReader(path, compression, info, columns, errors)
