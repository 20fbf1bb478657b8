"""``tidal plan``'s simulation, computed with arrays, against a brute force that walks every
reader, block and shard with sets, as the reading stage does (small inputs, many shapes)."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidal.order import EpochOrder, share
from tidal.simulate import Setup, simulate
from tidal.storage.eviction import footprint


def brute_force(setup: Setup) -> dict:
    """Every figure of :func:`simulate`, one reader, block and shard at a time."""
    rows = np.asarray(setup.rows, dtype=np.int64)
    order = EpochOrder(
        rows, seed=setup.seed, epoch=setup.epoch, block_size=setup.block_size, shards_per_block=setup.shards_per_block
    )
    slices = [order.slices(b) for b in range(order.blocks)]
    shards_of = [[s for s, _, _ in sl] for sl in slices]
    sizes = [int(b) for b in setup.bytes]
    cached = [footprint(b) for b in sizes]
    readers = []
    for rank in range(setup.ranks):
        for worker in range(setup.workers):
            consumer = rank * setup.workers + worker
            intervals = share(order.total, [], setup.ranks * setup.workers, consumer, drop_remainder=setup.finite)
            blocks: list[tuple[int, int]] = []
            at = 0
            for a, z in intervals:
                for b in range(order.block_at(a), order.block_at(z - 1) + 1):
                    if not blocks or blocks[-1][0] != b:
                        blocks.append((b, at + max(0, int(order.starts[b]) - a)))
                at += z - a
            held: set[int] = set()
            most, most_shards, last, after = 0, 0, -1, set[int]()
            for b, _ in blocks:  # as BlockReader._held_per_block
                now = after if b == last + 1 and last >= 0 else set(shards_of[b])
                after = set(shards_of[b + 1]) if b + 1 < order.blocks else set()
                held = (held & (now | after)) | now
                last = b
                total = sum(cached[i] for i in held)
                if total > most:
                    most, most_shards = total, len(held)
            readers.append(
                {
                    "rank": rank,
                    "worker": worker,
                    "intervals": intervals,
                    "records": sum(z - a for a, z in intervals),
                    "blocks": blocks,
                    "shards": {s for b, _ in blocks for s in shards_of[b]},
                    "held_bytes": most,
                    "held_shards": most_shards,
                    "first_block_bytes": sum(sizes[s] for s in shards_of[blocks[0][0]]) if blocks else 0,
                    "loaded": sum(z - a for b, _ in blocks for _, a, z in slices[b]),
                }
            )
    nodes = []
    limit = setup.cache_limit if setup.cache_limit is not None else float("inf")
    for n in range(setup.nodes):
        ranks = list(range(n * setup.ranks_per_node, min(setup.ranks, (n + 1) * setup.ranks_per_node)))
        mine = [r for r in readers if r["rank"] in ranks]
        touched = set().union(*(r["shards"] for r in mine))
        first = set().union(*(set(shards_of[r["blocks"][0][0]]) for r in mine if r["blocks"]))
        events = sorted((offset, i, b) for i, r in enumerate(mine) for b, offset in r["blocks"])
        lru: OrderedDict[int, None] = OrderedDict()
        holding: dict[int, set[int]] = {}
        used = peak = downloads = downloaded = 0
        too_small = False
        for _, i, b in events:
            holding[i] = set(shards_of[b])
            for s in shards_of[b]:
                if s in lru:
                    lru.move_to_end(s)
                    continue
                lru[s] = None
                used += cached[s]
                downloads += 1
                downloaded += sizes[s]
            if used > limit:
                busy = set().union(*holding.values())
                for s in [s for s in lru if s not in busy]:
                    if used <= limit:
                        break
                    del lru[s]
                    used -= cached[s]
            too_small |= used > limit
            peak = max(peak, used)
        nodes.append(
            {
                "ranks": ranks,
                "touched": len(touched),
                "touched_bytes": sum(sizes[s] for s in touched),
                "downloads": downloads,
                "downloaded_bytes": downloaded,
                "peak_cache": peak,
                "first_bytes": sum(sizes[s] for s in first),
                "too_small": too_small,
            }
        )
    return {
        "blocks": order.blocks,
        "readers": readers,
        "nodes": nodes,
        "largest_block_bytes": max((sum(sizes[s] for s in sh) for sh in shards_of), default=0),
        "quality": _quality(order, slices, readers, setup, rows),
    }


def _quality(order: EpochOrder, slices: list, readers: list[dict], setup: Setup, rows: np.ndarray) -> dict:
    n = max(1, setup.batch)
    per_reader = [r["records"] // n for r in readers]
    first = np.concatenate([[0], np.cumsum(per_reader)])
    total = int(first[-1])
    if total == 0:
        return {}
    picks = np.linspace(0, total - 1, min(setup.sample_batches, total)).round().astype(np.int64)
    distinct, largest = [], []
    of_row = [[s for s, a, z in slices[b] for _ in range(a, z)] for b in range(order.blocks)]
    for j in sorted(set(picks.tolist())):
        i = int(np.searchsorted(first, j, side="right")) - 1
        (start, _), k = readers[i]["intervals"][0], j - int(first[i])
        shards = []
        for position in range(start + k * n, start + (k + 1) * n):
            b = order.block_at(position)
            perm = order.permutation(b)
            at = position - int(order.starts[b])
            shards.append(of_row[b][at if perm is None else int(perm[at])])
        counts = np.unique(shards, return_counts=True)[1]
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


def assert_matches_brute_force(setup: Setup) -> None:
    sim, want = simulate(setup), brute_force(setup)
    assert sim.blocks == want["blocks"]
    got = [
        {
            "rank": r.rank,
            "worker": r.worker,
            "intervals": r.intervals,
            "records": r.records,
            "blocks": r.blocks,
            "shards": r.shards,
            "held_bytes": r.held_bytes,
            "held_shards": r.held_shards,
            "first_block_bytes": r.first_block_bytes,
            "loaded": r.loaded,
        }
        for r in sim.readers
    ]
    assert got == want["readers"]
    assert [vars(n) for n in sim.nodes] == want["nodes"]
    assert sim.largest_block_bytes == want["largest_block_bytes"]
    assert sim.quality == want["quality"]


shapes = st.fixed_dictionaries(
    {
        "rows": st.lists(st.integers(0, 40), min_size=1, max_size=14),
        "seed": st.none() | st.integers(0, 1000),
        "epoch": st.integers(0, 3),
        "block_size": st.integers(1, 60),
        "shards_per_block": st.integers(1, 5),
        "ranks": st.integers(1, 6),
        "workers": st.integers(1, 3),
        "ranks_per_node": st.integers(1, 4),
        "finite": st.booleans(),
        "batch": st.integers(1, 6),
        "sample_batches": st.integers(1, 50),
    }
)


@settings(max_examples=200, deadline=None)
@given(shape=shapes, data=st.data())
def test_the_simulation_matches_a_brute_force_walk_of_every_reader(shape: dict, data: st.DataObject) -> None:
    n = len(shape["rows"])
    sizes = data.draw(st.lists(st.integers(0, 20_000), min_size=n, max_size=n), label="bytes")
    whole = sum(footprint(b) for b in sizes)
    # unbounded, roomy, and small enough that shards are fetched again or the cache is too small
    limit = data.draw(st.none() | st.integers(0, whole + 1), label="cache_limit")
    assert_matches_brute_force(Setup(bytes=sizes, cache_limit=limit, **shape))


def test_a_small_cache_fetches_shards_again_as_the_brute_force_does() -> None:
    rows, sizes = [30, 7, 0, 55, 12, 1, 40, 3, 22, 18], [9000, 100, 0, 20_000, 4000, 50, 12_000, 700, 5000, 8000]
    for limit in (1, 20_000, 40_000, 80_000):
        setup = Setup(
            rows=rows, bytes=sizes, seed=4, block_size=16, shards_per_block=2, ranks=4, workers=2,
            ranks_per_node=2, batch=3, cache_limit=limit,
        )  # fmt: skip
        assert_matches_brute_force(setup)
    tight = simulate(Setup(rows=rows, bytes=sizes, seed=4, block_size=16, shards_per_block=2, ranks=4, workers=2,
                           ranks_per_node=4, cache_limit=40_000))  # fmt: skip
    assert tight.nodes[0].downloads > tight.nodes[0].touched  # the case the brute force checked above is exercised


def test_an_empty_epoch_and_more_readers_than_records() -> None:
    assert_matches_brute_force(Setup(rows=[0, 0], bytes=[10, 10], seed=1, block_size=4, shards_per_block=2, ranks=3))
    sim = simulate(Setup(rows=[2, 1], bytes=[10, 10], seed=None, block_size=4, shards_per_block=2, ranks=4, workers=2))
    assert sim.readers.records.tolist() == [0] * 8 and sim.quality == {}
    assert all(n.touched == 0 for n in sim.nodes)


@pytest.mark.parametrize("seed", [0, 1, 2, 36, 89, 99, 170])  # 36 to 170: the recency of held shards decides
def test_readers_holding_large_shards_over_many_blocks_share_a_small_cache_as_the_brute_force_does(seed: int) -> None:
    """Blocks of a group of large shards read the same shards: a reader going through them holds
    them all along, and they are the most recently used when it lets them go."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(4, 20))
    sizes = rng.integers(1, 5_000_000, n).tolist()
    setup = Setup(
        rows=rng.integers(0, 3000, n).tolist(), bytes=sizes, seed=int(rng.integers(0, 99)),
        block_size=int(rng.integers(50, 300)), shards_per_block=int(rng.integers(1, 4)), ranks=int(rng.integers(1, 8)),
        workers=int(rng.integers(1, 4)), ranks_per_node=int(rng.integers(2, 6)), batch=5,
        cache_limit=int(rng.integers(sum(sizes) // 8, sum(sizes) // 2)), sample_batches=20,
    )  # fmt: skip
    assert_matches_brute_force(setup)


@settings(max_examples=200, deadline=None)
@given(shape=shapes, data=st.data())
def test_what_a_reader_holds_in_this_epoch_is_within_what_tidal_checks_for_every_epoch(
    shape: dict, data: st.DataObject
) -> None:
    """``tidal plan``'s figure for one epoch never exceeds the bound it and the readers check."""
    n = len(shape["rows"])
    sizes = data.draw(st.lists(st.integers(0, 20_000), min_size=n, max_size=n), label="bytes")
    block_bytes = data.draw(st.none() | st.integers(1, 40_000), label="block_bytes")
    sim = simulate(Setup(bytes=sizes, block_bytes=block_bytes, **shape))
    assert sim.held_per_reader <= sim.room.per_reader
    assert sim.cache_per_node == min(sim.room.whole, sim.setup.readers_per_node * sim.room.per_reader)
