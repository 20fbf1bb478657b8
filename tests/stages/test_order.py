"""Partitioning and shuffling invariants, over random shard sizes and topologies."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from conftest import make_shards
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tidal
from tidal.order import EpochOrder, consumer_range, cut_intervals, share, share_sizes, taken, union
from tidal.testing import assert_partition_exact

sizes_st = st.lists(st.integers(0, 60), min_size=1, max_size=12)


@given(sizes=sizes_st, seed=st.none() | st.integers(0, 2**32), epoch=st.integers(0, 5),
       block=st.integers(1, 50), per_block=st.integers(1, 6))  # fmt: skip
def test_an_epoch_visits_every_row_of_every_shard_once(sizes, seed, epoch, block, per_block) -> None:
    order = EpochOrder(sizes, seed=seed, epoch=epoch, block_size=block, shards_per_block=per_block)
    assert order.total == sum(sizes)
    seen: Counter = Counter()
    for b in range(order.blocks):
        slices = order.slices(b)
        n = int(order.starts[b + 1] - order.starts[b])
        assert n == sum(z - a for _, a, z in slices) > 0
        perm = order.permutation(b)
        assert perm is None if seed is None else sorted(perm.tolist()) == list(range(n))
        for shard, a, z in slices:
            seen.update((shard, r) for r in range(a, z))
    assert seen == Counter((s, r) for s, n in enumerate(sizes) for r in range(n))
    if seed is None:  # unshuffled: the files in order, front to back
        flat = [(s, r) for b in range(order.blocks) for s, a, z in order.slices(b) for r in range(a, z)]
        assert flat == sorted(flat)
    else:
        longest = max((int(order.starts[b + 1] - order.starts[b]) for b in range(order.blocks)), default=0)
        assert longest <= block + len(sizes)


@given(sizes=sizes_st, data=st.data(), seed=st.none() | st.integers(0, 2**32), block=st.integers(1, 50),
       per_block=st.integers(1, 6), block_bytes=st.integers(1, 5_000))  # fmt: skip
def test_a_block_holds_at_most_block_bytes_of_its_shards(sizes, data, seed, block, per_block, block_bytes) -> None:
    """Counted pro rata from each shard's bytes, a block holds at most ``block_bytes`` (and the
    rounding of equal slices: a record of each of its shards); a record larger than the bound
    is a block of one record per shard. Every row is still read once."""
    nbytes = data.draw(st.lists(st.integers(0, 10_000), min_size=len(sizes), max_size=len(sizes)))
    order = EpochOrder(sizes, seed=seed, epoch=0, block_size=block, shards_per_block=per_block,
                       bytes=nbytes, block_bytes=block_bytes)  # fmt: skip
    seen: Counter = Counter()
    for b in range(order.blocks):
        slices = order.slices(b)
        weight = sum(nbytes[s] * (z - a) / sizes[s] for s, a, z in slices)
        assert weight <= block_bytes + sum(nbytes[s] / sizes[s] for s, _, _ in slices) + 1e-6
        for s, a, z in slices:
            seen.update((s, r) for r in range(a, z))
    assert seen == Counter((s, r) for s, n in enumerate(sizes) for r in range(n))
    plain = EpochOrder(sizes, seed=seed, epoch=0, block_size=block, shards_per_block=per_block)
    if all(w * block <= n * block_bytes for w, n in zip(nbytes, sizes, strict=True)):  # records small on average
        assert [order.slices(b) for b in range(order.blocks)] == [plain.slices(b) for b in range(plain.blocks)]


def test_a_shuffle_block_of_large_documents_is_bounded_in_bytes_and_reads_each_once(tmp_path: Path) -> None:
    """40 files of 30 documents of ~20 KB: with ``block_bytes`` of 200 KB a block holds ~10 of
    them (not ``block_size``'s 16,384, all 1,200); every document is read once per epoch, a
    resume mid-epoch continues exactly, and batches still mix several files."""
    from conftest import write_jsonl

    root = tmp_path / "books"
    root.mkdir()
    for k in range(40):
        write_jsonl(
            root / f"part-{k:02d}.jsonl", [{"id": k * 30 + i, "text": "x" * (20_000 + 97 * i)} for i in range(30)]
        )
    plain = tidal.Dataset(root).shuffle(seed=3)
    small = tidal.Dataset(root).shuffle(seed=3, block_bytes="200KB")
    (plan,) = small.sources().values()
    order = EpochOrder(plan.shards.rows, seed=3, epoch=0, block_size=plan.block_size,
                       shards_per_block=plan.shards_per_block, bytes=plan.shards.bytes, block_bytes=plan.block_bytes)  # fmt: skip
    assert plan.block_bytes == 200_000 and order.blocks > 100
    assert int(np.diff(order.starts).max()) <= 200_000 // 20_000 + plan.shards_per_block
    ids = [r["id"] for r in small]
    assert sorted(ids) == list(range(1200)) and ids != [r["id"] for r in plain]
    assert np.mean([len({i // 30 for i in ids[j : j + 8]}) for j in range(0, 1200, 8)]) >= 4  # still mixed
    it = iter(small)
    head = [next(it)["id"] for _ in range(517)]
    state = small.state_dict()
    small.load_state_dict(state)
    assert head + [r["id"] for r in small] == ids
    # the order changed, so does the fingerprint: a state of the unbounded order is refused
    assert small.fingerprint() != plain.fingerprint()
    with pytest.raises(tidal.StateError):
        list(plain.iterator(state=state))


def test_block_bytes_that_never_binds_keeps_the_order_and_fingerprint(tmp_path: Path) -> None:
    """Records far below ``block_bytes / block_size`` on average: the order, and so the fingerprint
    a saved state carries, is the one tidal gave before blocks were bounded in bytes."""
    root = make_shards(tmp_path / "data", [300] * 12)
    a = tidal.Dataset(root).shuffle(seed=5, block_size=500)
    b = tidal.Dataset(root).shuffle(seed=5, block_size=500, block_bytes=10**12)
    assert a.fingerprint() == b.fingerprint()
    assert [r["id"] for r in a] == [r["id"] for r in b]
    for bad in (0, -1, 1.5, True, "lots"):
        with pytest.raises(tidal.ArgumentError, match=r"block_bytes|not a size"):
            tidal.Dataset(root).shuffle(seed=5, block_bytes=bad)


@given(sizes=sizes_st, seed=st.integers(0, 1000), epoch=st.integers(0, 3))
def test_the_order_is_a_pure_function_of_seed_epoch_and_shards(sizes, seed, epoch) -> None:
    a = EpochOrder(sizes, seed=seed, epoch=epoch, block_size=7, shards_per_block=2)
    b = EpochOrder(list(sizes), seed=seed, epoch=epoch, block_size=7, shards_per_block=2)
    assert [a.slices(i) for i in range(a.blocks)] == [b.slices(i) for i in range(b.blocks)]
    assert all(np.array_equal(a.permutation(i), b.permutation(i)) for i in range(a.blocks))


@given(total=st.integers(0, 500), consumers=st.integers(1, 24), drop=st.booleans())
def test_consumer_ranges_tile_the_epoch(total, consumers, drop) -> None:
    ranges = [consumer_range(total, consumers, c, drop_remainder=drop) for c in range(consumers)]
    assert ranges[0][0] == 0
    assert all(ranges[i][1] == ranges[i + 1][0] for i in range(consumers - 1))
    lengths = {b - a for a, b in ranges}
    if drop:
        assert lengths == {total // consumers} and total - ranges[-1][1] == total % consumers
    else:
        assert ranges[-1][1] == total and max(lengths) - min(lengths) <= 1


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(0, 40), min_size=1, max_size=8), world=st.integers(1, 3), workers=st.integers(1, 3),
       seed=st.none() | st.integers(0, 100), epochs=st.integers(1, 2), batch=st.none() | st.integers(1, 5))  # fmt: skip
def test_readers_split_each_epoch_exactly_once(tmp_path_factory, sizes, world, workers, seed, epochs, batch) -> None:
    if sum(sizes) == 0:
        sizes = [*sizes, 1]
    root = make_shards(tmp_path_factory.mktemp("d") / "data", sizes)
    ds = tidal.Dataset(root)
    if seed is not None:
        ds = ds.shuffle(seed, block_size=9, shards_per_block=2)
    ds = ds.repeat(epochs)
    if batch is None:
        assert_partition_exact(ds, world, workers, key=lambda r: r["id"])  # each id once per epoch
    else:  # equal batch counts per rank; records of kept batches never repeat within an epoch
        from tidal.testing import read_partitioned

        parts = read_partitioned(ds.batch(batch), world, workers)
        counts = {sum(len(items) for items in per_rank) for per_rank in parts}
        assert len(counts) == 1
        ids = [i for per_rank in parts for items in per_rank for b in items for i in b["id"].tolist()]
        assert max(Counter(ids).values(), default=0) <= epochs


def test_shuffle_mixes_shards_within_batches(tmp_path: Path) -> None:
    """Metric: for 40 shards of 250 consecutive ids, the mean number of distinct shards among
    the 32 records of a batch. Unshuffled it is ~1; a block shuffle over 8 shards at a time
    must reach at least 6 (the expectation for 32 draws from 8 shards is ~7.9)."""
    root = make_shards(tmp_path / "data", [250] * 40, kinds=("parquet", "jsonl"))
    ds = tidal.Dataset(root)

    def mean_distinct_shards(d: tidal.Dataset) -> float:
        batches = list(d.batch(32))
        return float(np.mean([len(set((b["id"] // 250).tolist())) for b in batches]))

    assert mean_distinct_shards(ds) < 1.2
    shuffled = ds.shuffle(seed=7, block_size=2000, shards_per_block=8)
    assert mean_distinct_shards(shuffled) >= 6
    first = [r["id"] for r in shuffled]
    assert sorted(first) == list(range(10_000))
    second_epoch = [r["id"] for r in shuffled.repeat(2)][10_000:]
    assert sorted(second_epoch) == list(range(10_000)) and second_epoch != first
    # positions are spread: adjacent records are rarely neighbours in the source
    adjacent = np.abs(np.diff(first)) == 1
    assert adjacent.mean() < 0.01


intervals_st = st.lists(
    st.tuples(st.integers(0, 120), st.integers(0, 40)).map(lambda t: (t[0], t[0] + t[1])), max_size=6
)


@given(total=st.integers(0, 120), done=intervals_st, consumers=st.integers(1, 12), drop=st.booleans(), data=st.data())
def test_what_readers_used_is_taken_at_once_as_share_by_share(total, done, consumers, drop, data) -> None:
    """taken() and share_sizes() give, for all readers at once, what share() gives one by one."""
    done = [(min(a, total), min(b, total)) for a, b in done]
    used = data.draw(st.lists(st.integers(0, 10**12) | st.integers(0, 15), min_size=consumers, max_size=consumers))
    shares = [share(total, done, consumers, c, drop_remainder=drop) for c in range(consumers)]
    want = union(done + [iv for part, n in zip(shares, used, strict=True) for iv in cut_intervals(part, 0, n)])
    assert taken(total, done, np.array(used), drop_remainder=drop) == want
    sizes = share_sizes(total, done, consumers, drop_remainder=drop)
    assert sizes.tolist() == [sum(b - a for a, b in part) for part in shares]
