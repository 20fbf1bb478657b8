"""What the byte counters of ``metrics()`` count: ``bytes_read``, what the readers read of the
files (of the columns read), and ``bytes_downloaded``, what came over the network, counted once
by the process that fetched it, opening the dataset included."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import write_jsonl
from fault_proxy import FaultProxy
from s3_server import S3Server

import tidal
from tidal.storage import Retry, Storage

pytest_plugins = ["s3_fixtures"]
pytest.importorskip("torch")

FAST = Retry(attempts=8, backoff=0.02, max_backoff=0.2)
ROWS = 1100  # records of each file; 32 kB of random bytes each in the Parquet file: 35 MB, read in place


def storage(endpoint: str, s3: S3Server, cache: Path) -> Storage:
    return Storage(options=s3.options(endpoint), cache_dir=str(cache), timeout=10.0, retry=FAST)


@pytest.mark.slow
def test_bytes_read_counts_the_columns_read_and_bytes_downloaded_what_came_over_the_network_once(
    s3: S3Server, bucket: str, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    blobs = [os.urandom(32_000) for _ in range(ROWS)]
    table = pa.table({"id": list(range(ROWS)), "blob": blobs})
    pq.write_table(table, data / "part-000.parquet", row_group_size=ROWS // 2)
    write_jsonl(data / "part-001.jsonl", [{"id": ROWS + i, "blob": "x" * 100} for i in range(ROWS)])
    url = s3.upload(data, bucket, "mixed")
    with FaultProxy(("127.0.0.1", s3.port), every=0) as proxy:  # counts every body the store sent
        ds = tidal.Dataset(url, columns=["id"], storage=storage(proxy.endpoint, s3, tmp_path / "cache"))
        parquet, jsonl = ds.shards
        assert parquet.bytes > 32 << 20  # large, and only its ids read: in place, by ranges
        # in order, a block per file: worker 0 reads the Parquet file's, worker 1 the JSON lines'
        loader = tidal.DataLoader(ds.batch(ROWS // 2), num_workers=2)
        ids = sorted(int(i) for b in loader for i in b["id"])
        sent = proxy.traffic.bytes_out
    assert ids == list(range(2 * ROWS))
    m = loader.metrics()
    # read: the id column's chunks of the Parquet file (not its 35 MB), and the JSON lines file whole
    assert m["bytes_read"] == parquet.info["column_bytes"]["id"] + jsonl.bytes
    # downloaded: the JSON lines file once, when opening the dataset counted it (the reader found it
    # in the cache), and the Parquet file's footer and ids: never its blobs
    assert m["cache_hits"] == 1 and m["cache_misses"] == 0
    assert jsonl.bytes + parquet.info["column_bytes"]["id"] <= m["bytes_downloaded"] < jsonl.bytes + (1 << 20)
    # and no byte counted that did not come: all the store sent, less listings and errors' bodies
    assert sent - 64_000 < m["bytes_downloaded"] <= sent


@pytest.mark.slow
def test_a_shard_two_workers_read_is_downloaded_and_counted_once_on_the_machine(
    s3: S3Server, bucket: str, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    write_jsonl(data / "part-000.jsonl", [{"id": i, "text": f"record {i}"} for i in range(2000)])
    url = s3.upload(data, bucket, "one")
    cache = tmp_path / "cache"
    tidal.Dataset(url, storage=storage(s3.endpoint, s3, cache))  # counted: its index kept in the cache
    shutil.rmtree(cache / "shards")  # the shard itself gone: the readers download it
    ds = tidal.Dataset(url, storage=storage(s3.endpoint, s3, cache))  # opened from the cached index
    size = ds.shards[0].bytes
    loader = tidal.DataLoader(ds.shuffle(seed=3).batch(100), num_workers=2)  # one block, read by both workers
    assert sorted(int(i) for b in loader for i in b["id"]) == list(range(2000))
    m = loader.metrics()
    assert m["bytes_downloaded"] == size  # once on the machine, by the worker that fetched it
    # each worker opened it once: the first downloaded it; the other waited for it (a miss) or, where
    # the first worker's point reads went alone (tidal.stages.turns: 2 cores), found it there (a hit)
    assert m["cache_misses"] >= 1 and m["cache_misses"] + m["cache_hits"] == 2
    # each worker read the whole block, and before it its first batch's 100 lines by point reads
    assert m["rows_read"] == 2 * (2000 + 100)
    assert 2 * size < m["bytes_read"] <= 2 * (size + 101 * size // 2000)
