"""tidal over a realistic network: moto's S3 server behind the shaping proxy (latency before each
answer, bodies paced per connection and per link, 503 SlowDown above a request rate). What must
hold is behaviour, not speed: every record of the epoch once, no failed run, each 503 retried and
counted."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import make_shards
from fault_proxy import FaultProxy
from s3_server import S3Server
from shaping import Link, Throttle

import tidal
from tidal.storage import Storage

pytest_plugins = ["s3_fixtures"]

SIZES = [400] * 10
SHUFFLE = {"seed": 4, "block_size": 500, "shards_per_block": 3}
PART = {"jsonl.zst": 256, "parquet": 8192}  # 3 to 4 parts a shard (0.5-0.8 KB of JSONL.zst, 31 KB of Parquet)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["jsonl.zst", "parquet"])
def test_dataloader_workers_read_every_record_once_through_a_throttled_shaped_link(
    s3: S3Server, bucket: str, tmp_path: Path, fmt: str
) -> None:
    pytest.importorskip("torch")
    data = make_shards(tmp_path / "data", SIZES, kinds=(fmt,))
    url = s3.upload(data, bucket, "web")
    cache = tmp_path / "cache"
    tidal.Dataset(url, storage=Storage(options=s3.options(), cache_dir=str(cache)))  # the index, straight from moto
    shutil.rmtree(cache / "shards")  # a cold start of a known dataset: its shards come through the proxy
    link = Link(latency_s=0.02, conn_bytes_s=2e6, link_bytes_s=4e6)
    throttle = Throttle(rps=40, burst=4, per_prefix=1)  # fewer than the readers ask for at once: 503s
    with FaultProxy(("127.0.0.1", s3.port), every=0, link=link, throttle=throttle) as proxy:
        # small parts, so that each shard takes several requests; the default retries
        settings = Storage(options=s3.options(proxy.endpoint), cache_dir=str(cache), part_size=PART[fmt])
        ds = tidal.Dataset(url, storage=settings).shuffle(**SHUFFLE).batch(16)
        loader = tidal.DataLoader(ds, num_workers=2)
        got = sorted(int(i) for batch in loader for i in batch["id"])
        stats = loader.stats()
    traffic = proxy.traffic.snapshot()
    print(f"\n[shaped {fmt}] {traffic}; loader stats {stats}")
    assert got == list(range(sum(SIZES)))  # every record, once
    assert traffic["requests"].get("GET range", 0) > 2 * len(SIZES)  # the shards came in parts, through the proxy
    assert traffic["throttled"] > 0
    assert stats["retries"] == traffic["throttled"]  # each 503 retried, and counted once
    assert stats["bytes_downloaded"] == sum(p.stat().st_size for p in data.iterdir())
