"""A run simulated before it starts, from the index alone: what ``tidal plan`` prints.

Given a source's shards (records and bytes each, from the index: nothing else is read), its
order (seed, ``block_size``, ``shards_per_block``) and a topology (ranks, DataLoader workers,
ranks per node), :func:`simulate` works out one epoch the way the readers will read it:

- **Which shards each reader touches.** Reader ``(rank, worker)`` reads the positions
  :func:`tidal.order.share` gives it of the epoch's :class:`tidal.order.EpochOrder`; the reading
  stage loads every block it reads whole (every slice of every shard of the block), so it opens
  every shard of those blocks.
- **Downloads per node.** A node's readers share one shard cache. The readers are stepped
  through their blocks side by side, as if each read records at the same rate; each block's
  shards are fetched whole into a least-recently-used cache of ``cache_limit`` bytes (a shard
  that a reader holds open is never evicted), and every fetch is counted. With a cache large
  enough this is each shard the node touches, once; a smaller one fetches some shards again.
  Prefetching, which fetches the next blocks' shards ahead, is not modelled.
- **The cache a shuffle block needs.** What a reader holds open at once in this epoch (the
  shards of its block, and those of the next block it already has open), at their size in the
  cache; and what it may hold in the worst epoch, which is what tidal checks before the first
  block (:mod:`tidal.storage.room`, the same function of the same index): that ``cache_limit``
  holds it for every reader of a node (ranks x DataLoader workers x continuous rows), beside
  the cache's own files; a smaller one is refused before anything is downloaded.
- **Shuffle quality.** The number of distinct shards among the records of a batch, computed
  from the epoch's block permutations (which record of which shard each position is), for a
  sample of batches over all readers, beside what a perfect shuffle would give (records drawn
  at random from the whole epoch) and what reading in order gives.
- **Time to the first batch** at a given bandwidth: the node's readers all fetch their first
  block's shards at once, over the node's bandwidth. Request latency, decoding and the time a
  reader takes to start are left out: the network part only.

It is computed with arrays over the epoch's slices (:meth:`tidal.order.EpochOrder.table`), never
a set of shards per reader: a fresh epoch gives each reader one run of consecutive positions,
so the blocks it reads are consecutive, and so are the slices of those blocks in the table.
Only a node whose cache cannot hold every shard it touches is stepped through event by event.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tidal.order import EpochOrder, Intervals, Slices
from tidal.storage.eviction import footprint
from tidal.storage.room import Room, fit, room


@dataclass(frozen=True)
class Setup:
    """What is simulated: a source's shards and order, a topology, a cache, a bandwidth."""

    rows: Sequence[int]
    bytes: Sequence[int]
    seed: int | None
    block_size: int
    shards_per_block: int
    block_bytes: int | None = None  # at most this many bytes of the shards per block (None: no bound)
    ranks: int = 1
    workers: int = 1
    ranks_per_node: int = 1
    finite: bool = True  # a finite epoch drops the remainder (fewer records than readers) so ranks stay even
    epoch: int = 0
    batch: int = 1
    cache_limit: int | None = None  # None: unbounded
    bandwidth: float = 1e9  # bytes per second, per node
    sample_batches: int = 2000  # batches whose shuffle quality is computed
    lanes: int = 1  # continuous rows each worker streams: readers of their own
    # what a reader holds in the cache while a shard is open (tidal.storage.room.cached_sizes; 0: local
    # or read in place); None: every shard fetched whole, at its footprint
    cached: Sequence[int] | None = None
    streamable: Sequence[bool] | None = None  # shards that may be read in place instead (Parquet); None: none
    fixed: int = 0  # what the cache's own files take (its index and directories), beside the shards

    @property
    def readers_per_node(self) -> int:
        """The readers that share a node's cache: its ranks x workers x continuous rows."""
        return min(self.ranks_per_node, self.ranks) * self.workers * self.lanes

    @property
    def nodes(self) -> int:
        return -(-self.ranks // self.ranks_per_node)


@dataclass(frozen=True)
class Reader:
    """One reader's epoch: its positions, the blocks it reads, the shards it opens."""

    rank: int
    worker: int
    start: int  # its positions of the epoch: start .. stop
    stop: int
    first_block: int  # the blocks it reads: first_block .. last_block (none when it reads nothing)
    last_block: int
    held_bytes: int  # the most it holds open at once, at its size in the cache
    held_shards: int
    first_block_bytes: int  # the shards of its first block, as downloaded
    loaded: int  # records of the blocks it loads (it reads a block whole, even to yield part of it)
    table: Slices = field(repr=False, compare=False)
    block_starts: np.ndarray = field(repr=False, compare=False)

    @property
    def records(self) -> int:
        return self.stop - self.start

    @property
    def intervals(self) -> Intervals:
        return [(self.start, self.stop)] if self.stop > self.start else []

    @property
    def blocks(self) -> list[tuple[int, int]]:
        """(block, offset in the reader's share where it starts reading it), in order."""
        return [
            (b, max(0, int(self.block_starts[b]) - self.start)) for b in range(self.first_block, self.last_block + 1)
        ]

    @property
    def shards(self) -> set[int]:
        """The shards it opens: every shard of every block it reads."""
        a, z = self.table.bounds[self.first_block], self.table.bounds[self.last_block + 1]
        return set(self.table.shard[a:z].tolist()) if self.last_block >= self.first_block else set()


@dataclass
class Readers:
    """Every reader of the run, rank-major: one array entry per reader (a :class:`Reader` each when indexed)."""

    workers: int
    start: np.ndarray
    stop: np.ndarray
    first_block: np.ndarray  # last_block < first_block where a reader reads nothing
    last_block: np.ndarray
    held_bytes: np.ndarray
    held_shards: np.ndarray
    first_block_bytes: np.ndarray
    loaded: np.ndarray
    table: Slices = field(repr=False)
    block_starts: np.ndarray = field(repr=False)

    @property
    def records(self) -> np.ndarray:
        return self.stop - self.start

    def __len__(self) -> int:
        return len(self.start)

    def __getitem__(self, i: int) -> Reader:
        return Reader(
            rank=i // self.workers,
            worker=i % self.workers,
            start=int(self.start[i]),
            stop=int(self.stop[i]),
            first_block=int(self.first_block[i]),
            last_block=int(self.last_block[i]),
            held_bytes=int(self.held_bytes[i]),
            held_shards=int(self.held_shards[i]),
            first_block_bytes=int(self.first_block_bytes[i]),
            loaded=int(self.loaded[i]),
            table=self.table,
            block_starts=self.block_starts,
        )

    def __iter__(self) -> Iterator[Reader]:
        return (self[i] for i in range(len(self)))


@dataclass
class Node:
    ranks: list[int]
    touched: int  # shards its readers open
    touched_bytes: int  # their bytes: what it downloads with a cache that holds them all
    downloads: int  # fetches in the simulation with the cache_limit
    downloaded_bytes: int
    peak_cache: int  # the most the simulated cache held
    first_bytes: int  # its readers' first blocks together
    too_small: bool  # the cache could not hold what the readers held open at some point


@dataclass
class Simulation:
    setup: Setup
    total_records: int
    total_bytes: int
    blocks: int
    readers: Readers
    nodes: list[Node]
    batches_per_rank: int
    largest_block_bytes: int  # the shards of the largest block, as downloaded
    room: Room  # what a node's readers may hold in the cache at once, in the worst epoch
    ranged: list[int]  # Parquet shards read in place so that the rest fits in cache_limit
    quality: dict = field(default_factory=dict)

    @property
    def held_per_reader(self) -> int:
        """The most a reader holds in the cache at once in this epoch."""
        return int(self.readers.held_bytes.max()) if len(self.readers) else 0

    @property
    def cache_per_node(self) -> int:
        """The least ``cache_limit`` tidal accepts for a node, every epoch (its check, with the
        Parquet shards of :attr:`ranged` read in place): the figure its error names."""
        return self.room.needed + self.setup.fixed

    @property
    def cache_per_rank(self) -> int:
        """The same for a node of one rank."""
        r = self.room
        return min(r.whole, self.setup.workers * self.setup.lanes * r.per_reader) + self.setup.fixed

    def first_batch_seconds(self) -> float:
        return max((n.first_bytes for n in self.nodes), default=0) / self.setup.bandwidth

    def worst_block_seconds(self) -> float:
        """The largest block's shards over the bandwidth: the most a resume waits on the network."""
        return self.largest_block_bytes / self.setup.bandwidth


def simulate(setup: Setup, progress: Callable[[int], None] | None = None) -> Simulation:
    """Simulate one epoch of ``setup``; ``progress`` is called with the number of readers done
    (for a bar): all of them once their shares, blocks and holdings are known."""
    rows = np.asarray(setup.rows, dtype=np.int64)
    sizes = np.asarray(setup.bytes, dtype=np.int64)
    order = EpochOrder(
        rows,
        seed=setup.seed,
        epoch=setup.epoch,
        block_size=setup.block_size,
        shards_per_block=setup.shards_per_block,
        bytes=sizes,
        block_bytes=setup.block_bytes,
    )
    blocks = _Blocks(order, sizes)
    readers = _readers(order, blocks, setup)
    if progress is not None:
        progress(len(readers))
    nodes = [_node(setup, n, readers, blocks) for n in range(setup.nodes)]
    per_reader = int(readers.records.min()) if len(readers) else 0
    need, ranged = _room(setup, rows, sizes)
    sim = Simulation(
        setup=setup,
        total_records=int(rows.sum()),
        total_bytes=int(sizes.sum()),
        blocks=order.blocks,
        readers=readers,
        nodes=nodes,
        batches_per_rank=setup.workers * (per_reader // max(1, setup.batch)),
        largest_block_bytes=int(blocks.bytes.max()) if order.blocks else 0,
        room=need,
        ranged=ranged,
    )
    sim.quality = quality(order, blocks.table, readers, setup, rows)
    return sim


def _room(setup: Setup, rows: np.ndarray, sizes: np.ndarray) -> tuple[Room, list[int]]:
    """What a node's readers hold in the cache at once in the worst epoch, as tidal checks it, and
    the Parquet shards it reads in place for the rest to fit in ``cache_limit``."""
    cached = _footprints(sizes) if setup.cached is None else np.asarray(setup.cached, dtype=np.int64)
    s = setup
    order: dict[str, Any] = {
        "seed": s.seed,
        "block_size": s.block_size,
        "shards_per_block": s.shards_per_block,
        "block_bytes": s.block_bytes,
        "readers": s.readers_per_node,
    }
    if s.cache_limit is None or s.streamable is None:
        return room(rows, sizes, cached, **order), []
    return fit(rows, sizes, cached, s.streamable, s.cache_limit - s.fixed, **order)


class _Blocks:
    """Per block of the epoch: its slices (the table), their bytes as downloaded and in the cache,
    and the shards a reader keeps open over it without reading from them."""

    def __init__(self, order: EpochOrder, sizes: np.ndarray):
        table = order.table()
        self.table, self.order = table, order
        self.sizes = sizes
        self.cached = _footprints(sizes)
        self.entry_block = table.block_of()
        starts = table.bounds[:-1]
        if order.blocks:
            self.bytes = np.add.reduceat(sizes[table.shard], starts)
            self.cached_bytes = np.add.reduceat(self.cached[table.shard], starts)
        else:
            self.bytes = self.cached_bytes = np.zeros(0, dtype=np.int64)
        self.count = np.diff(table.bounds)
        # A reader that goes on from block k-1 keeps open, while it reads block k, the shards of
        # k-1 that k+1 reads again (BlockReader keeps this block's and the next one's open):
        # shards with slices in blocks k-1 and k+1 but none in k (a shard smaller than its group's
        # number of blocks skips some).
        by_shard = np.lexsort((self.entry_block, table.shard))
        shard, block = table.shard[by_shard], self.entry_block[by_shard]
        gap = (shard[1:] == shard[:-1]) & (block[1:] - block[:-1] == 2)
        kept_in = block[:-1][gap] + 1
        self.kept_count = np.bincount(kept_in, minlength=order.blocks).astype(np.int64)
        self.kept_cached = np.zeros(order.blocks, dtype=np.int64)
        np.add.at(self.kept_cached, kept_in, self.cached[shard[:-1][gap]])
        # whether a block reads the same shards as the block before it (the blocks of a group of
        # large shards all do): then the same slices in the same order
        self.same_as_before = np.zeros(order.blocks, dtype=bool)
        if order.blocks > 1:
            alike = np.zeros(order.blocks, dtype=bool)
            alike[1:] = self.count[1:] == self.count[:-1]
            check = np.flatnonzero(alike[self.entry_block])
            match = np.zeros(len(table.shard), dtype=bool)
            match[check] = table.shard[check] == table.shard[check - self.count[self.entry_block[check]]]
            self.same_as_before = alike & np.logical_and.reduceat(match, table.bounds[:-1])


def _footprints(sizes: np.ndarray) -> np.ndarray:
    """:func:`tidal.storage.eviction.footprint` of every size."""
    fixed = footprint(0)
    return -(-sizes // 4096) * 4096 + fixed


def _readers(order: EpochOrder, blocks: _Blocks, setup: Setup) -> Readers:
    consumers = setup.ranks * setup.workers
    c = np.arange(consumers, dtype=np.int64)
    total = order.total
    if setup.finite:  # tidal.order.consumer_range, for every reader at once
        q = total // consumers
        lo, hi = c * q, (c + 1) * q
    else:  # c * total // consumers without overflow
        q, r = divmod(total, consumers)
        lo, hi = c * q + (c * r) // consumers, (c + 1) * q + ((c + 1) * r) // consumers
    reads = hi > lo
    starts = order.starts
    b0 = np.where(reads, np.searchsorted(starts, lo, side="right") - 1, 0)
    b1 = np.where(reads, np.searchsorted(starts, hi - 1, side="right") - 1, -1)
    nblk = b1 - b0 + 1
    # one entry per (reader, block it reads): readers' positions are disjoint, so at most blocks + readers
    pair_start = np.cumsum(nblk) - nblk
    reader = np.repeat(c, nblk)
    block = b0[reader] + np.arange(int(nblk.sum())) - pair_start[reader]
    first = block == b0[reader]
    # what it holds open while reading each block: the block's shards, and from its second block
    # on those it keeps open over the block (as BlockReader._held_per_block)
    held = blocks.cached_bytes[block] + np.where(first, 0, blocks.kept_cached[block])
    count = blocks.count[block] + np.where(first, 0, blocks.kept_count[block])
    held_bytes = np.zeros(consumers, dtype=np.int64)
    held_shards = np.zeros(consumers, dtype=np.int64)
    if len(block):
        at = pair_start[reads]
        held_bytes[reads] = np.maximum.reduceat(held, at)
        top = np.where(held == held_bytes[reader], np.arange(len(block)), len(block))
        held_shards[reads] = count[np.minimum.reduceat(top, at)]  # at the first block where it holds the most
    loaded = np.where(reads, starts[b1 + 1] - starts[b0], 0)
    first_bytes = np.where(reads, blocks.bytes[b0] if order.blocks else 0, 0)
    return Readers(
        workers=setup.workers,
        start=lo,
        stop=hi,
        first_block=b0,
        last_block=b1,
        held_bytes=held_bytes,
        held_shards=held_shards,
        first_block_bytes=first_bytes,
        loaded=loaded,
        table=blocks.table,
        block_starts=starts,
    )


def _node(setup: Setup, n: int, readers: Readers, blocks: _Blocks) -> Node:
    rank0, rank1 = n * setup.ranks_per_node, min(setup.ranks, (n + 1) * setup.ranks_per_node)
    ranks = list(range(rank0, rank1))
    r0, r1 = rank0 * setup.workers, rank1 * setup.workers
    mine = r0 + np.flatnonzero(readers.stop[r0:r1] > readers.start[r0:r1])
    if not len(mine):
        return Node(ranks, 0, 0, 0, 0, 0, 0, False)
    table = blocks.table
    # the node's readers read consecutive positions, so their blocks are consecutive, and so are
    # those blocks' slices in the table
    b0, b1 = int(readers.first_block[mine[0]]), int(readers.last_block[mine[-1]])
    e0, e1 = int(table.bounds[b0]), int(table.bounds[b1 + 1])
    shards, local = np.unique(table.shard[e0:e1], return_inverse=True)
    touched_bytes = int(blocks.sizes[shards].sum())
    touched_cached = int(blocks.cached[shards].sum())
    firsts = np.zeros(b1 - b0 + 1, dtype=bool)  # the blocks its readers start with
    firsts[readers.first_block[mine] - b0] = True
    opened_first = np.zeros(len(shards), dtype=bool)
    opened_first[local[firsts[blocks.entry_block[e0:e1] - b0]]] = True
    first_bytes = int(blocks.sizes[shards[opened_first]].sum())
    if setup.cache_limit is None or touched_cached <= setup.cache_limit:  # nothing is ever evicted
        return Node(ranks, len(shards), touched_bytes, len(shards), touched_bytes, touched_cached, first_bytes, False)
    downloads, downloaded, peak, too_small = _lru(setup.cache_limit, readers, mine, blocks, shards, local, e0)
    return Node(ranks, len(shards), touched_bytes, downloads, downloaded, peak, first_bytes, too_small)


def _lru(
    limit: int, readers: Readers, mine: np.ndarray, blocks: _Blocks, shards: np.ndarray, local: np.ndarray, e0: int
) -> tuple[int, int, int, bool]:
    """A node's cache of ``limit`` bytes, its readers stepped side by side, each at the same number
    of records into its share: (fetches, bytes fetched, the most it held, whether it was ever
    over the limit with what the readers hold open). Shards are numbered in the node (``local``,
    per table entry from ``e0``).

    A reader that goes on to a block of the same shards as its last (the blocks of a group of
    large shards) fetches nothing, changes what it holds in no way and leaves nothing to evict:
    it only makes those shards the most recently used, and they are held, so that matters only
    once it lets them go. Such steps are not walked: the last one's time is given to the shards
    when the reader moves on to other shards. Only the steps to other shards are walked, in order.
    """
    bounds = blocks.table.bounds
    cached, sizes = blocks.cached[shards], blocks.sizes[shards]
    nblk = readers.last_block[mine] - readers.first_block[mine] + 1
    reader = np.repeat(np.arange(len(mine)), nblk)
    block = readers.first_block[mine][reader] + np.arange(int(nblk.sum())) - np.repeat(np.cumsum(nblk) - nblk, nblk)
    offset = np.maximum(0, readers.block_starts[block] - readers.start[mine][reader])
    when = np.empty(len(block), dtype=np.int64)  # each step's place in the walk
    when[np.lexsort((block, reader, offset))] = np.arange(len(block))
    moves = np.flatnonzero((block == readers.first_block[mine][reader]) | ~blocks.same_as_before[block])
    last = np.append(moves[1:], len(block)) - 1  # the last step before the reader's next move
    width = int(blocks.count.max()) + 1  # a step's time: its place in the walk, then its shard's in the block
    in_cache = np.zeros(len(shards), dtype=bool)
    stamp = np.zeros(len(shards), dtype=np.int64)  # when each was last used: least recently used first
    busy = np.zeros(len(shards), dtype=np.int64)  # readers holding each open
    holding: dict[int, np.ndarray] = {}
    until: dict[int, int] = {}  # the time a reader last used what it holds
    used = peak = downloads = downloaded = 0
    too_small = False
    for m, end in zip(*(a[np.argsort(when[moves])].tolist() for a in (moves, last)), strict=True):
        i, b = int(reader[m]), int(block[m])
        ids = local[bounds[b] - e0 : bounds[b + 1] - e0]
        if i in holding:
            old = holding[i]
            busy[old] -= 1
            stamp[old] = np.maximum(stamp[old], until[i] + np.arange(len(old)))
        busy[ids] += 1
        holding[i] = ids
        until[i] = int(when[end]) * width
        new = ids[~in_cache[ids]]
        in_cache[new] = True
        stamp[ids] = int(when[m]) * width + np.arange(len(ids))
        used += int(cached[new].sum())
        downloads += len(new)
        downloaded += int(sizes[new].sum())
        if used > limit:  # evict the least recently used shards that no reader holds
            idle = np.flatnonzero(in_cache & (busy == 0))
            idle = idle[np.argsort(stamp[idle])]
            freed = np.cumsum(cached[idle])
            gone = idle[: int(np.searchsorted(freed, used - limit)) + 1]
            in_cache[gone] = False
            used -= int(cached[gone].sum())
        too_small |= used > limit
        peak = max(peak, used)
    return downloads, downloaded, peak, too_small


def quality(order: EpochOrder, table: Slices, readers: Readers, setup: Setup, rows: np.ndarray) -> dict:
    """Distinct shards per batch: measured on a sample of batches, and for a perfect shuffle."""
    n = max(1, setup.batch)
    per_reader = readers.records // n  # whole batches of each reader
    first = np.concatenate([[0], np.cumsum(per_reader)])  # batch numbers over all readers
    total = int(first[-1])
    if total == 0:
        return {}
    picks = np.unique(np.linspace(0, total - 1, min(setup.sample_batches, total)).round().astype(np.int64))
    i = np.searchsorted(first, picks, side="right") - 1
    positions = (readers.start[i] + (picks - first[i]) * n)[:, None] + np.arange(n)  # a batch per row
    flat = positions.reshape(-1)
    block = np.searchsorted(order.starts, flat, side="right") - 1
    shard = np.empty_like(flat)
    by_block = np.argsort(block, kind="stable")
    cuts = np.flatnonzero(np.diff(block[by_block])) + 1
    for part in np.split(by_block, cuts):  # each block the sample reads, once
        b = int(block[part[0]])
        shard[part] = _owner(order, table, b)[flat[part] - order.starts[b]]
    batches = np.sort(shard.reshape(positions.shape), axis=1)
    change = np.ones(batches.shape, dtype=bool)
    change[:, 1:] = batches[:, 1:] != batches[:, :-1]
    distinct = change.sum(axis=1)
    runs = np.diff(np.append(np.flatnonzero(change.reshape(-1)), batches.size))  # lengths of runs of one shard
    largest = np.maximum.reduceat(runs, np.cumsum(distinct) - distinct) / n
    p = rows[rows > 0] / rows.sum()
    return {
        "batches": len(distinct),
        "distinct": float(np.mean(distinct)),
        "largest_share": float(np.mean(largest)),
        "ideal": float(np.sum(1 - (1 - p) ** n)),
        "shards": int((rows > 0).sum()),
    }


def _owner(order: EpochOrder, table: Slices, b: int) -> np.ndarray:
    """The shard of each position of block ``b``, in yield order."""
    a, z = table.bounds[b], table.bounds[b + 1]
    shard_of_row = np.repeat(table.shard[a:z], table.stop[a:z] - table.start[a:z])
    perm = order.permutation(b)
    return shard_of_row if perm is None else shard_of_row[perm]
