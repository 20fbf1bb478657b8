"""Remote datasets end to end: moto's S3 server on 127.0.0.1, the real client stack, a fault proxy."""

from __future__ import annotations

import os
import random
import shutil
import time
from pathlib import Path

import pytest
from conftest import make_shards, read_index, write_parquet
from fault_proxy import FaultProxy
from s3_server import S3Server

import tidal
from tidal.sources.index_file import index_json
from tidal.storage import Retry, Storage
from tidal.storage import prefetch as prefetch_module
from tidal.storage.prefetch import entry

pytest_plugins = ["s3_fixtures"]

FAST = Retry(attempts=8, backoff=0.02, max_backoff=0.2)
SIZES = [40, 75, 13, 60, 52, 33, 90, 17]
KINDS = ["jsonl", "jsonl.zst", "parquet"] * 2 + ["jsonl", "jsonl.zst"]  # of each shard, as make_shards writes them


def storage(s3: S3Server, tmp_path: Path, endpoint: str | None = None, **kw: object) -> Storage:
    settings: dict = {"timeout": 1.0, "retry": FAST, "cache_dir": str(tmp_path / "cache"), **kw}
    return Storage(options=s3.options(endpoint), **settings)


def clear_shards(cache: Path) -> None:
    """Empty the shard cache but keep the index: a cold start with a known dataset."""
    shutil.rmtree(cache / "shards", ignore_errors=True)


def ids(ds: tidal.Dataset) -> list[int]:
    return [r["id"] for r in ds]


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return make_shards(tmp_path / "data", SIZES)


@pytest.mark.parametrize("backend", ["s3fs", "obstore"])
def test_an_epoch_from_s3_equals_the_same_epoch_from_local_files(
    s3: S3Server, bucket: str, data: Path, tmp_path: Path, backend: str
) -> None:
    url = s3.upload(data, bucket, "web")
    local = tidal.Dataset(data).shuffle(seed=3, block_size=50, shards_per_block=3)
    remote = tidal.Dataset(url, storage=storage(s3, tmp_path, backend=backend))
    assert [s.path for s in remote.shards] == [f"{url}/part-{k:03d}.{kind}" for k, kind in enumerate(KINDS)]
    assert [s.rows for s in remote.shards] == [s.rows for s in tidal.Dataset(data).shards]
    remote = remote.shuffle(seed=3, block_size=50, shards_per_block=3)
    assert remote.fingerprint() == local.fingerprint()  # a saved state moves between the two
    clear_shards(tmp_path / "cache")
    assert list(remote) == list(local)  # record for record, in the same order
    it = remote.iterator()
    assert [r["id"] for r in it] == ids(local)
    stats = it.stats()
    assert stats["cache_hits"] == len(SIZES) and stats["bytes_downloaded"] == 0  # the first pass kept them


def test_an_epoch_completes_exactly_once_with_faults_on_a_tenth_of_requests(
    s3: S3Server, bucket: str, tmp_path: Path
) -> None:
    data = make_shards(tmp_path / "data", [30] * 24, kinds=("jsonl", "jsonl.zst"))
    url = s3.upload(data, bucket, "web")
    with FaultProxy(("127.0.0.1", s3.port), every=10, stall_s=3.0) as proxy:
        settings = storage(s3, tmp_path, proxy.endpoint, part_size=512, parallel=3, prefetch=4)
        ds = tidal.Dataset(url, storage=settings).shuffle(seed=5, block_size=60, shards_per_block=4)
        clear_shards(tmp_path / "cache")
        it = ds.iterator()
        got = [r["id"] for r in it]
        assert sorted(got) == list(range(24 * 30))  # every record once
        assert got == ids(tidal.Dataset(data).shuffle(seed=5, block_size=60, shards_per_block=4))
        assert it.stats()["retries"] > 0
        assert set(proxy.faults) == {"reset", "503", "429", "stall", "truncate"}


def test_retries_that_run_out_raise_an_error_naming_the_url_and_no_secret(
    s3: S3Server, bucket: str, tmp_path: Path
) -> None:
    url = s3.upload(make_shards(tmp_path / "data", [5]), bucket, "web")
    with FaultProxy(("127.0.0.1", s3.port), every=1, kinds=("503",)) as proxy:
        settings = storage(s3, tmp_path, proxy.endpoint, retry=Retry(attempts=3, backoff=0.01, throttled_s=0))
        with pytest.raises(tidal.StorageError) as err:
            tidal.Dataset(url, storage=settings)
    message = str(err.value)
    assert url in message and "3 times" in message and "503" in message
    assert "testing-secret" not in message and "testing-secret" not in repr(settings)
    assert err.value.url == url and err.value.attempts == 3
    assert isinstance(err.value, OSError)


def test_a_missing_prefix_or_file_is_a_source_error_naming_it(s3: S3Server, bucket: str, tmp_path: Path) -> None:
    settings = storage(s3, tmp_path)
    for missing in [f"s3://{bucket}/nothing/here", f"s3://{bucket}/nothing/*.jsonl"]:
        with pytest.raises(tidal.SourceError, match=missing.replace("*", r"\*")):
            tidal.Dataset(missing, storage=settings)


def test_the_remote_index_is_kept_in_the_cache_and_rescans_only_changed_objects(
    s3: S3Server, bucket: str, tmp_path: Path
) -> None:
    data = make_shards(tmp_path / "data", [3, 4, 5], kinds=("jsonl",))
    url = s3.upload(data, bucket, "web")
    settings = storage(s3, tmp_path)
    assert tidal.Dataset(url, storage=settings).num_records == 12
    (index,) = (tmp_path / "cache" / "index").glob("*.json")
    entries = read_index(index.read_bytes())
    assert sorted(entries) == ["part-000.jsonl", "part-001.jsonl", "part-002.jsonl"]
    assert all(e["hash"].startswith(("xxh3_128:", "sha256:")) and e["version"] for e in entries.values())
    entries["part-000.jsonl"]["rows"] = 100  # trusted while size and ETag are unchanged...
    index.write_bytes(index_json(entries))
    assert tidal.Dataset(url, storage=settings).num_records == 109
    s3.put(bucket, "web/part-000.jsonl", b'{"id": 0, "text": "a"}\n' * 7)  # ...and recounted when it changes
    ds = tidal.Dataset(url, storage=settings)
    assert ds.num_records == 16 and ids(ds) == [0] * 7 + list(range(3, 12))


def test_a_published_index_is_used_and_its_hashes_are_checked(s3: S3Server, bucket: str, tmp_path: Path) -> None:
    data = make_shards(tmp_path / "data", [3, 4], kinds=("jsonl",))
    url = s3.upload(data, bucket, "web")
    tidal.Dataset(data)  # builds the local index, to be published beside the remote data
    published = read_index((data / ".tidal-index.json").read_bytes())
    for name, e in published.items():
        e["version"] = s3.client.head_object(Bucket=bucket, Key=f"web/{name}")["ETag"].strip('"')
    published["part-000.jsonl"]["hash"] = "sha256:" + "0" * 64  # not what the file holds
    s3.put(bucket, "web/.tidal-index.json", index_json(published))

    ds = tidal.Dataset(url, storage=storage(s3, tmp_path))
    assert [s.rows for s in ds.shards] == [3, 4]
    assert not list((tmp_path / "cache").glob("shards/*.shard"))  # counted from the published index, not downloaded
    assert ds.shards[0].hash == "sha256:" + "0" * 64 and ds.shards[1].hash is None
    with pytest.raises(tidal.StorageError, match=r"part-000.jsonl: the download does not match the index"):
        list(ds)
    bad = entry(ds.shards[0]).key
    assert not list((tmp_path / "cache").glob(f"shards/{bad}.*[dt]"))  # the bad download was never kept (.shard, .part)


def test_a_few_columns_of_a_large_remote_parquet_file_are_read_by_range_requests(
    s3: S3Server, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recs = [{"id": i, "blob": random.Random(i).randbytes(2048)} for i in range(400)]  # incompressible
    path = write_parquet(tmp_path / "big.parquet", recs, row_group_size=50)
    url = f"s3://{bucket}/big.parquet"
    s3.put(bucket, "big.parquet", path.read_bytes())
    monkeypatch.setattr(prefetch_module, "RANGE_MIN_BYTES", 100_000)
    size = path.stat().st_size
    settings = storage(s3, tmp_path)
    ds = tidal.Dataset(url, columns=["id"], storage=settings).shuffle(seed=1, block_size=100)
    assert ds.shards[0].info["column_bytes"]["blob"] > size / 2
    it = ds.iterator()
    assert sorted(r["id"] for r in it) == list(range(400))
    stats = it.stats()
    assert 0 < stats["bytes_downloaded"] < size / 4  # only the footer and the id column came over
    assert not list((tmp_path / "cache").glob("shards/*.shard"))  # nothing was downloaded whole
    whole = tidal.Dataset(url, storage=settings).iterator()  # every column: read in place too, by row groups
    assert [r["id"] for r in whole] == list(range(400))
    assert size * 0.9 < whole.stats()["bytes_downloaded"] < size * 1.1  # each byte once, the footer twice at most
    assert not list((tmp_path / "cache").glob("shards/*.shard"))  # read once, in one epoch: no copy kept


def test_stats_count_downloads_hits_and_waiting(s3: S3Server, bucket: str, data: Path, tmp_path: Path) -> None:
    url = s3.upload(data, bucket, "web")
    ds = tidal.Dataset(url, storage=storage(s3, tmp_path, prefetch=2))
    clear_shards(tmp_path / "cache")
    it = ds.iterator()
    assert len(list(it)) == sum(SIZES)
    s = it.stats()
    total = sum(p.stat().st_size for p in data.iterdir() if p.is_file())
    assert s["cache_misses"] == len(SIZES) and s["bytes_downloaded"] == total and s["requests"] >= len(SIZES)
    assert s["io_wait_s"] >= 0 and s["retries"] == 0 and s["corrupt"] == 0
    again = ds.iterator()
    list(again)
    assert again.stats()["cache_hits"] == len(SIZES) and again.stats()["bytes_downloaded"] == 0


def test_auto_reads_with_obstore_where_it_is_a_drop_in_and_never_after_a_fork(
    s3: S3Server, bucket: str, tmp_path: Path
) -> None:
    from tidal.storage import fs

    s3.put(bucket, "a.txt", b"hello\n")
    url = f"s3://{bucket}/a.txt"
    data = fs.Remote("s3", storage(s3, tmp_path), data=True)
    assert fs.Remote("s3", storage(s3, tmp_path)).backend == "s3fs"  # listing and indexing: always s3fs
    assert fs.Remote("s3", Storage(options={"endpoint_url": s3.endpoint}), data=True).backend == "s3fs"  # no creds
    assert data.backend == "obstore"
    assert data.cat(url, 0, 6) == b"hello\n"  # obstore's runtime now runs in this process
    assert fs.obstore_safe()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a DataLoader worker, say
        try:
            child = fs.Remote("s3", storage(s3, tmp_path), data=True)
            ok = not fs.obstore_safe() and child.backend == "s3fs" and child.cat(url, 0, 6) == b"hello\n"
            os.write(write, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(write)
    try:
        assert os.read(read, 1) == b"1"
    finally:
        os.close(read)
        os.waitpid(pid, 0)


def test_prefetching_hides_the_network_from_a_reader_that_does_its_own_work(
    s3: S3Server, bucket: str, tmp_path: Path
) -> None:
    url = s3.upload(make_shards(tmp_path / "data", [20] * 6, kinds=("jsonl",)), bucket, "web")
    waited = {}
    with FaultProxy(("127.0.0.1", s3.port), every=0, delay_s=0.3) as proxy:  # every request takes 0.3 s
        for prefetch in (0, 8):
            settings = storage(s3, tmp_path, proxy.endpoint, prefetch=prefetch)
            ds = tidal.Dataset(url, storage=settings)  # unshuffled: one shard per block
            clear_shards(tmp_path / "cache")
            it = ds.iterator()
            next(it)
            time.sleep(1.0)  # a training step: the shards of the next blocks come meanwhile
            assert len(list(it)) == 6 * 20 - 1
            waited[prefetch] = it.stats()["io_wait_s"]
            assert it.stats()["cache_misses"] == 6
    assert waited[0] > 5 * 0.3  # each later shard was waited for...
    assert waited[8] < waited[0] / 2  # ...or only the first (a ratio: a loaded machine slows both runs)


def test_a_cached_shard_corrupted_on_disk_is_fetched_again_not_read(
    s3: S3Server, bucket: str, data: Path, tmp_path: Path
) -> None:
    url = s3.upload(data, bucket, "web")
    ds = tidal.Dataset(url, storage=storage(s3, tmp_path)).shuffle(seed=1, block_size=40, shards_per_block=2)
    expected = ids(ds)  # every shard is in the cache now
    shards = sorted((tmp_path / "cache" / "shards").glob("*.shard"))
    assert len(shards) == len(SIZES)
    with open(shards[0], "r+b") as f:  # a stray write: same size, other bytes (verify=True also sees bit rot)
        f.write(b"\x00" * 16)
    shards[1].write_bytes(shards[1].read_bytes()[:-10])  # a truncated copy
    it = ds.iterator()
    assert [r["id"] for r in it] == expected
    assert it.stats()["corrupt"] == 2 and it.stats()["cache_misses"] == 2
