"""GCS and Azure Blob keep S3's promises: real emulators on 127.0.0.1 (gcp-storage-emulator,
Azurite), the real clients (gcsfs, adlfs), tidal's retries.

What tests/storage/test_storage_s3.py and the chaos tests check over S3, checked over each of them:
epochs, DataLoader workers, the cache bound, resumption, a missing object, and that a store
that refuses connections is reported within the bound docs/remote.md gives, each try one
request (the clients' own retry loops are off, so the ``retries`` stat counts them all).
"""

from __future__ import annotations

import contextlib
import http.server
import itertools
import json
import os
import shutil
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from azure_server import KEY
from azure_server import connection_string as azure_connection_string
from conftest import make_shards
from fault_proxy import FaultProxy
from hf_hub_fake import FakeHub

import tidal
from tidal.storage import Retry, Storage
from tidal.storage.cache import Cache
from tidal.storage.eviction import footprint

pytest_plugins = ["emulator_fixtures"]

FAST = Retry(attempts=8, backoff=0.02, max_backoff=0.2)
SIZES = [40, 75, 13, 60, 52, 33, 90, 17]
SHUFFLE = {"seed": 3, "block_size": 50, "shards_per_block": 3}
_names = itertools.count()


@pytest.fixture(params=["gcs", "azure"])
def store(request: pytest.FixtureRequest) -> Any:
    """Each emulator in turn (a GCSServer or an AzureServer: the same methods)."""
    return request.getfixturevalue(request.param)


class HubStore:
    """The fake Hub of tests/hf_hub_fake.py behind the emulators' methods: a bucket is a dataset repo."""

    scheme = "hf"

    def __init__(self, root: Path):
        self.root = root
        self.hub = FakeHub({})
        self.port = int(self.hub.endpoint.rsplit(":", 1)[1])

    def options(self, endpoint: str | None = None) -> dict[str, Any]:
        return {"endpoint": endpoint or self.hub.endpoint, "token": False}

    def bucket(self, name: str) -> str:
        (self.root / name).mkdir(parents=True)
        self.hub.repos[f"org/{name}"] = {"main": self.root / name}
        return name

    def upload(self, local: Path, bucket: str, prefix: str) -> str:
        shutil.copytree(local, self.root / bucket / prefix, ignore=shutil.ignore_patterns(".*"))
        return f"hf://datasets/org/{bucket}/{prefix}"


@pytest.fixture(params=["gcs", "azure", "hub"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """Each emulator in turn, and the fake Hub."""
    if request.param != "hub":
        yield request.getfixturevalue(request.param)
        return
    hub = HubStore(tmp_path / "hub")
    try:
        yield hub
    finally:
        hub.hub.stop()


@pytest.fixture
def bucket(store: Any) -> str:
    return store.bucket(f"test-{os.getpid()}-{next(_names)}")


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return make_shards(tmp_path / "data", SIZES)  # JSONL, zstd JSONL and Parquet


def storage(store: Any, tmp_path: Path, endpoint: str | None = None, **kw: Any) -> Storage:
    settings: dict = {"timeout": 5.0, "retry": FAST, "cache_dir": str(tmp_path / "cache"), **kw}
    return Storage(options=store.options(endpoint), **settings)


def clear_shards(cache: Path) -> None:
    """Empty the shard cache but keep the index: a cold start with a known dataset."""
    shutil.rmtree(cache / "shards", ignore_errors=True)


def shard_sizes(data: Path) -> list[int]:
    """The sizes of the shards in ``data`` (not the index a local read writes beside them)."""
    return [p.stat().st_size for p in sorted(data.iterdir()) if not p.name.startswith(".")]


def ids(ds: tidal.Dataset) -> list[int]:
    return [r["id"] for r in ds]


def test_shuffled_epochs_from_the_store_equal_the_same_epochs_from_local_files(
    store: Any, bucket: str, data: Path, tmp_path: Path
) -> None:
    url = store.upload(data, bucket, "web")
    remote = tidal.Dataset(url, storage=storage(store, tmp_path))
    kinds = ["jsonl", "jsonl.zst", "parquet"] * 2 + ["jsonl", "jsonl.zst"]
    assert [s.path for s in remote.shards] == [f"{url}/part-{k:03d}.{kind}" for k, kind in enumerate(kinds)]
    assert [s.rows for s in remote.shards] == SIZES
    clear_shards(tmp_path / "cache")
    it = remote.shuffle(**SHUFFLE).repeat(3).iterator()
    assert list(it) == list(tidal.Dataset(data).shuffle(**SHUFFLE).repeat(3))  # record for record, each epoch
    stats = it.stats()
    assert stats["cache_misses"] == len(SIZES) and stats["cache_hits"] == 2 * len(SIZES)  # later epochs: the cache
    assert stats["retries"] == 0 and stats["bytes_downloaded"] == sum(shard_sizes(data))


@pytest.mark.slow
def test_dataloader_workers_read_each_record_once(store: Any, bucket: str, data: Path, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    url = store.upload(data, bucket, "web")
    ds = tidal.Dataset(url, storage=storage(store, tmp_path)).shuffle(**SHUFFLE).repeat(2).batch(4)
    clear_shards(tmp_path / "cache")
    got = [b["id"].tolist() for b in tidal.DataLoader(ds, num_workers=2)]
    local = tidal.Dataset(data).shuffle(**SHUFFLE).repeat(2).batch(4)
    assert got == [b["id"].tolist() for b in tidal.DataLoader(local, num_workers=2)]  # the same batches, in order
    per_epoch = sorted(i for b in got for i in b)
    assert per_epoch[::2] == per_epoch[1::2] and len(per_epoch) >= 2 * (sum(SIZES) - 2 * 3)  # twice each, at most
    # each worker's last incomplete batch of the stream dropped


def _disk_usage(root: Path) -> int:
    total = 0
    for p in [root, *root.rglob("*")]:
        with contextlib.suppress(FileNotFoundError):  # removed while we looked
            total += p.stat().st_blocks * 512
    return total


def test_the_cache_stays_under_its_limit_and_evicts(store: Any, bucket: str, tmp_path: Path) -> None:
    data = make_shards(tmp_path / "data", [300] * 20, kinds=("jsonl", "parquet"))
    url = store.upload(data, bucket, "web")
    cache = tmp_path / "cache"
    tidal.Dataset(url, storage=storage(store, tmp_path))  # the index
    clear_shards(cache)
    limit = Cache(cache, 0).fixed() + 4096 + 4 * footprint(max(shard_sizes(data)))
    shuffle = {"seed": 5, "block_size": 300, "shards_per_block": 2}
    ds = tidal.Dataset(url, storage=storage(store, tmp_path, cache_limit=limit, prefetch=2)).shuffle(**shuffle)
    peak, done = [0], threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _disk_usage(cache))
            time.sleep(0.002)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        it = ds.repeat(2).iterator()
        got = [r["id"] for r in it]
    finally:
        done.set()
        watcher.join()
    assert got == ids(tidal.Dataset(data).shuffle(**shuffle).repeat(2))
    assert sum(shard_sizes(data)) > 1.5 * limit  # the data does not fit
    assert it.stats()["evictions"] > 0
    assert 0 < peak[0] <= limit, f"the cache took {peak[0]:,} bytes on disk, over its limit of {limit:,}"


def test_a_loader_restored_from_its_state_continues_batch_for_batch(
    store: Any, bucket: str, data: Path, tmp_path: Path
) -> None:
    pytest.importorskip("torch")
    url = store.upload(data, bucket, "web")
    ds = tidal.Dataset(url, storage=storage(store, tmp_path)).shuffle(**SHUFFLE).repeat(2).batch(6)
    full = [b["id"].tolist() for b in tidal.DataLoader(ds)]
    for stop in (1, len(full) // 2 + 3):  # within the first epoch, and within the second
        clear_shards(tmp_path / "cache")
        loader = tidal.DataLoader(ds)
        consumed = [b["id"].tolist() for b in itertools.islice(loader, stop)]
        state = json.loads(json.dumps(loader.state_dict()))
        resumed = tidal.DataLoader(ds)
        resumed.load_state_dict(state)
        assert consumed + [b["id"].tolist() for b in resumed] == full, f"resumed after {stop} of {len(full)}"


def test_a_missing_object_prefix_or_bucket_is_a_source_error_naming_it(store: Any, bucket: str, tmp_path: Path) -> None:
    store.put(bucket, "web/a.jsonl", b'{"id": 0}\n')
    settings = storage(store, tmp_path)
    scheme = store.scheme
    for missing in [
        f"{scheme}://{bucket}/web/b.jsonl",
        f"{scheme}://{bucket}/nothing/here",
        f"{scheme}://{bucket}/web/*.parquet",
        f"{scheme}://no-such-bucket-{os.getpid()}/web/a.jsonl",
    ]:
        with pytest.raises(tidal.SourceError, match=missing.replace("*", r"\*")):
            tidal.Dataset(missing, storage=settings)


def test_every_retry_is_tidals_and_counted(any_store: Any, data: Path, tmp_path: Path) -> None:
    """A 503 or a 429 on every third request: each is retried once, by tidal, and counted.

    Not resets: aiohttp itself sends an idempotent request once more, at once, when a kept-alive
    connection closes before the response (RFC 9112, 9.3.1.1); docs/remote.md says so."""
    store = any_store
    url = store.upload(data, store.bucket(f"test-{os.getpid()}-{next(_names)}"), "web")
    tidal.Dataset(url, storage=storage(store, tmp_path))  # the index, without faults
    with FaultProxy(("127.0.0.1", store.port), every=3, kinds=("503", "429")) as proxy:
        ds = tidal.Dataset(url, storage=storage(store, tmp_path, proxy.endpoint, prefetch=0, parallel=1))
        listed = sum(proxy.faults.values())  # faults of the listing: retried, not an iterator's to count
        clear_shards(tmp_path / "cache")
        it = ds.shuffle(**SHUFFLE).iterator()
        assert [r["id"] for r in it] == ids(tidal.Dataset(data).shuffle(**SHUFFLE))
        faults = sum(proxy.faults.values()) - listed
    assert faults >= 3 and set(proxy.faults) == {"503", "429"}
    assert it.stats()["retries"] == faults  # no retry inside the client: one request per try


# -- a store that is not there --------------------------------------------------------------


def _options(scheme: str, endpoint: str) -> dict[str, Any]:
    if scheme == "gs":
        return {"endpoint_url": endpoint, "token": "anon", "project": "test-project"}
    if scheme == "az":
        return {"connection_string": azure_connection_string(endpoint)}
    if scheme == "hf":
        return {"endpoint": endpoint, "token": False}
    return {}


def _url(scheme: str, endpoint: str) -> str:
    return {"http": f"{endpoint}/web/a.jsonl", "hf": "hf://datasets/org/web/a.jsonl"}.get(
        scheme, f"{scheme}://bucket/web/a.jsonl"
    )


class Overloaded:
    """An HTTP server on 127.0.0.1 that answers every request ``503 Service Unavailable``, and counts them."""

    def __init__(self) -> None:
        owner = self
        self.requests: list[str] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def _busy(self) -> None:
                owner.requests.append(f"{self.command} {self.path}")
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                self.send_response(503)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_HEAD = do_POST = do_PUT = _busy

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


@pytest.fixture
def overloaded() -> Iterator[Overloaded]:
    server = Overloaded()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize("scheme", ["gs", "az", "http", "hf"])
def test_a_store_that_refuses_connections_is_a_clear_error_in_bounded_time(scheme: str, tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on: bound, never listened
        s.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{s.getsockname()[1]}"
        url = _url(scheme, endpoint)
        retry = Retry(attempts=4, backoff=0.1, max_backoff=0.4)  # a timeout longer than a client's own retries
        settings = Storage(options=_options(scheme, endpoint), cache_dir=str(tmp_path), timeout=30.0, retry=retry)
        t0 = time.monotonic()
        with pytest.raises(tidal.StorageError) as err:
            tidal.Dataset(url, storage=settings)
        took = time.monotonic() - t0
    message = str(err.value)
    print(f"\n[refused {scheme}] error after {took:.2f}s: {message}")
    # refused at once each try, then the backoff waits (at most 0.1 + 0.2 + 0.4 s): the client's own retries
    # took minutes (gcsfs: 5 more tries after waits of 1 to 16 s, the Azure SDK 3 more after 15 s and more)
    assert took < 20
    assert message.startswith(url) and "failed 4 times" in message and "last error" in message
    assert "onnect" in message  # the last error: a connection that could not be made
    assert err.value.attempts == 4 and err.value.url == url
    assert KEY not in message and KEY not in repr(err.value)


@pytest.mark.parametrize("scheme", ["gs", "az", "http", "hf"])
def test_each_try_is_one_request(scheme: str, overloaded: Overloaded, tmp_path: Path) -> None:
    """A store that answers 503 to everything: tidal's tries, and not one request more."""
    endpoint = f"http://127.0.0.1:{overloaded.port}"
    url = _url(scheme, endpoint)
    retry = Retry(attempts=3, backoff=0.01)  # a timeout that lets a client's own retries (waits of 1 to 24 s) show
    settings = Storage(options=_options(scheme, endpoint), cache_dir=str(tmp_path), timeout=30.0, retry=retry)
    with pytest.raises(tidal.StorageError, match="failed 3 times") as err:
        tidal.Dataset(url, storage=settings)
    assert err.value.attempts == 3 and ("503" in str(err.value) or "Service Unavailable" in str(err.value))
    # a stat is one request to Azure and to the Hub; to GCS the object's metadata and, at once, a listing of its
    # name as a prefix (not sent when the first fails first); over HTTP a HEAD, then a GET where the HEAD failed
    per_try = {"gs": 2, "az": 1, "http": 2, "hf": 1}[scheme]
    sent = overloaded.requests
    # the request every try sends (not sent[0]: GCS's listing may go first, or not at all in a try)
    most, times = Counter(sent).most_common(1)[0]
    assert times == 3, f"{times} of {most!r} for 3 tries, the client retried: {sent}"
    assert len(sent) <= 3 * per_try, f"{len(sent)} requests for 3 tries, the client retried on its own: {sent}"


def test_a_refused_connection_is_not_a_missing_file_whatever_the_port(tmp_path: Path) -> None:
    """A port of 404xx put '404' in the message, which was read as 'not found' (a SourceError)."""
    with socket.socket() as s:
        for port in range(40400, 40500):
            try:
                s.bind(("127.0.0.1", port))
                break
            except OSError:
                continue
        else:
            pytest.fail("no free port in 40400-40499")
        url = f"http://127.0.0.1:{port}/web/a.jsonl"
        retry = Retry(attempts=2, backoff=0.05, max_backoff=0.1)
        with pytest.raises(tidal.StorageError, match=r"failed 2 times .*last error"):
            tidal.Dataset(url, storage=Storage(cache_dir=str(tmp_path), retry=retry))


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_large_files_are_read_in_place_by_ranges_on_every_store(
    any_store: Any, tmp_path: Path, fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What S3 reads by ranges (a Parquet file's few columns, a JSON lines file from its published
    line offsets; a shuffle's first batch by point reads) is read so from each store: the epochs
    of local files, and nothing in the shard cache."""
    monkeypatch.setattr("tidal.storage.prefetch.RANGE_MIN_BYTES", 0)  # these small files count as large
    local = tmp_path / "data"
    local.mkdir()
    for k in range(3):
        records = [{"id": k * 500 + i, "text": f"{i} " * 40} for i in range(500)]
        if fmt == "parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            pq.write_table(pa.Table.from_pylist(records), local / f"part-{k}.parquet", row_group_size=100)
        else:
            (local / f"part-{k}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    url = any_store.upload(local, any_store.bucket(f"inplace-{os.getpid()}-{next(_names)}"), "big")
    columns = ["id"] if fmt == "parquet" else None
    index = {"index_url": str(tmp_path / "index.json")} if any_store.scheme == "hf" and fmt == "jsonl" else {}
    if fmt == "jsonl":  # the line offsets, published (the Hub's beside the job: tidal writes nothing there)
        tidal.index(
            url, to=index.get("index_url"), storage=storage(any_store, tmp_path, cache_dir=str(tmp_path / "ix"))
        )
    remote = tidal.Dataset(url, columns=columns, storage=storage(any_store, tmp_path, **index))
    here = tidal.Dataset(str(local), columns=columns)
    for shuffled in (False, True):
        a, b = (
            (remote.shuffle(seed=5, block_size=300), here.shuffle(seed=5, block_size=300))
            if shuffled
            else (remote, here)
        )
        assert [r["id"] for r in a] == [r["id"] for r in b]
    assert not list((tmp_path / "cache").glob("shards/*.shard"))  # read in place, never downloaded
