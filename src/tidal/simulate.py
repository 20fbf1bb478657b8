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
- **The cache a shuffle block needs.** What a reader holds open at once (the shards of its
  block, and those of the next block it already has open), at their size in the cache; tidal
  checks at the start of each epoch that ``cache_limit`` holds that times the DataLoader workers
  of a process, and refuses a smaller one before anything is downloaded.
- **Shuffle quality.** The number of distinct shards among the records of a batch, computed
  from the epoch's block permutations (which record of which shard each position is), for a
  sample of batches over all readers, beside what a perfect shuffle would give (records drawn
  at random from the whole epoch) and what reading in order gives.
- **Time to the first batch** at a given bandwidth: the node's readers all fetch their first
  block's shards at once, over the node's bandwidth. Request latency, decoding and the time a
  reader takes to start are left out: the network part only.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from tidal.order import EpochOrder, Intervals, share
from tidal.storage.cache import footprint
from tidal.world import World


@dataclass(frozen=True)
class Setup:
    """What is simulated: a source's shards and order, a topology, a cache, a bandwidth."""

    rows: Sequence[int]
    bytes: Sequence[int]
    seed: int | None
    block_size: int
    shards_per_block: int
    ranks: int = 1
    workers: int = 1
    ranks_per_node: int = 1
    finite: bool = True  # a finite epoch drops the remainder (fewer records than readers) so ranks stay even
    epoch: int = 0
    batch: int = 1
    cache_limit: int | None = None  # None: unbounded
    bandwidth: float = 1e9  # bytes per second, per node
    sample_batches: int = 2000  # batches whose shuffle quality is computed

    @property
    def nodes(self) -> int:
        return -(-self.ranks // self.ranks_per_node)


@dataclass
class Reader:
    """One reader's epoch: its positions, the blocks it reads, the shards it opens."""

    rank: int
    worker: int
    intervals: Intervals
    records: int
    blocks: list[tuple[int, int]]  # (block, offset in the reader's share where it starts reading it)
    shards: set[int]
    held_bytes: int  # the most it holds open at once, at its size in the cache
    held_shards: int
    first_block_bytes: int  # the shards of its first block, as downloaded
    loaded: int  # records of the blocks it loads (it reads a block whole, even to yield part of it)


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
    readers: list[Reader]
    nodes: list[Node]
    batches_per_rank: int
    largest_block_bytes: int  # the shards of the largest block, as downloaded
    quality: dict = field(default_factory=dict)

    @property
    def held_per_reader(self) -> int:
        return max((r.held_bytes for r in self.readers), default=0)

    @property
    def cache_per_rank(self) -> int:
        """The least ``cache_limit`` tidal accepts for one rank: a reader's most held, times its workers."""
        return self.held_per_reader * self.setup.workers

    @property
    def cache_per_node(self) -> int:
        return self.cache_per_rank * min(self.setup.ranks_per_node, self.setup.ranks)

    def first_batch_seconds(self) -> float:
        return max((n.first_bytes for n in self.nodes), default=0) / self.setup.bandwidth

    def worst_block_seconds(self) -> float:
        """The largest block's shards over the bandwidth: the most a resume waits on the network."""
        return self.largest_block_bytes / self.setup.bandwidth


def simulate(setup: Setup, progress: Callable[[int], None] | None = None) -> Simulation:
    """Simulate one epoch of ``setup``; ``progress`` is called once per reader done (for a bar)."""
    rows = np.asarray(setup.rows, dtype=np.int64)
    sizes = np.asarray(setup.bytes, dtype=np.int64)
    order = EpochOrder(
        rows.tolist(),
        seed=setup.seed,
        epoch=setup.epoch,
        block_size=setup.block_size,
        shards_per_block=setup.shards_per_block,
    )
    slices = [order.slices(b) for b in range(order.blocks)]
    block_shards = [[s for s, _, _ in sl] for sl in slices]
    cached = [footprint(int(b)) for b in sizes]
    readers = []
    for rank in range(setup.ranks):
        for worker in range(setup.workers):
            readers.append(
                _reader(
                    order, slices, block_shards, sizes, cached, setup, World(rank, setup.ranks, worker, setup.workers)
                )
            )
            if progress is not None:
                progress(1)
    nodes = [_node(setup, n, readers, block_shards, sizes, cached) for n in range(setup.nodes)]
    per_reader = min((r.records for r in readers), default=0)
    sim = Simulation(
        setup=setup,
        total_records=int(rows.sum()),
        total_bytes=int(sizes.sum()),
        blocks=order.blocks,
        readers=readers,
        nodes=nodes,
        batches_per_rank=setup.workers * (per_reader // max(1, setup.batch)),
        largest_block_bytes=max((sum(int(sizes[s]) for s in shards) for shards in block_shards), default=0),
    )
    sim.quality = quality(order, slices, readers, setup, rows)
    return sim


def _reader(
    order: EpochOrder,
    slices: list[list[tuple[int, int, int]]],
    block_shards: list[list[int]],
    sizes: np.ndarray,
    cached: list[int],
    setup: Setup,
    world: World,
) -> Reader:
    intervals = share(order.total, [], world.consumers, world.consumer, drop_remainder=setup.finite)
    blocks: list[tuple[int, int]] = []
    at = 0
    for a, z in intervals:
        if z <= a:
            continue
        for b in range(order.block_at(a), order.block_at(z - 1) + 1):
            if not blocks or blocks[-1][0] != b:
                blocks.append((b, at + max(0, int(order.starts[b]) - a)))
        at += z - a
    # what the reading stage holds open while it reads each block (as ReadIterator._held_per_block)
    held: set[int] = set()
    most, most_shards, last, after = 0, 0, -1, set[int]()
    for b, _ in blocks:
        now = after if b == last + 1 and last >= 0 else set(block_shards[b])
        after = set(block_shards[b + 1]) if b + 1 < order.blocks else set()
        held = (held & (now | after)) | now
        last = b
        total = sum(cached[i] for i in held)
        if total > most:
            most, most_shards = total, len(held)
    touched = {s for b, _ in blocks for s in block_shards[b]}
    first = sum(int(sizes[s]) for s in block_shards[blocks[0][0]]) if blocks else 0
    loaded = sum(b - a for b_, _ in blocks for _, a, b in slices[b_])
    return Reader(
        rank=world.rank,
        worker=world.worker,
        intervals=intervals,
        records=sum(z - a for a, z in intervals),
        blocks=blocks,
        shards=touched,
        held_bytes=most,
        held_shards=most_shards,
        first_block_bytes=first,
        loaded=loaded,
    )


def _node(
    setup: Setup, n: int, readers: list[Reader], block_shards: list[list[int]], sizes: np.ndarray, cached: list[int]
) -> Node:
    ranks = list(range(n * setup.ranks_per_node, min(setup.ranks, (n + 1) * setup.ranks_per_node)))
    mine = [r for r in readers if r.rank in ranks]
    touched = set().union(*(r.shards for r in mine)) if mine else set()
    first = set().union(*(set(block_shards[r.blocks[0][0]]) for r in mine if r.blocks)) if mine else set()
    # the readers side by side, each at the same number of records into its share
    events = sorted((offset, i, b) for i, r in enumerate(mine) for b, offset in r.blocks)
    limit = setup.cache_limit if setup.cache_limit is not None else float("inf")
    lru: OrderedDict[int, None] = OrderedDict()
    holding: dict[int, set[int]] = {}
    used = peak = downloads = downloaded = 0
    too_small = False
    for _, i, b in events:
        holding[i] = set(block_shards[b])
        for s in block_shards[b]:
            if s in lru:
                lru.move_to_end(s)
                continue
            lru[s] = None
            used += cached[s]
            downloads += 1
            downloaded += int(sizes[s])
        if used > limit:  # evict the least recently used shards that no reader holds
            busy = set().union(*holding.values())
            for s in [s for s in lru if s not in busy]:
                if used <= limit:
                    break
                del lru[s]
                used -= cached[s]
        too_small |= used > limit
        peak = max(peak, used)
    return Node(
        ranks=ranks,
        touched=len(touched),
        touched_bytes=sum(int(sizes[s]) for s in touched),
        downloads=downloads,
        downloaded_bytes=downloaded,
        peak_cache=peak,
        first_bytes=sum(int(sizes[s]) for s in first),
        too_small=too_small,
    )


def quality(
    order: EpochOrder, slices: list[list[tuple[int, int, int]]], readers: list[Reader], setup: Setup, rows: np.ndarray
) -> dict:
    """Distinct shards per batch: measured on a sample of batches, and for a perfect shuffle."""
    n = max(1, setup.batch)
    per_reader = np.array([r.records // n for r in readers], dtype=np.int64)  # whole batches of each reader
    first = np.concatenate([[0], np.cumsum(per_reader)])  # batch numbers over all readers
    total = int(first[-1])
    if total == 0:
        return {}
    picks = np.linspace(0, total - 1, min(setup.sample_batches, total)).round().astype(np.int64)
    owners: dict[int, np.ndarray] = {}
    distinct, largest = [], []
    for j in sorted(set(picks.tolist())):
        i = int(np.searchsorted(first, j, side="right")) - 1
        k = j - int(first[i])
        positions = _positions(readers[i].intervals, k * n, (k + 1) * n)
        shards = np.concatenate(
            [_owner(order, slices, owners, b)[p - int(order.starts[b])] for b, p in _by_block(order, positions)]
        )
        _, counts = np.unique(shards, return_counts=True)
        distinct.append(len(counts))
        largest.append(counts.max() / n)
    p = rows[rows > 0] / rows.sum()
    return {
        "batches": len(distinct),
        "distinct": float(np.mean(distinct)),
        "largest_share": float(np.mean(largest)),
        "ideal": float(np.sum(1 - (1 - p) ** n)),
        "shards": int((rows > 0).sum()),
    }


def _owner(
    order: EpochOrder, slices: list[list[tuple[int, int, int]]], cache: dict[int, np.ndarray], b: int
) -> np.ndarray:
    """The shard of each position of block ``b``, in yield order."""
    if b not in cache:
        if len(cache) > 64:
            cache.pop(next(iter(cache)))
        shard_of_row = np.repeat([s for s, _, _ in slices[b]], [z - a for _, a, z in slices[b]])
        perm = order.permutation(b)
        cache[b] = shard_of_row if perm is None else shard_of_row[perm]
    return cache[b]


def _positions(intervals: Intervals, lo: int, hi: int) -> np.ndarray:
    """Epoch positions ``lo .. hi`` of a reader's share (its intervals read one after another)."""
    out, at = [], 0
    for a, z in intervals:
        start, stop = max(lo - at, 0), min(hi - at, z - a)
        if stop > start:
            out.append(np.arange(a + start, a + stop))
        at += z - a
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def _by_block(order: EpochOrder, positions: np.ndarray) -> list[tuple[int, np.ndarray]]:
    blocks = np.searchsorted(order.starts, positions, side="right") - 1
    return [(int(b), positions[blocks == b]) for b in np.unique(blocks)]
