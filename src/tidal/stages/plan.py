"""What the source stage reads: the shards and how to order them (a plain, picklable value)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tidal.formats import Errors
from tidal.sources.shards import Shards
from tidal.storage.config import Storage

DEFAULT_BLOCK_SIZE = 16_384  # records a shuffle block holds
DEFAULT_SHARDS_PER_BLOCK = 8  # files a shuffle block mixes, at least
DEFAULT_BLOCK_BYTES = 128 << 20  # bytes of its files a block holds, at most (as stored)


class Opening:
    """The bytes opening a dataset brought over the network in this process (indexing its files:
    each JSON lines file downloaded once, Parquet footers), handed once, to the first loader made
    of it (:func:`tidal.metrics.Meter`), which counts them as downloaded: the readers then find
    those files in the cache and count none of it, and no later loader counts them again."""

    def __init__(self, downloaded: int = 0):
        self._left = downloaded

    def claim(self) -> int:
        """The bytes, the first time; 0 after."""
        left, self._left = self._left, 0
        return left


@dataclass(frozen=True)
class ReadPlan:
    """What the source stage needs: the shards and how to order them."""

    shards: Shards
    columns: tuple[str, ...] | None
    errors: Errors
    seed: int | None
    block_size: int
    shards_per_block: int
    epochs: int | None  # None: forever
    block_bytes: int = DEFAULT_BLOCK_BYTES
    storage: Storage | None = None  # how to reach remote shards; None when every shard is local
    options: dict = field(default_factory=dict)  # format options (tidal.formats.OPTIONS)
    given: dict = field(default_factory=dict, compare=False)  # src, format, follow_links as given: for to_config()
    indexed: bool = field(default=False, compare=False)  # listed from a published index: checked on download
    opening: Opening = field(default_factory=Opening, compare=False)  # what opening it downloaded here

    @property
    def total(self) -> int:
        return self.shards.total

    def bounded_by_bytes(self) -> bool:
        """Whether ``block_bytes`` may cut a block smaller than ``block_size`` records: only where
        some shard's records average more than ``block_bytes / block_size`` bytes."""
        s = self.shards
        return bool(np.any(s.bytes * self.block_size > s.rows * self.block_bytes))
