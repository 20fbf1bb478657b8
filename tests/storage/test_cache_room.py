"""The shard cache sized once for every epoch: the bound the readers check before their first
block and ``tidal plan`` prints (:mod:`tidal.storage.room`), enough for what they really hold."""

from __future__ import annotations

import itertools
import json
import re
import shutil
import tempfile
from collections import Counter
from pathlib import Path

import fsspec
import numpy as np
import pytest
from conftest import make_shards
from hypothesis import given, settings
from hypothesis import strategies as st
from s3_server import S3Server

import tidal
from tidal.cli import main
from tidal.order import EpochOrder, most_shards_per_block
from tidal.storage import Retry, Storage
from tidal.storage.eviction import footprint
from tidal.storage.prefetch import Prefetcher
from tidal.storage.room import room
from tidal.world import World

pytest_plugins = ["s3_fixtures"]

FAST = Retry(attempts=8, backoff=0.02, max_backoff=0.2)
# JSON lines of 40 to 900 records: an epoch whose order puts many small shards together holds more
# of them at once than epoch 0 does (on the code before the bound, epoch 1 asked for more than
# `tidal plan` said, and the run failed there)
ROWS = [300, 100, 900, 40, 40, 40, 300, 40, 100, 40, 40, 900, 900, 40, 100, 40, 900, 40, 40, 100, 40, 900, 40, 100]
SHUFFLE = {"seed": 0, "shards_per_block": 4, "block_size": 1600}


def storage(s3: S3Server, cache: Path, **kw: object) -> Storage:
    return Storage(options=s3.options(), cache_dir=str(cache), timeout=5.0, retry=FAST, **kw)  # type: ignore[arg-type]


def planned(s3: S3Server, url: str, cache: Path, workers: int, capsys: pytest.CaptureFixture[str]) -> int:
    """The cache_limit ``tidal plan`` says the run needs, in bytes."""
    options = [f"{k}={v}" for k, v in s3.options().items() if not isinstance(v, dict)]
    options += [f"client_kwargs.{k}={v}" for k, v in s3.options()["client_kwargs"].items()]
    args = ["plan", url, "--cache-dir", str(cache), "--workers", str(workers), "--shuffle", "0"]
    args += ["--block-size", "1600", "--shards-per-block", "4", *(x for o in options for x in ("--storage-option", o))]
    capsys.readouterr()
    assert main(args) == 0
    text = capsys.readouterr().out
    found = re.search(r"tidal needs a cache_limit of at least ([\d,]+) bytes", text)
    assert found is not None, text
    assert "up to 20 (shuffle(block_size=1,600) sets it, not shards_per_block=4" in text, text
    need = int(found.group(1).replace(",", ""))
    for limit, verdict in [(need - 1, "is too small: tidal refuses it before the first batch"), (need, ": enough")]:
        assert main([*args, "--cache-limit", str(limit)]) == 0
        assert verdict in capsys.readouterr().out
    return need


def run(ds: tidal.Dataset, workers: int) -> list[int]:
    """The ids of every record of the run, in the order the loop gets them."""
    if not workers:
        return [int(r["id"]) for r in ds]
    return [int(i) for b in tidal.DataLoader(ds.batch(40), num_workers=workers) for i in b["id"]]


def first(ds: tidal.Dataset, workers: int) -> object:
    """The first batch (or record) of the run."""
    if not workers:
        return next(iter(ds))
    return next(iter(tidal.DataLoader(ds.batch(40), num_workers=workers)))


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_the_cache_limit_tidal_plan_names_holds_every_epoch_and_a_byte_less_fails_before_any_batch(
    s3: S3Server, bucket: str, tmp_path: Path, workers: int, capsys: pytest.CaptureFixture[str]
) -> None:
    data = make_shards(tmp_path / "data", ROWS, kinds=("jsonl",))
    url = s3.upload(data, bucket, "web")
    cache = tmp_path / "cache"
    tidal.Dataset(url, storage=storage(s3, cache))  # the index, counted once into the cache
    shutil.rmtree(cache / "shards")
    need = planned(s3, url, cache, workers, capsys)

    short = tidal.Dataset(url, storage=storage(s3, cache, cache_limit=need - 1)).shuffle(**SHUFFLE).repeat(3)
    with pytest.raises(tidal.StorageError) as err:
        first(short, workers)
    message = str(err.value)
    assert f"the cache_limit of {need - 1:,} bytes is too small" in message
    assert f"cache_limit must be at least {need:,} bytes for every epoch" in message, message
    assert "shuffle(block_size=1,600) sets it, not shards_per_block=4" in message
    assert "hold fewer shards at once: a smaller shuffle(block_size=...)" in message
    assert not list(cache.glob("shards/*.shard"))  # refused before anything was downloaded

    ds = tidal.Dataset(url, storage=storage(s3, cache, cache_limit=need)).shuffle(**SHUFFLE).repeat(3)
    got = run(ds, workers)
    local = tidal.Dataset(data).shuffle(**SHUFFLE).repeat(3)
    if workers:
        assert Counter(got) == Counter(run(local, workers))
    else:
        assert got == run(local, 0)  # all 3 epochs, as read from local files
    assert Counter(got) == Counter({i: 3 for i in range(sum(ROWS))})


def test_the_argument_named_is_the_one_that_sets_how_many_shards_a_block_reads() -> None:
    rows = [40] * 20 + [900] * 4
    assert most_shards_per_block(rows, seed=0, block_size=1600, shards_per_block=4) == (21, "block_size")
    assert most_shards_per_block(rows, seed=0, block_size=100, shards_per_block=4) == (4, "shards_per_block")
    sizes = [100_000] * 24  # 2,500 bytes a record of the small shards: block_bytes cuts first
    assert most_shards_per_block(
        rows, seed=0, block_size=1600, shards_per_block=4, bytes=sizes, block_bytes=450_000
    ) == (
        5,
        "block_bytes",
    )
    assert most_shards_per_block(rows, seed=None, block_size=1600, shards_per_block=4) == (1, "")
    assert most_shards_per_block([0, 0], seed=1, block_size=10, shards_per_block=4) == (0, "")


@settings(max_examples=300, deadline=None)
@given(
    rows=st.lists(st.integers(0, 300), min_size=1, max_size=24),
    seed=st.integers(0, 10**6),
    block_size=st.integers(1, 900),
    shards_per_block=st.integers(1, 6),
    block_bytes=st.none() | st.integers(1, 60_000),
    data=st.data(),
)
def test_no_block_of_any_epoch_reads_more_shards_than_the_bound(
    rows: list[int], seed: int, block_size: int, shards_per_block: int, block_bytes: int | None, data: st.DataObject
) -> None:
    sizes = data.draw(st.lists(st.integers(1, 30_000), min_size=len(rows), max_size=len(rows)), label="bytes")
    order = {"seed": seed, "block_size": block_size, "shards_per_block": shards_per_block, "block_bytes": block_bytes}
    k, _ = most_shards_per_block(rows, bytes=sizes, **order)
    cached = [footprint(b) for b in sizes]
    bound = room(rows, sizes, cached, **order).per_reader
    for epoch in range(6):
        table = EpochOrder(rows, epoch=epoch, bytes=sizes, **order).table()
        for b in range(len(table.bounds) - 1):
            shards = set(table.shard[table.bounds[b] : table.bounds[b + 1]].tolist())
            assert len(shards) <= k
            assert sum(cached[s] for s in shards) <= bound


class Held:
    """The most each prefetcher (one per reader) had held at once, in the cache's bytes."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.peak: dict[int, int] = {}
        real = Prefetcher._hold

        def hold(pre: Prefetcher, held: dict, index: int, handle: object) -> str:
            path = real(pre, held, index, handle)  # type: ignore[arg-type]
            now = sum(footprint(int(pre._shards.bytes[i])) for i in pre._held)
            self.peak[id(pre)] = max(self.peak.get(id(pre), 0), now)
            return path

        monkeypatch.setattr(Prefetcher, "_hold", hold)


_names = itertools.count()


@settings(max_examples=40, deadline=None)
@given(
    rows=st.lists(st.integers(0, 60), min_size=2, max_size=12),
    seed=st.integers(0, 10**6),
    block_size=st.integers(1, 120),
    shards_per_block=st.integers(1, 4),
    workers=st.integers(1, 3),
    first_epoch=st.integers(0, 20),
)
def test_what_every_reader_holds_in_the_cache_over_its_epochs_is_within_the_bound(
    rows: list[int],
    seed: int,
    block_size: int,
    shards_per_block: int,
    workers: int,
    first_epoch: int,
) -> None:
    """Real readers of remote files (an in-memory filesystem, through the real shard cache and
    prefetcher), 3 epochs each from any epoch on: the most they held at once, as the prefetcher
    holds shards for them, is within what the check allows every one of them."""
    if sum(rows) < workers:
        return
    name = f"tidal-room-{next(_names)}"
    fs = fsspec.filesystem("memory")
    at = 0
    for k, n in enumerate(rows):
        lines = (json.dumps({"id": at + i, "text": "x" * (1 + (k * 37) % 90)}) for i in range(n))
        fs.pipe(f"/{name}/part-{k:03d}.jsonl", "".join(line + "\n" for line in lines).encode())
        at += n
    cache = Path(tempfile.mkdtemp())
    try:
        settings_ = Storage(cache_dir=str(cache), prefetch=2)
        shuffle = {"seed": seed, "block_size": block_size, "shards_per_block": shards_per_block}
        ds = tidal.Dataset(f"memory://{name}", storage=settings_).shuffle(**shuffle).repeat(3)
        plan = ds.sources()[""]
        cached = [footprint(int(b)) for b in plan.shards.bytes]
        bound = room(plan.shards.rows, plan.shards.bytes, cached, block_bytes=plan.block_bytes, **shuffle)
        got: list[int] = []
        with pytest.MonkeyPatch.context() as patch:
            held = Held(patch)
            for worker in range(workers):
                it = ds.iterator(World(0, 1, worker, workers), first_epoch=first_epoch)
                got += [int(r["id"]) for r in it]
                it.close()
        assert len(got) == 3 * (sum(rows) // workers) * workers
        assert held.peak and max(held.peak.values()) <= bound.per_reader
    finally:
        shutil.rmtree(cache, ignore_errors=True)
        fs.rm(f"/{name}", recursive=True)


def test_the_room_of_a_machine_is_its_readers_times_what_one_holds_but_never_more_than_every_shard() -> None:
    rows, sizes = [100] * 8, [50_000] * 8
    cached = [footprint(b) for b in sizes]
    one = room(rows, sizes, cached, seed=1, block_size=100, shards_per_block=2)
    assert (one.shards, one.by, one.per_reader) == (2, "shards_per_block", 2 * footprint(50_000))
    four = room(rows, sizes, cached, seed=1, block_size=100, shards_per_block=2, readers=4)
    assert four.needed == 4 * one.per_reader
    many = room(rows, sizes, cached, seed=1, block_size=100, shards_per_block=2, readers=16)
    assert many.needed == sum(cached) == many.whole  # a shard is on disk once, however many hold it
    assert (
        int(np.asarray(cached).max())
        == room(rows, sizes, cached, seed=None, block_size=100, shards_per_block=2).per_reader
    )
