"""The order of one epoch, as a pure function of (seed, epoch, shard sizes).

An epoch is a sequence of *blocks*; each block holds the records of a few shard slices and
is the unit of shuffling: its records are read together and permuted, so memory is
bounded by one block.

- Unshuffled, shards follow each other in the order given; blocks are consecutive runs of
  at most ``block_size`` records.
- Shuffled, the shard order is permuted for the epoch, then cut into *groups* of at least
  ``shards_per_block`` shards and ``block_size`` records. A group of ``m`` blocks cuts
  each of its shards into ``m`` equal slices; block ``t`` holds slice ``t`` of every shard in
  the group. So each block mixes records of several shards, and reading a group's blocks
  in turn reads each of its shards front to back (cheap for compressed files).
- Either way, where the shards' sizes in bytes are given, a group has enough blocks that
  each holds at most ``block_bytes`` of them (counted pro rata from each shard's size): the
  bound in bytes is what keeps a block of 100 KB documents as small as one of tweets.

Positions ``0 .. total`` number the records of the epoch in yield order; state is a position.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Slices:
    """The slices of every block of an epoch, block after block (:meth:`EpochOrder.table`):
    block ``b``'s are entries ``bounds[b]:bounds[b + 1]``, each rows ``start:stop`` of ``shard``."""

    bounds: np.ndarray
    shard: np.ndarray
    start: np.ndarray
    stop: np.ndarray

    def block_of(self) -> np.ndarray:
        """The block of every entry."""
        return np.repeat(np.arange(len(self.bounds) - 1), np.diff(self.bounds))


def rng(seed: int, *key: int) -> np.random.Generator:
    """A generator for one purpose, keyed by ints: never by time or process id."""
    return np.random.default_rng([seed, *key])


class EpochOrder:
    """The blocks of one epoch. Made with array operations, never a loop per shard or per
    block, so that an epoch of a million shards is ordered in well under a second."""

    def __init__(
        self,
        rows: Sequence[int] | np.ndarray,
        *,
        seed: int | None,
        epoch: int,
        block_size: int,
        shards_per_block: int,
        bytes: Sequence[int] | np.ndarray | None = None,
        block_bytes: int | None = None,
    ):
        self.seed, self.epoch = seed, epoch
        sizes = np.asarray(rows, dtype=np.int64)
        order = np.arange(len(sizes)) if seed is None else rng(seed, epoch, 0).permutation(len(sizes))
        order = order[sizes[order] > 0]
        n = sizes[order]
        w = None if bytes is None or block_bytes is None else np.asarray(bytes, dtype=np.int64)[order]
        if seed is None:  # a group per shard
            bounds = np.arange(len(order) + 1)
        else:
            bounds = _group_bounds(n, shards_per_block, block_size, w, block_bytes)
        groups = len(bounds) - 1
        totals = np.add.reduceat(n, bounds[:-1]) if groups else np.zeros(0, dtype=np.int64)
        m = np.maximum(1, -(-totals // block_size))  # blocks per group: each shard cut in m slices
        if w is not None and block_bytes is not None and groups:
            weight = np.add.reduceat(w, bounds[:-1])
            # never more blocks than the group's largest shard has records: a slice holds one at least
            m = np.maximum(m, np.minimum(-(-weight // block_bytes), np.maximum.reduceat(n, bounds[:-1])))
        self._order, self._n, self._bounds, self._m = order, n, bounds, m
        _, _, lengths, block = self._entries()
        block_lengths = np.bincount(block, weights=lengths, minlength=int(m.sum())).astype(np.int64)
        first = np.cumsum(m) - m  # the first block of each group
        owners = np.stack([np.repeat(np.arange(groups), m), np.arange(int(m.sum())) - np.repeat(first, m)], axis=1)
        self._nonempty = block_lengths > 0  # a group of tiny shards can leave a slice number empty
        self._owners = owners[self._nonempty]
        self.starts = np.concatenate([[0], np.cumsum(block_lengths[self._nonempty])]).astype(np.int64)
        self.total = int(self.starts[-1])

    def _entries(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """One entry per (shard, slice t), shard by shard in the epoch's shard order: the shard's
        place in that order, its first row, its length, and its block before empty ones are
        dropped (slice t of every shard of a group goes to the group's first block + t)."""
        n, bounds, m = self._n, self._bounds, self._m
        first = np.cumsum(m) - m  # the first block of each group
        per_group = np.diff(bounds)
        reps = np.repeat(m, per_group)  # per shard: its group's m
        shard = np.repeat(np.arange(len(n)), reps)
        t = np.arange(int(reps.sum())) - np.repeat(np.cumsum(reps) - reps, reps)
        mm, ns = reps[shard], n[shard]
        lo = (t * ns) // mm
        lengths = ((t + 1) * ns) // mm - lo
        block = np.repeat(first, per_group)[shard] + t
        return shard, lo, lengths, block

    def table(self) -> Slices:
        """Every block's slices at once, as arrays (what :meth:`slices` gives block by block):
        for planning a whole epoch without a Python loop per block or per shard."""
        shard, lo, lengths, block = self._entries()
        keep = lengths > 0
        renumber = np.cumsum(self._nonempty) - 1  # block numbers once empty ones are dropped
        block = renumber[block[keep]]
        by_block = np.argsort(block, kind="stable")  # within a block: the group's shard order, as slices() gives
        counts = np.bincount(block, minlength=self.blocks)
        return Slices(
            bounds=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
            shard=self._order[shard[keep][by_block]].astype(np.int64),
            start=lo[keep][by_block],
            stop=(lo + lengths)[keep][by_block],
        )

    @property
    def blocks(self) -> int:
        return len(self.starts) - 1

    def block_at(self, position: int) -> int:
        """The block holding ``position`` (``0 <= position < total``)."""
        return int(np.searchsorted(self.starts, position, side="right")) - 1

    def slices(self, block: int) -> list[tuple[int, int, int]]:
        """``(shard, start row, stop row)`` read, in this order, to make ``block``."""
        gi, t = (int(x) for x in self._owners[block])
        a, b, m = int(self._bounds[gi]), int(self._bounds[gi + 1]), int(self._m[gi])
        n = self._n[a:b]
        lo, hi = (t * n) // m, ((t + 1) * n) // m
        return [(int(s), int(x), int(y)) for s, x, y in zip(self._order[a:b], lo, hi, strict=True) if y > x]

    def permutation(self, block: int) -> np.ndarray | None:
        """The order in which the block's records are yielded; ``None`` when unshuffled."""
        if self.seed is None:
            return None
        n = int(self.starts[block + 1] - self.starts[block])
        return rng(self.seed, self.epoch, 1, block).permutation(n)


def _group_bounds(
    sizes: np.ndarray,
    shards_per_block: int,
    block_size: int,
    weights: np.ndarray | None = None,
    block_bytes: int | None = None,
) -> np.ndarray:
    """Where each group of shards starts, and the end: at least ``shards_per_block`` shards, and
    ``block_size`` records or ``block_bytes`` of ``weights`` per group (the last takes what is left).

    Taken greedily from the front: the group starting at shard ``a`` ends at the first ``e`` at
    least ``a + shards_per_block`` whose records (or bytes) since ``a`` reach the bound. That end
    is found for every ``a`` at once; following it from 0 is a step per group, not per shard.
    Where no shard's records average ``block_bytes / block_size`` bytes, the records reach their
    bound first: the groups are those of ``block_size`` alone.
    """
    count = len(sizes)
    cum = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
    reach = np.searchsorted(cum, cum[:-1] + block_size, side="left")
    if weights is not None and block_bytes is not None:
        cum_bytes = np.concatenate([[0], np.cumsum(weights, dtype=np.int64)])
        reach = np.minimum(reach, np.searchsorted(cum_bytes, cum_bytes[:-1] + block_bytes, side="left"))
    ends = np.maximum(np.arange(count) + max(1, shards_per_block), reach)
    step = np.minimum(ends, count).tolist()
    bounds, a = [0], 0
    while a < count:
        a = step[a]
        bounds.append(a)
    return np.asarray(bounds, dtype=np.int64)


def most_shards_per_block(
    rows: Sequence[int] | np.ndarray,
    *,
    seed: int | None,
    block_size: int,
    shards_per_block: int,
    bytes: Sequence[int] | np.ndarray | None = None,
    block_bytes: int | None = None,
) -> tuple[int, str]:
    """The most shards a block of any epoch reads, and the argument that sets that number:
    ``"shards_per_block"``, ``"block_size"`` or ``"block_bytes"`` (``""`` unshuffled, where a
    block reads one shard).

    Shuffled, a block reads slices of the shards of one group, never of two. A group takes
    ``shards_per_block`` shards, and more only while their records stay under ``block_size`` and
    their bytes under ``block_bytes`` (:func:`_group_bounds`): so it never holds more than the
    fewest shards whose records (or bytes) reach the bound, which are the smallest ones, and an
    epoch's order may put those side by side. Sorting is all it takes: no epoch is ordered.

    >>> most_shards_per_block([40] * 20 + [900] * 4, seed=0, block_size=1600, shards_per_block=4)
    (21, 'block_size')
    """
    sizes = np.asarray(rows, dtype=np.int64)
    read = sizes > 0  # shards of no records are in no block
    count = int(read.sum())
    if seed is None or count == 0:
        return min(1, count), ""

    def reach(values: np.ndarray, bound: int) -> int:
        """The fewest of ``values`` that add up to ``bound``: the smallest first (all, where none do)."""
        total = np.cumsum(np.sort(values))
        return min(count, int(np.searchsorted(total, bound, side="left")) + 1)

    by, fewest = "block_size", reach(sizes[read], block_size)
    if bytes is not None and block_bytes is not None:
        by_bytes = reach(np.asarray(bytes, dtype=np.int64)[read], block_bytes)
        if by_bytes < fewest:
            by, fewest = "block_bytes", by_bytes
    if fewest <= shards_per_block:
        return min(count, max(1, shards_per_block)), "shards_per_block"
    return fewest, by


def consumer_range(total: int, consumers: int, consumer: int, *, drop_remainder: bool) -> tuple[int, int]:
    """Positions ``[start, stop)`` of an epoch read by one of ``consumers`` readers.

    Readers take consecutive, disjoint ranges, so together they read each record once.
    With ``drop_remainder`` every reader gets exactly ``total // consumers`` records and the
    last ``total % consumers`` positions of the epoch (random records when shuffled) are not
    read that epoch; this is what keeps every rank's batch count equal in finite epochs.
    """
    if drop_remainder:
        q = total // consumers
        return consumer * q, (consumer + 1) * q
    return consumer * total // consumers, (consumer + 1) * total // consumers


Intervals = list[tuple[int, int]]


def share(total: int, done: Intervals, consumers: int, consumer: int, *, drop_remainder: bool) -> Intervals:
    """The positions one reader takes of an epoch part of which is already ``done``.

    What is left is split as :func:`consumer_range` splits a whole epoch, counting only the
    positions left; with nothing done it is exactly that range. This is what lets a state
    saved on one topology resume on another: the new readers share what the old ones left.
    """
    left = complement(done, total)
    lo, hi = consumer_range(sum(b - a for a, b in left), consumers, consumer, drop_remainder=drop_remainder)
    return cut_intervals(left, lo, hi)


def remainder(total: int, done: Intervals, consumers: int) -> Intervals:
    """The positions of an epoch that no reader's :func:`share` takes with ``drop_remainder``:
    the last ``left % consumers`` of those not ``done``, fewer than the readers."""
    left = complement(done, total)
    n = sum(b - a for a, b in left)
    return cut_intervals(left, n - n % consumers, n)


def complement(done: Intervals, total: int) -> Intervals:
    out, at = [], 0
    for a, b in union(done):
        if a > at:
            out.append((at, a))
        at = max(at, b)
    if at < total:
        out.append((at, total))
    return out


def union(intervals: Intervals) -> Intervals:
    out: Intervals = []
    for a, b in sorted((int(a), int(b)) for a, b in intervals if b > a):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def cut_intervals(intervals: Intervals, lo: int, hi: int) -> Intervals:
    """The positions numbered ``lo .. hi`` when ``intervals`` are read one after another."""
    out, at = [], 0
    for a, b in intervals:
        n = b - a
        start, stop = max(lo - at, 0), min(hi - at, n)
        if stop > start:
            out.append((a + start, a + stop))
        at += n
    return out


def share_sizes(total: int, done: Intervals, consumers: int, *, drop_remainder: bool) -> np.ndarray:
    """How many positions each of ``consumers`` readers takes with :func:`share`, for all at once."""
    left = sum(b - a for a, b in complement(done, total))
    lo, hi = _ranges(left, consumers, drop_remainder)
    return hi - lo


def taken(total: int, done: Intervals, used: np.ndarray, *, drop_remainder: bool) -> Intervals:
    """``done`` and the first ``used[c]`` positions of each reader ``c``'s :func:`share`, merged:
    what ``len(used)`` readers have used up of an epoch, in time linear in readers and intervals
    (not a :func:`share` per reader, which is their product: minutes at 8,192 readers)."""
    left = complement(done, total)
    first = np.array([a for a, _ in left], dtype=np.int64)
    lengths = np.array([b - a for a, b in left], dtype=np.int64)
    before = np.concatenate([[0], np.cumsum(lengths)])  # positions left before each left interval
    lo, hi = _ranges(int(before[-1]), len(used), drop_remainder)
    hi = lo + np.minimum(hi - lo, np.asarray(used, dtype=np.int64))
    keep = hi > lo
    lo, hi = lo[keep], hi[keep]
    # each reader's [lo, hi), counted in positions left, cut where the left intervals end
    i0 = np.searchsorted(before, lo, side="right") - 1
    i1 = np.searchsorted(before, hi - 1, side="right") - 1
    count = i1 - i0 + 1
    of = np.repeat(np.arange(len(lo)), count)
    iv = i0[of] + np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
    a = first[iv] + np.maximum(lo[of] - before[iv], 0)
    b = first[iv] + np.minimum(hi[of] - before[iv], lengths[iv])
    prior = np.array([(int(x), int(y)) for x, y in done], dtype=np.int64).reshape(-1, 2)
    return _union(np.concatenate([prior[:, 0], a]), np.concatenate([prior[:, 1], b]))


def _ranges(total: int, consumers: int, drop_remainder: bool) -> tuple[np.ndarray, np.ndarray]:
    """:func:`consumer_range` of every reader: arrays of starts and stops."""
    c = np.arange(consumers, dtype=np.int64)
    q, r = divmod(total, consumers)
    if drop_remainder:
        return c * q, (c + 1) * q
    return c * q + (c * r) // consumers, (c + 1) * q + ((c + 1) * r) // consumers  # c * total // consumers


def _union(a: np.ndarray, b: np.ndarray) -> Intervals:
    """:func:`union` of the intervals ``[a[i], b[i])``."""
    keep = b > a
    a, b = a[keep], b[keep]
    by = np.lexsort((b, a))
    a, b = a[by], b[by]
    if not len(a):
        return []
    reach = np.maximum.accumulate(b)
    new = np.ones(len(a), dtype=bool)
    new[1:] = a[1:] > reach[:-1]  # a gap before it: it starts a merged interval
    starts = np.flatnonzero(new)
    return list(zip(a[starts].tolist(), np.maximum.reduceat(b, starts).tolist(), strict=True))
