"""The shards of a dataset: each file, where it is, how it is read and how many records it holds.

The shards are kept as columns (:class:`Shards`), never an object per file: a corpus of a million
files is listed, indexed and sent to every worker in seconds. How the records are counted is
:mod:`tidal.sources.counting`'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

import numpy as np

from tidal.errors import ArgumentError


@dataclass(frozen=True)
class Shard:
    """One file of a dataset: where it is, how it is read, how many records it holds."""

    path: str
    rows: int
    bytes: int
    format: str
    compression: str | None = None
    info: dict = field(default_factory=dict, compare=False, hash=False, repr=False)
    version: str | None = field(default=None, compare=False, repr=False)  # a remote file's ETag or mtime
    hash: str | None = field(default=None, compare=False, repr=False)  # "sha256:<hex>": checked on download
    error: str | None = field(default=None, compare=False, repr=False)  # why its scan failed (then rows == 0)


class Shards(Sequence[Shard]):
    """The shards of a dataset, kept as columns (one list or array per field of :class:`Shard`).

    A corpus may come as a million files and every rank and worker holds its list: as columns it
    is built, pickled to a spawned worker and loaded there in moments, where a million objects
    take seconds. Indexing gives a :class:`Shard`; ``rows`` and ``bytes`` are int64 arrays.
    """

    __slots__ = ("bytes", "compressions", "errors", "formats", "hashes", "infos", "paths", "rows", "versions")
    # the columns in the order __init__ takes them
    _ORDER = ("paths", "rows", "bytes", "formats", "compressions", "infos", "versions", "hashes", "errors")

    def __init__(
        self,
        paths: list[str],
        rows: Any,
        bytes: Any,
        formats: list[str],
        compressions: list[str | None] | None = None,
        infos: list[dict] | None = None,
        versions: list[str | None] | None = None,
        hashes: list[str | None] | None = None,
        errors: list[str | None] | None = None,
    ):
        n = len(paths)
        self.paths = paths
        self.rows = _counts(rows, n)
        self.bytes = _counts(bytes, n)
        self.formats = formats
        self.compressions = compressions if compressions is not None else [None] * n
        self.infos = infos if infos is not None else [NO_INFO] * n
        self.versions = versions if versions is not None else [None] * n
        self.hashes = hashes if hashes is not None else [None] * n
        self.errors = errors if errors is not None else [None] * n
        if not all(len(c) == n for c in self._columns()):
            raise ArgumentError("every column of Shards needs one value per shard")

    @classmethod
    def of(cls, shards: Iterable[Shard]) -> Shards:
        s = list(shards)
        return cls(
            [x.path for x in s],
            [x.rows for x in s],
            [x.bytes for x in s],
            [x.format for x in s],
            [x.compression for x in s],
            [x.info for x in s],
            [x.version for x in s],
            [x.hash for x in s],
            [x.error for x in s],
        )

    @classmethod
    def concat(cls, parts: Iterable[Shards]) -> Shards:
        parts = list(parts)
        if len(parts) == 1:
            return parts[0]
        columns = [p._columns() for p in parts]
        return cls(*([v for c in columns for v in c[k]] for k in range(len(cls._ORDER))))

    def _columns(self) -> tuple:
        return tuple(getattr(self, name) for name in self._ORDER)

    @property
    def total(self) -> int:
        return int(self.rows.sum())

    def __len__(self) -> int:
        return len(self.paths)

    @overload
    def __getitem__(self, i: int) -> Shard: ...

    @overload
    def __getitem__(self, i: slice) -> Shards: ...

    def __getitem__(self, i: int | slice) -> Shard | Shards:
        if isinstance(i, slice):
            return Shards(*(c[i] for c in self._columns()))
        return Shard(
            self.paths[i],
            int(self.rows[i]),
            int(self.bytes[i]),
            self.formats[i],
            self.compressions[i],
            {} if self.infos[i] is NO_INFO else self.infos[i],  # never the dict all the others share
            self.versions[i],
            self.hashes[i],
            self.errors[i],
        )

    def __iter__(self) -> Iterator[Shard]:
        return (self[i] for i in range(len(self)))

    def __eq__(self, other: object) -> bool:  # as a tuple of Shard compares: path, rows, bytes, format, compression
        if isinstance(other, Shards):
            return (
                self.paths == other.paths
                and np.array_equal(self.rows, other.rows)
                and np.array_equal(self.bytes, other.bytes)
                and self.formats == other.formats
                and self.compressions == other.compressions
            )
        if isinstance(other, (tuple, list)):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Shards({len(self)} files, {self.total} records)"

    def __reduce__(self) -> tuple:
        return (Shards, self._columns())


NO_INFO: dict = {}  # shared by every shard whose scan recorded nothing: never changed in place


def _counts(values: Any, n: int) -> np.ndarray:
    out = np.array(values, dtype=np.int64).reshape(-1) if n else np.zeros(0, dtype=np.int64)
    out.flags.writeable = False
    return out
