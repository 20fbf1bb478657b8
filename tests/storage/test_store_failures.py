"""The store-failure matrix: what tidal does when the store fails under a job, for every backend.

Each backend (S3 through s3fs and through obstore, against moto's server; GCS, against
gcp-storage-emulator; Azure Blob, against Azurite; HTTP, from a server that honours ``Range``
and from Python's own, which ignores it) meets each failure, read with 0 and with 2 DataLoader
workers:

- *object gone*: deleted after ``tidal index`` published the dataset's index;
- *object replaced*: replaced by another file after the dataset was listed, before its download;
- *object replaced while cached*: replaced after a read left it in the shard cache, the index
  published before;
- *server gone*: connections refused after the dataset was opened;
- *server refusing*: ``500 InternalError`` to every request;
- *throttling*: ``429`` and ``503 SlowDown`` to every request, past ``Retry.throttled_s``;
- *no credentials*: S3 with none to be found (botocore's own error, before a request); the
  others answer ``401`` as their store answers a request without them;
- *no access*: ``403``, the store's own error body, after the dataset was opened;
- *no bucket*: the bucket (Azure: container) deleted after the dataset was opened (HTTP: its
  directory).

Every request goes through a proxy (``tests/fault_proxy.py``) that forwards it, until the test
turns its fault on or stops it. What holds in every case: the error is a :class:`tidal.TidalError`
of the class the failure calls for, its message names the URL and says what happened in words a
user acts on; a failure that no retry can fix is not retried (``metrics()["retries"]`` is 0) and
one that may pass is tried ``attempts`` times, each retry counted in ``metrics()``, the request
that failed for good included; no record of a file that changed is read, from the store or the
cache. Each case prints how long the error took (``-s``); the retry budget is short (3 tries,
waits of at most 0.2 s, 0.3 s of throttling), so no case waits long, and none is timed by an assert.
"""

from __future__ import annotations

import functools
import http.server
import io
import itertools
import json
import os
import re
import shutil
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fault_proxy import FaultProxy

import tidal
from tidal.storage import Retry, Storage

pytestmark = pytest.mark.slow
pytest_plugins = ["s3_fixtures", "emulator_fixtures"]

ATTEMPTS = 3
RETRY = Retry(attempts=ATTEMPTS, backoff=0.05, max_backoff=0.2, throttled_s=0.3)
A = [{"id": i, "text": f"record {i} of a"} for i in range(6)]  # web/a.jsonl
B = [{"id": 6 + i, "text": f"record {6 + i} of b"} for i in range(6)]  # web/b.parquet
NEW_A = [{"id": 100 + i, "text": "replaced"} for i in range(2)]  # a.jsonl replaced: another, shorter file
_names = itertools.count()


def jsonl(records: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()


def parquet(records: list[dict]) -> bytes:
    out = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(records), out)
    return out.getvalue()


# -- the stores: one set of operations over each -----------------------------------------------


class Store:
    """A backend's server and the few things a test does to it behind tidal's back."""

    name: str
    scheme: str
    port: int
    backend = "auto"  # Storage(backend=...): which S3 client reads
    throttles: tuple[str, ...] = ("429",)  # how the store says it is throttling
    bodies: dict[int, tuple[list[tuple[str, str]], bytes]]  # the store's own error answers, by status

    def bucket(self) -> str:
        raise NotImplementedError

    def put(self, bucket: str, key: str, data: bytes) -> None:
        raise NotImplementedError

    def delete(self, bucket: str, key: str) -> None:
        raise NotImplementedError

    def drop(self, bucket: str) -> None:
        """The bucket and everything in it, gone."""
        raise NotImplementedError

    def options(self, endpoint: str) -> dict[str, Any]:
        raise NotImplementedError

    def url(self, bucket: str, key: str, endpoint: str) -> str:
        return f"{self.scheme}://{bucket}/{key}"

    def index(self, url: str, storage: Storage, bucket: str) -> None:
        """``tidal index`` of the data under ``url``, published beside it."""
        tidal.index(url, storage=storage)


class S3(Store):
    scheme = "s3"

    throttles = ("503", "429")  # 503 SlowDown, and 429

    def __init__(self, server: Any, backend: str):
        self.server, self.backend, self.name = server, backend, backend
        self.port = server.port
        self.bodies = {}

    def bucket(self) -> str:
        return self.server.bucket(f"fail-{os.getpid()}-{next(_names)}")

    def put(self, bucket: str, key: str, data: bytes) -> None:
        self.server.put(bucket, key, data)

    def delete(self, bucket: str, key: str) -> None:
        self.server.client.delete_object(Bucket=bucket, Key=key)

    def drop(self, bucket: str) -> None:
        client = self.server.client
        for obj in client.list_objects_v2(Bucket=bucket).get("Contents", []):
            client.delete_object(Bucket=bucket, Key=obj["Key"])
        client.delete_bucket(Bucket=bucket)

    def options(self, endpoint: str) -> dict[str, Any]:
        return self.server.options(endpoint)


def _gcs_error(status: int, message: str, reason: str) -> tuple[list[tuple[str, str]], bytes]:
    body = {"error": {"code": status, "message": message, "errors": [{"message": message, "reason": reason}]}}
    return [("Content-Type", "application/json")], json.dumps(body).encode()


GCS_ERRORS = {
    401: _gcs_error(
        401,
        "Anonymous caller does not have storage.objects.list access to the Google Cloud Storage bucket.",
        "required",
    ),
    403: _gcs_error(
        403,
        "reader@project.iam.gserviceaccount.com does not have storage.objects.get access to the Google Cloud "
        "Storage object. Permission 'storage.objects.get' denied on resource (or it may not exist).",
        "forbidden",
    ),
    429: _gcs_error(429, "The rate of change requests to the object is too high.", "rateLimitExceeded"),
    500: _gcs_error(500, "We encountered an internal error. Please try again.", "backendError"),
    503: _gcs_error(503, "We encountered an internal error. Please try again.", "backendError"),
}


class GCS(Store):
    name, scheme = "gcs", "gs"

    def __init__(self, server: Any):
        self.server, self.port, self.bodies = server, server.port, GCS_ERRORS

    def bucket(self) -> str:
        return self.server.bucket(f"fail-{os.getpid()}-{next(_names)}")

    def put(self, bucket: str, key: str, data: bytes) -> None:
        self.server.put(bucket, key, data)

    def _call(self, method: str, path: str) -> bytes:
        with urllib.request.urlopen(urllib.request.Request(self.server.endpoint + path, method=method)) as r:
            return r.read()

    def delete(self, bucket: str, key: str) -> None:
        self._call("DELETE", f"/storage/v1/b/{bucket}/o/{urllib.parse.quote(key, safe='')}")

    def drop(self, bucket: str) -> None:
        listed = json.loads(self._call("GET", f"/storage/v1/b/{bucket}/o"))
        for item in listed.get("items", []):
            self.delete(bucket, item["name"])
        self._call("DELETE", f"/storage/v1/b/{bucket}")

    def options(self, endpoint: str) -> dict[str, Any]:
        return self.server.options(endpoint)


def _azure_error(status: int, code: str, message: str) -> tuple[list[tuple[str, str]], bytes]:
    body = f'<?xml version="1.0" encoding="utf-8"?><Error><Code>{code}</Code><Message>{message}</Message></Error>'
    return [("Content-Type", "application/xml"), ("x-ms-error-code", code)], body.encode()


AZURE_ERRORS = {
    401: _azure_error(
        401,
        "NoAuthenticationInformation",
        "Server failed to authenticate the request. Please refer to the information in the www-authenticate header.",
    ),
    403: _azure_error(
        403,
        "AuthorizationPermissionMismatch",
        "This request is not authorized to perform this operation using this permission.",
    ),
    500: _azure_error(500, "InternalError", "The server encountered an internal error. Please retry the request."),
    503: _azure_error(
        503, "ServerBusy", "The server is currently unable to receive requests. Please retry your request."
    ),
}


class Azure(Store):
    name, scheme = "azure", "az"
    throttles = ("503",)  # 503 ServerBusy

    def __init__(self, server: Any):
        self.server, self.port, self.bodies = server, server.port, AZURE_ERRORS

    def bucket(self) -> str:
        return self.server.bucket(f"fail-{os.getpid()}-{next(_names)}")

    def put(self, bucket: str, key: str, data: bytes) -> None:
        self.server.put(bucket, key, data)

    def delete(self, bucket: str, key: str) -> None:
        self.server.client.get_blob_client(bucket, key).delete_blob()

    def drop(self, bucket: str) -> None:
        self.server.client.delete_container(bucket)

    def options(self, endpoint: str) -> dict[str, Any]:
        return self.server.options(endpoint)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    """Python's own file server, which answers every GET with the whole file (it ignores ``Range``)."""

    def log_message(self, format: str, *args: object) -> None:
        pass


class _Ranged(_Quiet):
    """A file server that honours a ``Range`` of one span, as nginx and object stores do."""

    def send_head(self) -> Any:
        spec = self.headers.get("Range")
        path = Path(self.translate_path(self.path))
        if spec is None or not path.is_file():
            return super().send_head()
        data = path.read_bytes()
        m = re.fullmatch(r"bytes=(\d*)-(\d*)", spec.strip())
        if m is None or not m.group(1):
            return super().send_head()
        start = int(m.group(1))
        stop = min(int(m.group(2)) + 1 if m.group(2) else len(data), len(data))
        if start >= len(data):
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{len(data)}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        self.send_response(206)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Range", f"bytes {start}-{stop - 1}/{len(data)}")
        self.send_header("Content-Length", str(stop - start))
        self.send_header("Last-Modified", self.date_time_string(int(path.stat().st_mtime)))
        self.end_headers()
        return io.BytesIO(data[start:stop])


class HTTP(Store):
    """A directory served over HTTP: a bucket is a directory of it."""

    scheme = "http"

    def __init__(self, root: Path, ranges: bool):
        self.root = root
        self.name = "http" if ranges else "http-no-ranges"
        handler = functools.partial(_Ranged if ranges else _Quiet, directory=str(root))
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        self.bodies = {401: ([("WWW-Authenticate", 'Basic realm="data"')], b"Unauthorized")}

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def bucket(self) -> str:
        name = f"fail-{next(_names)}"
        (self.root / name).mkdir()
        return name

    def put(self, bucket: str, key: str, data: bytes) -> None:
        path = self.root / bucket / key
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)  # whole, as an object store replaces an object

    def delete(self, bucket: str, key: str) -> None:
        (self.root / bucket / key).unlink()

    def drop(self, bucket: str) -> None:
        shutil.rmtree(self.root / bucket)

    def options(self, endpoint: str) -> dict[str, Any]:
        return {}

    def url(self, bucket: str, key: str, endpoint: str) -> str:
        return f"{endpoint}/{bucket}/{key}"

    def index(self, url: str, storage: Storage, bucket: str) -> None:
        """Published as a file of the served directory: tidal does not write over HTTP."""
        tidal.index(url, storage=storage, to=str(self.root / bucket / "web" / ".tidal-index.json"))


BACKENDS = ["s3fs", "obstore", "gcs", "azure", "http", "http-no-ranges"]


@pytest.fixture
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    name = request.param
    if name in ("s3fs", "obstore"):
        yield S3(request.getfixturevalue("s3"), name)
    elif name == "gcs":
        yield GCS(request.getfixturevalue("gcs"))
    elif name == "azure":
        yield Azure(request.getfixturevalue("azure"))
    else:
        (tmp_path / "www").mkdir()
        served = HTTP(tmp_path / "www", ranges=name == "http")
        try:
            yield served
        finally:
            served.stop()


# -- one case: a dataset, a failure, a read ------------------------------------------------------


@dataclass
class Case:
    """A dataset of two files (``web/a.jsonl``, ``web/b.parquet``) on ``store``, every request
    through ``proxy``, whose fault the test turns on (``fault``) or whose listener it closes
    (``stop``)."""

    store: Store
    tmp: Path
    kinds: tuple[str, ...]
    bucket: str = ""
    url: str = ""
    proxy: FaultProxy = field(init=False)
    on: threading.Event = field(default_factory=threading.Event)
    stopped: bool = False
    seen: list[tuple[str, str]] = field(default_factory=list)  # every request: method, path

    def __post_init__(self) -> None:
        self.proxy = FaultProxy(
            ("127.0.0.1", self.store.port),
            every=1,
            kinds=self.kinds or ("500",),
            only=self._request,
            bodies=self.store.bodies,
        )
        self.bucket = self.store.bucket()
        self.store.put(self.bucket, "web/a.jsonl", jsonl(A))
        self.store.put(self.bucket, "web/b.parquet", parquet(B))
        self.url = self.store.url(self.bucket, "web", self.proxy.endpoint)

    def _request(self, method: str, target: str, headers: list[tuple[str, str]]) -> bool:
        self.seen.append((method, target.split("?", 1)[0]))
        return self.on.is_set()  # whether this one gets the fault

    def file(self, name: str) -> str:
        return f"{self.url}/{name}"

    def storage(self, cache: str = "cache", **kw: Any) -> Storage:
        # no case waits out a timeout (a refused connection fails at once): a long one keeps a
        # loaded machine's slow first request in a new worker from being retried, and counted
        settings: dict[str, Any] = dict(timeout=30.0, retry=RETRY, prefetch=0, parallel=1, publish_index=False)
        settings.update(kw)
        return Storage(
            options=self.store.options(self.proxy.endpoint),
            cache_dir=str(self.tmp / cache),
            backend=self.store.backend,
            **settings,
        )

    def open(self, cache: str = "cache", errors: str = "raise") -> tidal.Dataset:
        return tidal.Dataset(self.url + "/", storage=self.storage(cache), errors=errors)

    def clear(self, cache: str = "cache") -> None:
        """The shard cache emptied, its index kept: what a node that counted and evicted holds."""
        shutil.rmtree(self.tmp / cache / "shards", ignore_errors=True)

    def fault(self) -> None:
        self.on.set()

    def stop(self) -> None:
        self.proxy.stop()
        self.stopped = True

    def close(self) -> None:
        if not self.stopped:
            self.proxy.stop()


@dataclass
class Outcome:
    ids: list[int]  # records the loop received before the error
    error: BaseException | None
    took: float
    metrics: dict[str, Any] | None  # None: the error came before a loader was made


def read(open_: Callable[[], tidal.Dataset], workers: int, context: str | None) -> Outcome:
    """Open a dataset and read it through a DataLoader; what came, and the error that ended it."""
    pytest.importorskip("torch")
    t0 = time.monotonic()
    try:
        ds = open_()
    except Exception as exc:
        return Outcome([], exc, time.monotonic() - t0, None)
    loader = tidal.DataLoader(ds.batch(2), num_workers=workers, multiprocessing_context=context if workers else None)
    ids: list[int] = []
    error = None
    try:
        for batch in loader:
            ids += batch["id"].tolist()
    except Exception as exc:
        error = exc
    return Outcome(ids, error, time.monotonic() - t0, loader.metrics())


# -- the failures ----------------------------------------------------------------------------------


def object_gone(case: Case, workers: int, context: str | None) -> Outcome:
    case.store.index(case.url + "/", case.storage("indexer"), case.bucket)
    case.store.delete(case.bucket, "web/a.jsonl")
    return read(lambda: case.open(), workers, context)


def object_replaced(case: Case, workers: int, context: str | None) -> Outcome:
    ds = case.open()  # listed, and counted
    case.clear()
    case.store.put(case.bucket, "web/a.jsonl", jsonl(NEW_A))
    return read(lambda: ds, workers, context)


def object_replaced_while_cached(case: Case, workers: int, context: str | None) -> Outcome:
    case.store.index(case.url + "/", case.storage("indexer"), case.bucket)
    assert sorted(r["id"] for r in case.open()) == [r["id"] for r in A + B]  # in the cache now
    case.store.put(case.bucket, "web/a.jsonl", jsonl(NEW_A))
    return read(lambda: case.open(), workers, context)


def server_gone(case: Case, workers: int, context: str | None) -> Outcome:
    ds = case.open()
    case.clear()
    case.stop()
    return read(lambda: ds, workers, context)


def server_answers(case: Case, workers: int, context: str | None) -> Outcome:
    """The proxy's fault (500, 429/503, 403) on every request once the dataset is open."""
    ds = case.open()
    case.clear()
    case.fault()
    return read(lambda: ds, workers, context)


def no_credentials(case: Case, workers: int, context: str | None) -> Outcome:
    if case.store.scheme == "s3":  # botocore finds none: its own error, before any request
        options = {k: v for k, v in case.store.options(case.proxy.endpoint).items() if k not in ("key", "secret")}
        settings = case.storage()
        return read(lambda: tidal.Dataset(case.url + "/", storage=_with_options(settings, options)), workers, context)
    case.fault()  # the store's answer to a request without them
    return read(lambda: case.open(), workers, context)


def _with_options(storage: Storage, options: dict[str, Any]) -> Storage:
    from dataclasses import replace

    return replace(storage, options=options)


def no_bucket(case: Case, workers: int, context: str | None) -> Outcome:
    ds = case.open()
    case.clear()
    case.store.drop(case.bucket)
    return read(lambda: ds, workers, context)


@dataclass(frozen=True)
class Failure:
    run: Callable[[Case, int, str | None], Outcome]
    error: type[BaseException]
    says: str  # a pattern the message matches (after the URL)
    transient: bool = False  # retried: tried ATTEMPTS times, each retry counted
    kinds: tuple[str, ...] = ()  # the proxy's answer, when the test turns its fault on
    names: str = "dataset"  # which URL the message starts with: the dataset's, or that of the file a.jsonl


FAILURES = {
    "object gone": Failure(object_gone, tidal.StorageError, r"is gone from the store.*tidal index", names="a"),
    "object replaced": Failure(
        object_replaced, tidal.StorageError, r"changed since the dataset was listed.*open the dataset again", names="a"
    ),
    "object replaced while cached": Failure(
        object_replaced_while_cached,
        tidal.StorageError,
        r"changed since the dataset's index was published.*tidal index",
        names="a",
    ),
    "server gone": Failure(server_gone, tidal.StorageError, rf"failed {ATTEMPTS} times.*(?i:connect|refused)", True),
    "server refusing": Failure(
        server_answers, tidal.StorageError, rf"failed {ATTEMPTS} times.*(?:500|Internal)", True, ("500",)
    ),
    "throttling": Failure(server_answers, tidal.StorageError, r"kept throttling it for 0.3s", True, ("throttles",)),
    "no credentials": Failure(no_credentials, tidal.StorageError, r"(?i)credentials", kinds=("401",)),
    "no access": Failure(server_answers, tidal.StorageError, r"access denied", kinds=("403",)),
    "no bucket": Failure(no_bucket, tidal.TidalError, r"(?:bucket|container) '[\w-]+' does not exist"),
}


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("failure", list(FAILURES))
@pytest.mark.parametrize("store", BACKENDS, indirect=True)
def test_a_store_failure_is_an_error_that_says_what_happened(
    store: Store, failure: str, workers: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no wait on an instance role that is not there
    spec = FAILURES[failure]
    # obstore's runtime does not survive fork, and may have run in this process: its workers are spawned
    context = "forkserver" if store.backend == "obstore" else None
    case = Case(store, tmp_path, store.throttles if spec.kinds == ("throttles",) else spec.kinds)
    try:
        got = spec.run(case, workers, context)
    finally:
        case.close()
    error = got.error
    print(f"\n[{store.name} | {failure} | {workers} workers] {got.took:.2f}s: {type(error).__name__}: {error}")
    assert error is not None, f"no error: {got.ids}"
    assert isinstance(error, spec.error), repr(error)
    message = str(error)
    if failure == "no bucket" and store.scheme == "http":  # a web server has no buckets: its files are gone
        says = FAILURES["object gone"].says.replace("tidal index", "open the dataset again")
    else:
        says = spec.says
    named = case.file("a.jsonl") if spec.names == "a" else case.url
    assert message.startswith(named), f"{message!r} does not start with {named!r}"
    assert re.search(says, message, re.S), f"{message!r} does not say {says!r}"
    assert "shard cache" not in message  # the store's failure, never blamed on the local disk
    assert not re.search(r"bytes \d+-\d+", message)  # a range said as it is: "GET of N bytes at offset S"
    assert not set(got.ids) & {r["id"] for r in NEW_A} and not (
        failure.startswith("object") and set(got.ids) & {r["id"] for r in A}
    ), f"records of a.jsonl that is no longer what was listed came out: {got.ids}"
    if got.metrics is not None:
        retries = got.metrics["retries"]
        if spec.transient:  # the request that failed for good: its retries counted, as all others
            assert retries >= (1 if failure == "throttling" else ATTEMPTS - 1), got.metrics
        else:  # nothing another try could fix is tried again
            assert retries == 0, got.metrics
    if spec.transient and failure != "throttling":
        assert getattr(error, "attempts", None) == ATTEMPTS
    assert got.took < 60  # a hang guard, not a timing: each case takes a second or two


# -- beside the matrix -----------------------------------------------------------------------------


def test_a_file_replaced_while_cached_is_the_same_error_on_every_node_and_read_afresh_once_listed_again(
    s3: Any, tmp_path: Path
) -> None:
    """Two nodes of one job, one with the file in its cache and one without: the same error on
    both, never the old records on one. Listed again (the index gone), the new file is read."""
    store = S3(s3, "s3fs")
    case = Case(store, tmp_path, ())
    try:
        case.store.index(case.url + "/", case.storage("indexer"), case.bucket)
        assert sorted(r["id"] for r in case.open("warm")) == [r["id"] for r in A + B]
        store.put(case.bucket, "web/a.jsonl", jsonl(NEW_A))
        errors = []
        for node in ("warm", "cold"):
            with pytest.raises(tidal.StorageError) as err:
                list(case.open(node))
            errors.append(str(err.value))
        assert errors[0] == errors[1] and "changed since the dataset's index was published" in errors[0]
        s3.client.delete_object(Bucket=case.bucket, Key="web/.tidal-index.json")
        assert sorted(r["id"] for r in case.open("warm")) == sorted(r["id"] for r in NEW_A + B)
    finally:
        case.close()


def test_a_warm_cache_of_an_indexed_dataset_asks_the_store_once_per_file_and_reader(s3: Any, tmp_path: Path) -> None:
    """What trusting a cached shard costs (docs/remote.md): one HEAD per file, the first time a
    reader opens it from the cache, and nothing more however many epochs it reads; no GET."""
    case = Case(S3(s3, "s3fs"), tmp_path, ())
    try:
        case.store.index(case.url + "/", case.storage("indexer"), case.bucket)
        ids = sorted(r["id"] for r in A + B)
        assert sorted(r["id"] for r in case.open("node")) == ids  # downloaded: a HEAD and a GET each
        case.seen.clear()
        assert sorted(r["id"] for r in case.open("node").repeat(3)) == sorted(ids * 3)
        files = [(m, p) for m, p in case.seen if not p.endswith(".tidal-index.json")]
        assert sorted(files) == [("HEAD", f"/{case.bucket}/web/a.jsonl"), ("HEAD", f"/{case.bucket}/web/b.parquet")]
    finally:
        case.close()


@pytest.mark.parametrize("backend", ["s3fs", "obstore"])
def test_a_file_deleted_after_the_listing_is_gone_not_a_cache_that_cannot_be_written(
    s3: Any, backend: str, tmp_path: Path
) -> None:
    """Listed (and counted), then deleted before its download: under errors="skip" too (a file
    that is gone is not bad data), the error says so; it said "cannot write to the shard cache"."""
    store = S3(s3, backend)
    case = Case(store, tmp_path, ())
    try:
        opened = {errors: case.open(f"c-{errors}", errors=errors) for errors in ("raise", "skip")}
        store.delete(case.bucket, "web/a.jsonl")
        for errors, ds in opened.items():
            case.clear(f"c-{errors}")
            with pytest.raises(tidal.StorageError, match="is gone from the store: deleted or moved since") as err:
                list(ds)
            assert str(err.value).startswith(case.file("a.jsonl")) and "shard cache" not in str(err.value)
    finally:
        case.close()


@pytest.mark.parametrize("loader", ["torch", "jax"])
@pytest.mark.parametrize("workers", [0, 2])
def test_the_counters_of_a_reader_that_failed_reach_metrics(tmp_path: Path, workers: int, loader: str) -> None:
    """A reader's counters travel with its batches: one that failed before its first batch sent
    none, and metrics() said it had read nothing (retries: 0 after a request failed 8 times)."""
    (tmp_path / "a.jsonl").write_bytes(jsonl([{"id": r["id"]} for r in A]))
    ds = tidal.Dataset(tmp_path).map(_fail).batch(2)
    if loader == "torch":
        pytest.importorskip("torch")
        made: Any = tidal.DataLoader(ds, num_workers=workers)
    else:
        pytest.importorskip("jax")
        from tidal.jax import Loader

        made = Loader(ds, num_workers=workers, worker_type="thread")
    with pytest.raises(ValueError, match="no record passes"):
        list(made)
    # the first batch's point reads met the failure: its 2 records were read, and counted
    assert made.metrics()["rows_read"] >= 2 and made.metrics()["batches"] == 0


def _fail(record: dict) -> dict:
    raise ValueError("no record passes")


def test_the_hub_says_a_file_replaced_or_deleted_since_the_listing_as_the_stores_do(tmp_path: Path) -> None:
    """hf:// reads through the same fetcher: its blob id is the version a listing gives."""
    from hf_hub_fake import FakeHub

    repo = tmp_path / "repo"
    (repo / "web").mkdir(parents=True)
    (repo / "web" / "a.jsonl").write_bytes(jsonl(A))
    (repo / "web" / "b.parquet").write_bytes(parquet(B))
    with FakeHub({"org/data": {"main": repo}}) as hub:
        url = "hf://datasets/org/data/web"
        for failure, cache in (("replaced", "c1"), ("deleted", "c2")):
            if failure == "deleted":
                (repo / "web" / "a.jsonl").write_bytes(jsonl(A))
            settings = Storage(options=hub.options(), cache_dir=str(tmp_path / cache), retry=RETRY, prefetch=0)
            ds = tidal.Dataset(url, storage=settings)
            shutil.rmtree(tmp_path / cache / "shards")
            if failure == "replaced":
                (repo / "web" / "a.jsonl").write_bytes(jsonl(NEW_A))
            else:
                (repo / "web" / "a.jsonl").unlink()
            says = "changed since the dataset was listed" if failure == "replaced" else "is gone from the store"
            with pytest.raises(tidal.StorageError, match=says) as err:
                list(ds)
            assert str(err.value).startswith(f"{url}/a.jsonl") and "shard cache" not in str(err.value)


@pytest.mark.parametrize("failure", ["replaced", "deleted"])
@pytest.mark.parametrize("order", ["files", "shuffled"])
@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_a_file_read_in_place_by_ranges_is_the_object_it_was_listed_as(
    s3: Any, tmp_path: Path, fmt: str, order: str, failure: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A large Parquet file of which few columns are read, or a large JSON lines file, is read by
    ranged GETs, never downloaded (shuffled: the first batch by point reads of its records):
    those reads too say that it changed or is gone, at once."""
    monkeypatch.setattr("tidal.storage.prefetch.RANGE_MIN_BYTES", 0)  # this small file counts as large
    store = S3(s3, "s3fs")
    case = Case(store, tmp_path, ())
    try:
        wide = [{"id": i, "text": "x" * 2000} for i in range(40)]  # "id" is a small share of the file
        name = f"b.{fmt}"
        store.put(case.bucket, f"web/{name}", parquet(wide) if fmt == "parquet" else jsonl(wide))
        if fmt == "jsonl":  # its line offsets, published: else the node downloads the file to count it
            tidal.index(case.url, storage=case.storage("indexer"))
        columns = ["id"] if fmt == "parquet" else None
        ds = tidal.Dataset(case.url + f"/{name}", storage=case.storage(), columns=columns)
        if order == "shuffled":
            ds = ds.shuffle(seed=1)
        assert sorted(r["id"] for r in ds) == list(range(40))
        assert not list((tmp_path / "cache").glob("shards/*.shard"))  # read in place, never downloaded
        if failure == "replaced":
            store.put(case.bucket, f"web/{name}", parquet(B) if fmt == "parquet" else jsonl(NEW_A * 50))
        else:
            store.delete(case.bucket, f"web/{name}")
        says = "changed since the dataset was listed" if failure == "replaced" else "is gone from the store"
        with pytest.raises(tidal.StorageError, match=says) as err:
            list(ds)
        assert str(err.value).startswith(case.file(name))
    finally:
        case.close()
