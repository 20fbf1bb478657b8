"""The room a machine's readers need in the shard cache, for every epoch, from the index alone.

A reader holds open the remote shards of the block it reads (and those of the next block it has
open already): never more than the shards of one *group* (:mod:`tidal.order`: a group's blocks
read slices of its shards, no block reads two groups', and a reader going on to another group,
or starting an epoch, keeps none of the last one open). Which shards make a group depends on the
epoch's shard order, so what holds for every epoch is the worst group any order can make:

- at most ``k`` shards, ``k`` the most shards a block can read
  (:func:`tidal.order.most_shards_per_block`, which also says which argument sets it), so at
  most the ``k`` largest, at their size in the cache;
- a group of more than ``shards_per_block`` shards reached neither ``block_size`` records nor
  ``block_bytes`` bytes before its last shard: so its bytes are under ``block_bytes`` (or
  ``block_size`` records at the most bytes a record of any shard takes) plus its largest shard.

The readers of a machine share its cache (DataLoader workers x continuous rows x the ranks of
the machine), and each may hold its most at once; but a shard is on disk once however many
hold it, so no more is ever needed than every shard fetched whole. Parquet shards may be read
in place by range requests instead (:func:`fit`): the fewest, largest first, that make the rest fit.

:func:`room` and :func:`fit` are what the readers check before they read (the prefetcher, at the
first block) and what ``tidal plan`` prints: the same function of the same index, sorted once,
O(shards log shards).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tidal.order import most_shards_per_block
from tidal.storage.eviction import footprint
from tidal.storage.urls import is_remote


def cached_sizes(shards: Any, whole: Sequence[bool] | np.ndarray) -> np.ndarray:
    """Per shard of ``shards`` (a :class:`tidal.Shards`), what a reader that opens it holds in the
    cache: the shard where it is fetched ``whole`` (not local, not read in place by ranges) and
    a remote file its format reads beside it (a Megatron ``.idx``), with their metadata."""
    out = np.zeros(len(shards), dtype=np.int64)
    fetched = np.flatnonzero(np.asarray(whole, dtype=bool))
    out[fetched] = -(-shards.bytes[fetched] // 4096) * 4096 + footprint(0)  # footprint() of each
    for i, info in enumerate(shards.infos):
        near = info.get("beside")
        if isinstance(near, dict) and is_remote(shards.paths[i]):
            out[i] += footprint(int(near["bytes"]))
    return out


def streamable(shards: Any) -> np.ndarray:
    """Per shard of ``shards`` (a :class:`tidal.Shards`), whether it can be read in place by
    ranges where the cache cannot hold it (Parquet)."""
    pairs = zip(shards.formats, shards.compressions, strict=True)
    return np.array([f == "parquet" and c is None for f, c in pairs], dtype=bool)


@dataclass(frozen=True)
class Room:
    """What the shard cache must hold at once for a machine's readers, in the worst epoch.

    >>> need = room(rows, bytes, cached, seed=0, block_size=1600, shards_per_block=4, readers=2)
    >>> need.needed          # bytes of entries: cache_limit must be this plus the cache's own files
    """

    per_reader: int  # bytes in the cache one reader may hold at once
    shards: int  # the most shards it holds at once
    by: str  # the argument that bounds it: shards_per_block, block_size, block_bytes ("" in order)
    readers: int  # readers that share the cache
    whole: int  # every shard fetched whole, once: never more is needed
    block_size: int
    shards_per_block: int
    block_bytes: int | None

    @property
    def needed(self) -> int:
        """Bytes of entries the cache must have room for."""
        return min(self.whole, self.readers * self.per_reader)

    def why(self) -> str:
        """What sets how many shards a reader holds at once, in words: the argument that bounds it."""
        if self.by == "":
            return "the data is read in order, one shard at a time"
        if self.by == "shards_per_block":
            return f"shuffle(shards_per_block={self.shards_per_block}) sets it"
        if self.by == "block_size":
            return (
                f"shuffle(block_size={self.block_size:,}) sets it, not shards_per_block={self.shards_per_block}: a "
                "block takes more shards while their records stay under block_size, and an epoch may put the "
                f"{self.shards} smallest side by side"
            )
        return (
            f"shuffle(block_bytes={self.block_bytes:,}) sets it, not shards_per_block={self.shards_per_block}: a "
            "block takes more shards while their bytes stay under block_bytes, and an epoch may put the "
            f"{self.shards} smallest side by side"
        )

    def fix(self) -> str:
        """What makes the readers hold less at once, for a hint ("" where nothing does)."""
        fewer = {
            "": "",
            "shards_per_block": "a smaller shuffle(shards_per_block=...)",
            "block_size": "a smaller shuffle(block_size=...)",
            "block_bytes": "a smaller shuffle(block_bytes=...)",
        }[self.by]
        readers = "fewer DataLoader workers or ranks per machine" if self.readers > 1 else ""
        return " or ".join(x for x in (fewer, readers) if x)


def room(
    rows: Sequence[int] | np.ndarray,
    bytes: Sequence[int] | np.ndarray,
    cached: Sequence[int] | np.ndarray,
    *,
    seed: int | None,
    block_size: int,
    shards_per_block: int,
    block_bytes: int | None = None,
    readers: int = 1,
) -> Room:
    """The room ``readers`` readers of one machine need in the cache over every epoch of the
    order (``seed``, ``block_size``, ``shards_per_block``, ``block_bytes``) of shards of ``rows``
    records and ``bytes`` bytes, each holding ``cached`` bytes in the cache while open."""
    n = np.asarray(rows, dtype=np.int64)
    size = np.asarray(bytes, dtype=np.int64)
    held = np.where(n > 0, np.asarray(cached, dtype=np.int64), 0)  # a shard of no records is never opened
    k, by = most_shards_per_block(
        n, seed=seed, block_size=block_size, shards_per_block=shards_per_block, bytes=size, block_bytes=block_bytes
    )
    largest = np.sort(held)[::-1]
    top = np.concatenate([[0], np.cumsum(largest)])  # top[j]: the j largest
    per, bound = int(top[k]), by
    if by in ("block_size", "block_bytes"):  # k > shards_per_block: such a group's bytes are bounded too
        per, bound = _capped(n, size, held, k, by, shards_per_block, block_size, block_bytes, top)
    return Room(
        per_reader=per,
        shards=k,
        by=bound,
        readers=max(1, readers),
        whole=int(held.sum()),
        block_size=block_size,
        shards_per_block=shards_per_block,
        block_bytes=block_bytes,
    )


def _capped(
    n: np.ndarray,
    size: np.ndarray,
    held: np.ndarray,
    k: int,
    by: str,
    shards_per_block: int,
    block_size: int,
    block_bytes: int | None,
    top: np.ndarray,
) -> tuple[int, str]:
    """The most a group holds where it may have more than ``shards_per_block`` shards, and the
    argument that bounds it. A group of ``shards_per_block`` shards holds at most the largest as
    many; a larger one reached neither bound before its last shard: the bytes of the others
    are under ``block_bytes``, and under ``block_size`` records at the most bytes a record of a
    held shard takes; its last shard is at most the largest; and each takes its metadata beside."""
    mine = held > 0
    if not mine.any():
        return 0, by
    extra = np.sort(held[mine] - size[mine])[::-1]  # metadata, blocks, files read beside
    last = int(size[mine].max())
    i = int(np.argmax(size[mine] / n[mine]))  # the most bytes per record
    by_rows = -(-int(size[mine][i]) * (block_size - 1) // int(n[mine][i]))
    before, cap_by = by_rows, "block_size"
    if block_bytes is not None and block_bytes - 1 < before:
        before, cap_by = block_bytes - 1, "block_bytes"
    cap = before + last + int(np.maximum(extra[:k], 0).sum())
    few = int(top[min(k, shards_per_block)])
    most = min(int(top[k]), cap)
    if few >= most:
        return few, "shards_per_block"
    return most, by if int(top[k]) <= cap else cap_by


def fit(
    rows: Sequence[int] | np.ndarray,
    bytes: Sequence[int] | np.ndarray,
    cached: Sequence[int] | np.ndarray,
    ranged: Sequence[bool] | np.ndarray,
    space: int,
    **order: Any,
) -> tuple[Room, list[int]]:
    """:func:`room`, with the fewest ``ranged`` shards (largest first) read in place by ranges
    that make it fit in ``space`` bytes: the room then, and which they are (all of them where
    even that does not fit: then the room is more than ``space``)."""
    held = np.asarray(cached, dtype=np.int64)
    need = room(rows, bytes, held, **order)
    if need.needed <= space:
        return need, []
    can = np.flatnonzero(np.asarray(ranged, dtype=bool) & (held > 0))
    can = can[np.argsort(-held[can], kind="stable")]  # largest first

    def without(m: int) -> Room:
        rest = held.copy()
        rest[can[:m]] = 0
        return room(rows, bytes, rest, **order)

    lo, hi = 0, len(can)  # the room shrinks as more are read in place: the fewest that fit, by bisection
    if without(hi).needed > space:
        return without(hi), [int(i) for i in can]
    while lo < hi:
        mid = (lo + hi) // 2
        if without(mid).needed <= space:
            hi = mid
        else:
            lo = mid + 1
    return without(lo), [int(i) for i in can[:lo]]
