"""Prefetching within the cache: never evicting what the reader reads sooner, and the room a reader needs."""

from __future__ import annotations

import itertools
import random
import shutil
import time
from pathlib import Path

import pytest
from conftest import make_shards, write_parquet
from fault_proxy import FaultProxy
from s3_server import S3Server

import tidal
from tidal.storage import Retry, Storage
from tidal.storage.cache import Cache
from tidal.storage.eviction import footprint

pytest_plugins = ["s3_fixtures"]

FAST = Retry(attempts=8, backoff=0.02, max_backoff=0.2)


def storage(s3: S3Server, cache: Path, **kw: object) -> Storage:
    settings: dict = {"timeout": 5.0, "retry": FAST, "cache_dir": str(cache), **kw}
    return Storage(options=s3.options(), **settings)


def fixed(cache: Path) -> int:
    """What the cache directory takes besides its shards: directories, ledger, index."""
    return Cache(cache, 10**12).fixed()


@pytest.mark.parametrize("seed", [None, 7], ids=["in-order", "shuffled"])
def test_a_lone_reader_with_a_cache_of_three_shards_downloads_each_shard_once_per_epoch(
    s3: S3Server, bucket: str, tmp_path: Path, seed: int | None
) -> None:
    data = make_shards(tmp_path / "data", [400] * 16, kinds=("jsonl",))
    url = s3.upload(data, bucket, "web")
    cache = tmp_path / "cache"
    ds = tidal.Dataset(url, storage=storage(s3, cache))  # the index, built once
    sizes = [s.bytes for s in ds.shards]
    total = sum(sizes)
    limit = fixed(cache) + 3 * footprint(max(sizes))  # three shards and their metadata
    shutil.rmtree(cache / "shards")
    ds = tidal.Dataset(url, storage=storage(s3, cache, cache_limit=limit))  # the default prefetch of 8
    if seed is not None:
        ds = ds.shuffle(seed=seed, block_size=400, shards_per_block=2)  # two shards held at once
    it = ds.repeat(2).iterator()
    got = [r["id"] for r in it]
    local = tidal.Dataset(data)
    if seed is not None:
        local = local.shuffle(seed=seed, block_size=400, shards_per_block=2)
    assert got == [r["id"] for r in local.repeat(2)]
    stats = it.stats()
    ratio = stats["bytes_downloaded"] / (2 * total)
    assert stats["bytes_downloaded"] <= 2 * total, f"downloaded {ratio:.2f}x the data per epoch"
    assert stats["evictions"] > 0  # the data did not fit: the bound held under pressure


def test_a_cache_too_small_for_one_shard_is_an_error_at_once_naming_the_limit_and_the_need(
    s3: S3Server, bucket: str, tmp_path: Path
) -> None:
    data = make_shards(tmp_path / "data", [2000] * 4, kinds=("jsonl",))
    url = s3.upload(data, bucket, "web")
    cache = tmp_path / "cache"
    ds = tidal.Dataset(url, storage=storage(s3, cache))
    largest = max(s.bytes for s in ds.shards)
    shutil.rmtree(cache / "shards")
    for limit, shuffled, held in [(largest // 2, False, 1), (largest + 10_000, False, 1), (3 * largest // 2, True, 2)]:
        small = tidal.Dataset(url, storage=storage(s3, cache, cache_limit=limit))
        if shuffled:
            small = small.shuffle(seed=1, block_size=1000, shards_per_block=2)
        t0 = time.monotonic()
        with pytest.raises(tidal.StorageError) as err:
            next(iter(small))
        assert time.monotonic() - t0 < 5  # at once: no waiting for room that can never come
        need = held * footprint(largest) + fixed(cache)
        message = str(err.value)
        assert f"the cache_limit of {limit:,} bytes is too small" in message
        assert f"holds up to {held} shard" in message and f"at least {need:,} bytes" in message, message
        assert f"the largest shard is {largest:,} bytes" in message
    assert not list(cache.glob("shards/*.shard"))  # nothing was downloaded in vain
    # the bound it names is enough
    ok = tidal.Dataset(url, storage=storage(s3, cache, cache_limit=need)).shuffle(seed=1, block_size=1000)
    assert sorted(r["id"] for r in ok.shuffle(seed=1, block_size=1000, shards_per_block=2)) == list(range(8000))


def test_a_parquet_shard_larger_than_the_cache_is_read_in_place_by_ranges(
    s3: S3Server, bucket: str, tmp_path: Path
) -> None:
    data = make_shards(tmp_path / "data", [200, 300, 250], kinds=("jsonl",))
    recs = [{"id": 750 + i, "text": random.Random(i).randbytes(600).hex()} for i in range(400)]  # ~500 KB
    write_parquet(data / "part-003.parquet", recs, row_group_size=50)
    url = s3.upload(data, bucket, "web")
    cache = tmp_path / "cache"
    ds = tidal.Dataset(url, storage=storage(s3, cache))
    big = ds.shards[3].bytes
    limit = fixed(cache) + 2 * footprint(max(s.bytes for s in ds.shards[:3]))
    assert big > 2 * limit
    shutil.rmtree(cache / "shards")
    shuffle = {"seed": 3, "block_size": 200, "shards_per_block": 2}  # two shards held at once
    it = tidal.Dataset(url, storage=storage(s3, cache, cache_limit=limit)).shuffle(**shuffle).iterator()
    got = [r["id"] for r in it]
    assert got == [r["id"] for r in tidal.Dataset(data).shuffle(**shuffle)]
    assert it.stats()["bytes_downloaded"] >= big  # every row group came, by ranges...
    assert len(list(cache.glob("shards/*.shard"))) <= 2  # ...and never into the cache


def test_the_shards_a_reader_needs_now_are_fetched_before_those_it_reads_later(
    s3: S3Server, bucket: str, tmp_path: Path
) -> None:
    data = make_shards(tmp_path / "data", [400] * 12, kinds=("jsonl",))
    url = s3.upload(data, bucket, "web")
    cache = tmp_path / "cache"
    tidal.Dataset(url, storage=storage(s3, cache))  # the index, straight from the server
    shutil.rmtree(cache / "shards")
    fetched: list[str] = []  # the shard of each GET, in the order the store got them

    def seen(method: str, target: str, headers: list[tuple[str, str]]) -> bool:
        if method == "GET" and "/web/part-" in target:
            fetched.append(target.split("/web/")[1].split("?")[0])
        return False  # counted here, never broken

    shuffle = {"seed": 5, "block_size": 800, "shards_per_block": 2}  # two whole shards a block
    with FaultProxy(("127.0.0.1", s3.port), every=0, only=seen) as proxy:
        # one prefetch thread: whatever it takes first is what the reader's first block waits behind
        settings = Storage(options=s3.options(proxy.endpoint), cache_dir=str(cache), parallel=1, retry=FAST)
        it = tidal.Dataset(url, storage=settings).shuffle(**shuffle).iterator()
        block = {f"part-{r['id'] // 400:03d}.jsonl" for r in itertools.islice(it, 800)}
        it.close()
    assert len(block) == 2
    first = list(dict.fromkeys(fetched))[:2]  # the first two shards the store was asked for
    assert set(first) == block, f"the first block reads {sorted(block)}, the store was asked for {first} first"


@pytest.mark.slow
def test_dataloader_workers_that_would_leave_one_another_no_room_are_told_at_once(
    s3: S3Server, bucket: str, tmp_path: Path
) -> None:
    pytest.importorskip("torch")
    data = make_shards(tmp_path / "data", [2000] * 4, kinds=("jsonl",))
    url = s3.upload(data, bucket, "web")
    cache = tmp_path / "cache"
    ds = tidal.Dataset(url, storage=storage(s3, cache))
    shard = footprint(max(s.bytes for s in ds.shards))
    shutil.rmtree(cache / "shards")
    shuffle = {"seed": 1, "block_size": 1000, "shards_per_block": 2}
    for limit, ok in [(fixed(cache) + 3 * shard, False), (fixed(cache) + 4 * shard, True)]:
        small = tidal.Dataset(url, storage=storage(s3, cache, cache_limit=limit)).shuffle(**shuffle).batch(100)
        loader = tidal.DataLoader(small, num_workers=2)
        if ok:  # two shards each, both at once: a worker ahead keeps its shards while it waits for its turn
            assert sorted(int(i) for b in loader for i in b["id"]) == list(range(8000))
            continue
        with pytest.raises(tidal.StorageError, match="times the 2 DataLoader workers") as err:
            next(iter(loader))
        assert f"at least {fixed(cache) + 4 * shard:,} bytes" in str(err.value)
