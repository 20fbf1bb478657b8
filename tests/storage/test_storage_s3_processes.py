"""Several processes on one shard cache, through moto's S3 server: the limit, kill -9, DataLoader workers."""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

import procs
import pytest
from conftest import make_shards
from fault_proxy import FaultProxy
from s3_server import S3Server

import tidal
from tidal.storage import Retry, Storage

pytest_plugins = ["s3_fixtures"]

SRC = str(Path(__file__).resolve().parents[2] / "src")

READER = """
import json, sys
sys.path.insert(0, {src!r})
import tidal
from tidal.storage import Retry, Storage

cfg = json.loads(sys.argv[1])
settings = Storage(options=cfg["options"], cache_dir=cfg["cache"], cache_limit=cfg["limit"], timeout=cfg["timeout"],
                   retry=Retry(attempts=8, backoff=0.02), prefetch=cfg["prefetch"], part_size=cfg["part"], parallel=1)
ds = tidal.Dataset(cfg["url"], storage=settings)
if cfg["seed"] is not None:
    ds = ds.shuffle(seed=cfg["seed"], block_size=cfg["block"], shards_per_block=2)
it = ds.iterator()
ids = [r["id"] for r in it]
print(json.dumps({{"ids": ids, "stats": it.stats()}}))
"""


def reader(what: str, cfg: dict) -> procs.Command:
    """A process that reads the dataset of ``cfg`` and prints the ids it read and its stats as JSON."""
    return procs.Command(what, [sys.executable, "-c", READER.format(src=SRC), json.dumps(cfg)], procs.child_env())


def clear_shards(cache: Path) -> None:
    shutil.rmtree(cache / "shards", ignore_errors=True)


def disk_usage(root: Path) -> int:
    """What ``du`` says of the cache directory (files and directories), measured here, not by the cache."""
    total = 0
    for p in [root, *root.rglob("*")]:
        with contextlib.suppress(FileNotFoundError):  # removed while we looked
            total += p.stat().st_blocks * 512
    return total


@pytest.mark.slow
def test_the_cache_stays_under_its_limit_while_four_processes_read_through_it(
    s3: S3Server, bucket: str, tmp_path: Path
) -> None:
    data = make_shards(tmp_path / "data", [400] * 24, kinds=("jsonl",))  # ~24 shards of ~14 KB
    url = s3.upload(data, bucket, "web")
    cache, limit = tmp_path / "cache", 200_000
    settings = Storage(options=s3.options(), cache_dir=str(cache), cache_limit=limit, retry=Retry(backoff=0.02))
    tidal.Dataset(url, storage=settings)  # the index, built once
    clear_shards(cache)
    cfg = {"options": s3.options(), "cache": str(cache), "limit": limit, "timeout": 30, "prefetch": 2, "part": 4096}
    cfg.update(url=url, block=800)
    peak, done = [0], threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], disk_usage(cache))
            time.sleep(0.002)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        outs = procs.run([reader(f"reader {seed}", {**cfg, "seed": seed}) for seed in range(4)], timeout=120)
    finally:
        done.set()
        watcher.join()
    results = [json.loads(o) for o in outs]
    for r in results:
        assert sorted(r["ids"]) == list(range(24 * 400))  # each process read everything, exactly once
    total = sum(p.stat().st_size for p in data.iterdir() if p.is_file())
    assert total > 1.5 * limit  # the data does not fit: the cache had to evict
    assert sum(r["stats"]["evictions"] for r in results) > 0
    assert 0 < peak[0] <= limit, f"the cache took {peak[0]:,} bytes on disk, over its limit of {limit:,}"


@pytest.mark.slow
def test_kill_9_in_the_middle_of_an_s3_download_leaves_a_cache_the_next_run_reads(
    s3: S3Server, bucket: str, tmp_path: Path
) -> None:
    data = make_shards(tmp_path / "data", [20_000], kinds=("jsonl",))  # one shard of ~0.7 MB
    url = s3.upload(data, bucket, "web")
    cache = tmp_path / "cache"
    settings = Storage(options=s3.options(), cache_dir=str(cache), retry=Retry(backoff=0.02))
    tidal.Dataset(url, storage=settings)
    clear_shards(cache)
    ranged = lambda method, target, headers: any(k.lower() == "range" for k, _ in headers)  # noqa: E731
    with FaultProxy(("127.0.0.1", s3.port), every=3, kinds=("stall",), stall_s=60, only=ranged) as proxy:
        cfg = {"options": s3.options(proxy.endpoint), "cache": str(cache), "limit": 10**9, "timeout": 120}
        cfg.update(prefetch=0, part=64 << 10, url=url, seed=None, block=1000)
        with procs.Tree([reader("reader", cfg)]) as tree:
            child = tree.procs[0]
            deadline = time.monotonic() + 60
            while proxy.faults["stall"] == 0 and time.monotonic() < deadline and child.poll() is None:
                time.sleep(0.02)
            assert proxy.faults["stall"] == 1, f"the child never got into its download\n{tree.report()}"
            assert list(cache.glob("shards/*.part")) and not list(cache.glob("shards/*.shard"))
            child.send_signal(signal.SIGKILL)  # leaving the tree kills it anyway, also when a check above fails
            child.wait(timeout=30)
    assert not list(cache.glob("shards/*.shard"))  # half a download is never a shard
    t0 = time.monotonic()
    ds = tidal.Dataset(url, storage=settings)
    assert [r["id"] for r in ds] == list(range(20_000))  # the next run is not blocked, and reads it all
    assert time.monotonic() - t0 < 20
    assert not list(cache.glob("shards/*.part"))


@pytest.mark.slow
def test_dataloader_workers_read_from_s3_each_record_once(s3: S3Server, bucket: str, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    data = make_shards(tmp_path / "data", [40, 75, 13, 60, 52, 33])
    url = s3.upload(data, bucket, "web")
    settings = Storage(options=s3.options(), cache_dir=str(tmp_path / "cache"), retry=Retry(backoff=0.02))
    ds = tidal.Dataset(url, storage=settings).shuffle(seed=2, block_size=40, shards_per_block=2).batch(4)
    clear_shards(tmp_path / "cache")
    loader = tidal.DataLoader(ds, num_workers=2)
    got = sorted(int(i) for b in loader for i in b["id"])
    local = tidal.Dataset(data).shuffle(seed=2, block_size=40, shards_per_block=2).batch(4)
    assert got == sorted(int(i) for b in tidal.DataLoader(local, num_workers=2) for i in b["id"])
    assert len(got) >= 273 - 2 * 2 * 3  # each worker drops at most its last incomplete batch
