"""File formats behind one interface, found by file ending through a lazy registry.

A format module has a ``NAME`` and two functions:

- ``scan(path, compression, file=None) -> dict``: what the index keeps about one file:
  ``rows`` and whatever the format needs to open the file at a row later (row groups, line
  offsets).
- ``open(path, compression, info, columns, errors) -> Reader``: a reader whose
  ``read(start, stop)`` returns the records of rows ``[start, stop)`` as a :class:`Piece`.

``path`` names the file in messages; the bytes come from ``file`` (scan) or
``info.get("file", path)`` (open): a local path, the shard cache's copy of a remote file,
or for Parquet an opener that reads the remote file by ranges. A format that reads its
bytes this way works on every source tidal can list.

Adding a format is one module and one line in ``_MODULES`` and ``_ENDINGS``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Literal, Protocol

import numpy as np

from tidal.errors import FormatError
from tidal.tables import Table

Errors = Literal["raise", "skip"]

_MODULES = {
    "parquet": "tidal.formats.parquet",
    "jsonl": "tidal.formats.jsonl",
    "text": "tidal.formats.text",
}
_ENDINGS = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".txt": "text",
    ".text": "text",
}
_COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}


@dataclass
class Piece:
    """Rows ``[start, stop)`` of one file. ``valid`` marks the rows that were kept when
    ``errors="skip"`` dropped bad ones (``None``: all kept); ``table`` holds only kept rows."""

    table: Table
    valid: np.ndarray | None = None


class Reader(Protocol):
    def read(self, start: int, stop: int) -> Piece: ...

    def close(self) -> None: ...


def formats() -> list[str]:
    """The names ``Dataset(format=...)`` accepts."""
    return sorted(_MODULES)


def known_ending(path: str) -> bool:
    try:
        detect(path)
    except FormatError:
        return False
    return True


def detect(path: str, name: str | None = None) -> tuple[str, str | None]:
    """``(format name, compression or None)`` for a path, from its ending unless ``name`` is given."""
    stem, compression = path.lower(), None
    for ending, comp in _COMPRESSIONS.items():
        if stem.endswith(ending):
            stem, compression = stem[: -len(ending)], comp
            break
    if name is not None:
        if name not in _MODULES:
            raise FormatError(f"unknown format {name!r}; known: {', '.join(formats())}")
        return name, compression
    for ending, fmt in _ENDINGS.items():
        if stem.endswith(ending):
            return fmt, compression
    raise FormatError(f"{path}: no reader for this file ending; pass format= (one of {', '.join(formats())})")


def module(name: str) -> ModuleType:
    return importlib.import_module(_MODULES[name])
