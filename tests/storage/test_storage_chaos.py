"""Chaos: the network breaking at random, the store restarting or going away, the disk full or
read-only, and secrets kept out of everything a user may paste into a bug report.

Every network test compares the records read with those of the same dataset read from local
files: an epoch completes exactly once (no record lost, none repeated), in the same order.
The figures they print (``pytest -s``) are the ones docs/reliability.md reports.
"""

from __future__ import annotations

import ast
import contextlib
import ctypes
import errno
import json
import logging
import os
import shutil
import stat
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import make_shards
from fault_proxy import FaultProxy
from http_servers import Quiet, serving
from s3_server import KEY, SECRET, S3Server

import tidal
from tidal.storage import Retry, Storage
from tidal.storage.cache import Cache
from tidal.storage.eviction import footprint

pytest_plugins = ["s3_fixtures"]

SRC = Path(__file__).resolve().parents[2] / "src"
TOKEN = "session-token-that-must-stay-secret"
SHUFFLE = {"seed": 11, "block_size": 120, "shards_per_block": 2}
EPOCHS = 3


def storage(endpoint: str, cache: Path, **kw: object) -> Storage:
    settings: dict = {"timeout": 1.0, "retry": Retry(attempts=8, backoff=0.02, max_backoff=0.2), **kw}
    options = {"key": KEY, "secret": SECRET, "endpoint_url": endpoint, "client_kwargs": {"region_name": "us-east-1"}}
    return Storage(options=options, cache_dir=str(cache), **settings)


def local_ids(data: Path, epochs: int = 1) -> list[int]:
    return [r["id"] for r in tidal.Dataset(data).shuffle(**SHUFFLE).repeat(epochs)]


@pytest.fixture
def own_s3() -> Iterator[S3Server]:
    """A server of this test's own, to stop or restart."""
    with S3Server() as server:
        yield server


# -- the network -------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["s3fs", "obstore"])
def test_an_epoch_completes_exactly_once_through_random_network_faults(
    s3: S3Server, bucket: str, tmp_path: Path, backend: str
) -> None:
    data = make_shards(tmp_path / "data", [60] * 20, kinds=("jsonl", "jsonl.zst"))
    url = s3.upload(data, bucket, "web")
    cache = tmp_path / "cache"
    tidal.Dataset(url, storage=storage(s3.endpoint, cache))  # the index, built without faults
    shutil.rmtree(cache / "shards")
    largest = max(p.stat().st_size for p in data.iterdir())
    limit = Cache(cache, 0).fixed() + 4096 + 5 * footprint(largest)  # five shards: evictions, prefetch held back
    with FaultProxy(("127.0.0.1", s3.port), rate=0.15, seed=2024, burst=2, stall_s=3.0, slow_s=0.1) as proxy:
        settings = storage(
            proxy.endpoint, cache, timeout=2.0, part_size=500, parallel=3, cache_limit=limit, backend=backend
        )
        it = tidal.Dataset(url, storage=settings).shuffle(**SHUFFLE).repeat(EPOCHS).iterator()
        got = [r["id"] for r in it]
    assert got == local_ids(data, EPOCHS)  # each record once per epoch, in order
    stats = it.stats()
    faults = dict(proxy.faults)
    print(f"\n[chaos {backend}] {proxy.requests} requests ({proxy.slow} slow), faults {faults}, stats {stats}")
    assert set(faults) == {"reset", "503", "429", "stall", "truncate"}
    # each fault cost one try, and tidal counted it; but the HTTP client itself tries again, once and
    # uncounted, a request whose kept-alive connection was reset before it answered: aiohttp under
    # s3fs, hyper under obstore (its pool retries a request the closed connection never took)
    uncounted = faults["reset"]
    # and a loaded machine can answer a request later than the client's 2 s timeout: a retry no fault caused
    assert sum(faults.values()) - uncounted <= stats["retries"] <= sum(faults.values()) + proxy.slow
    assert stats["evictions"] > 0


@pytest.mark.slow
def test_an_epoch_completes_exactly_once_across_a_restart_of_the_store(own_s3: S3Server, tmp_path: Path) -> None:
    data = make_shards(tmp_path / "data", [80] * 16, kinds=("jsonl",))
    url = own_s3.upload(data, own_s3.bucket("restart"), "web")
    cache = tmp_path / "cache"
    patient = Retry(attempts=30, backoff=0.1, max_backoff=1.0)  # rides out 13 s of outage on average, 26 s at most
    tidal.Dataset(url, storage=storage(own_s3.endpoint, cache))
    shutil.rmtree(cache / "shards")
    limit = Cache(cache, 0).fixed() + 4096 + 4 * footprint(max(p.stat().st_size for p in data.iterdir()))
    ds = tidal.Dataset(url, storage=storage(own_s3.endpoint, cache, retry=patient, prefetch=2, cache_limit=limit))
    it = ds.shuffle(**SHUFFLE).iterator()
    got = []
    restarted = threading.Thread(target=own_s3.resume, args=(tmp_path / "preload",))
    t0 = time.monotonic()
    for n, r in enumerate(it):
        got.append(r["id"])
        if n == 400:  # a third of the way: the store goes away under the reader, and comes back as it reads on
            own_s3.halt()
            restarted.start()
    restarted.join(60)
    assert not restarted.is_alive()
    assert got == local_ids(data)
    stats = it.stats()
    print(f"\n[restart] 1 restart, {stats['retries']} retries, {time.monotonic() - t0:.1f}s, stats {stats}")
    assert stats["retries"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["s3fs", "obstore"])
def test_a_store_gone_for_good_is_a_clear_error_in_bounded_time(own_s3: S3Server, tmp_path: Path, backend: str) -> None:
    data = make_shards(tmp_path / "data", [50] * 4, kinds=("jsonl",))
    url = own_s3.upload(data, own_s3.bucket("gone"), "web")
    cache = tmp_path / "cache"
    retry = Retry(attempts=4, backoff=0.1, max_backoff=0.4)
    settings = storage(own_s3.endpoint, cache, retry=retry, timeout=1.0, backend=backend)
    ds = tidal.Dataset(url, storage=settings).shuffle(**SHUFFLE)
    shutil.rmtree(cache / "shards")
    own_s3.stop()
    # each try: a refused connection at once, or at worst the request timeout; between tries, the backoff
    bound = retry.attempts * settings.timeout + sum(min(retry.max_backoff, retry.backoff * 2**i) for i in range(3))
    t0 = time.monotonic()
    with pytest.raises(tidal.StorageError) as err:
        next(iter(ds))
    took = time.monotonic() - t0
    message = str(err.value)
    print(f"\n[gone {backend}] error after {took:.2f}s (bound {bound:.1f}s): {message}")
    assert took < bound + 5.0  # and the rest of the reader's work on 2 loaded cores (a hang: minutes)
    assert message.startswith(f"{url}/part-") and "failed 4 times" in message and "last error" in message
    assert err.value.attempts == 4 and err.value.url.startswith(url)
    everything = "".join(traceback.format_exception(err.value)) + repr(err.value)
    assert KEY not in everything and SECRET not in everything


def test_a_store_that_stops_answering_is_a_clear_error_in_bounded_time(
    s3: S3Server, bucket: str, tmp_path: Path
) -> None:
    """The worst case of the bound: every try waits out its whole timeout (a server that accepts and is silent)."""
    url = s3.upload(make_shards(tmp_path / "data", [50] * 2, kinds=("jsonl",)), bucket, "web")
    cache = tmp_path / "cache"
    tidal.Dataset(url, storage=storage(s3.endpoint, cache))
    shutil.rmtree(cache / "shards")
    retry = Retry(attempts=3, backoff=0.1, max_backoff=0.4)
    reads = lambda method, target, headers: any(k.lower() == "range" for k, _ in headers)  # noqa: E731
    with FaultProxy(("127.0.0.1", s3.port), every=1, kinds=("stall",), stall_s=30, only=reads) as proxy:
        settings = storage(proxy.endpoint, cache, retry=retry, timeout=0.5)
        bound = retry.attempts * settings.timeout + sum(min(retry.max_backoff, retry.backoff * 2**i) for i in range(2))
        ds = tidal.Dataset(url, storage=settings)
        t0 = time.monotonic()
        with pytest.raises(tidal.StorageError, match=f"^{url}/part-.*failed 3 times") as err:
            next(iter(ds))
        took = time.monotonic() - t0
    print(f"\n[silent] error after {took:.2f}s (bound {bound:.1f}s): {err.value}")
    assert settings.timeout * retry.attempts <= took < bound + 5.0  # a try that waited out the stall: 30 s


# -- the disk ----------------------------------------------------------------------------

CHILD = """
import json, sys
sys.path.insert(0, {src!r})
import tidal
from tidal.storage import Retry, Storage

cfg = json.loads(sys.argv[1])
try:
    ds = tidal.Dataset(cfg["url"], storage=Storage(options=cfg["options"], cache_dir=cfg["cache"], retry=Retry(attempts=2)))
    print(json.dumps({{"ids": [r["id"] for r in ds]}}))
except tidal.StorageError as exc:
    print(json.dumps({{"error": str(exc)}}))
"""


_libc = ctypes.CDLL(None, use_errno=True)  # loaded here: the child only calls it, between fork and exec


def _no_override() -> None:
    """In a child of root: give up the powers that ignore file modes, so a read-only directory is one."""
    for cap in (1, 2, 3):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER, dropped before exec
        if _libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def run_child(cfg: dict) -> dict:
    root = os.geteuid() == 0
    proc = subprocess.run(
        [sys.executable, "-c", CHILD.format(src=str(SRC)), json.dumps(cfg)],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_no_override if root else None,
    )
    if proc.returncode != 0 and "prctl" in proc.stderr:
        pytest.skip("cannot drop root's power to write read-only directories here")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.slow
def test_a_read_only_cache_directory_is_a_clear_error_naming_it(s3: S3Server, bucket: str, tmp_path: Path) -> None:
    data = make_shards(tmp_path / "data", [30] * 3, kinds=("jsonl",))
    url = s3.upload(data, bucket, "web")
    cfg = {"url": url, "options": s3.options()}
    fresh = tmp_path / "fresh"
    fresh.mkdir(mode=0o555)  # read-only from the start: the index cannot be kept either
    used = tmp_path / "used"  # read-only once its index was built: the shards cannot be
    tidal.Dataset(url, storage=Storage(options=s3.options(), cache_dir=str(used)))
    shutil.rmtree(used / "shards")
    (used / "shards").mkdir(mode=0o555)
    for d in (used / "index", used):
        d.chmod(0o555)
    try:
        for cache in (fresh, used):
            out = run_child({**cfg, "cache": str(cache)})
            assert "error" in out, f"{cache} was written"
            assert f"the shard cache {cache} is not writable" in out["error"], out["error"]
            assert "cache_dir" in out["error"]
    finally:
        for d in (fresh, used, used / "index", used / "shards"):
            d.chmod(0o755)
    assert run_child({**cfg, "cache": str(used)}) == {"ids": list(range(90))}  # writable again: all is well


@contextlib.contextmanager
def tiny_disk(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` at ``path``: a disk that really fills up (needs root and a kernel that lets it)."""
    path.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def no_parts_left(cache: Path, within: float = 10.0) -> bool:
    """Whether the ``.part`` files of downloads still running when their reader closed are gone in time."""
    deadline = time.monotonic() + within
    while list(cache.glob("shards/*.part")) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not list(cache.glob("shards/*.part"))


def assert_every_cached_shard_is_whole(cache: Path, data: Path) -> None:
    """Every ``.shard`` in the cache is byte for byte one of the data's files: nothing half-written."""
    files = {p.read_bytes() for p in data.iterdir()}
    for shard in cache.glob("shards/*.shard"):
        assert shard.read_bytes() in files, f"{shard} is not a whole shard"


@pytest.mark.slow
@pytest.mark.parametrize("how", ["fallocate", "write"])
def test_a_full_disk_is_a_clear_error_naming_the_directory_and_leaves_nothing_half_written(
    s3: S3Server, bucket: str, tmp_path: Path, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = make_shards(tmp_path / "data", [3000] * 6, kinds=("jsonl",))  # ~150 KB each
    url = s3.upload(data, bucket, "web")
    indexer = tmp_path / "indexer"
    tidal.Dataset(url, storage=storage(s3.endpoint, indexer))
    shuffle = {"seed": 1, "block_size": 3000}
    with tiny_disk(tmp_path / "disk", "480k") as disk:
        cache = disk / "cache"
        cache.mkdir()
        shutil.copytree(indexer / "index", cache / "index")
        ds = tidal.Dataset(
            url, storage=storage(s3.endpoint, cache)
        )  # the default cache_limit, 50 GB: the disk is small
        if how == "write":  # a filesystem without fallocate: the disk fills up in the middle of a write
            monkeypatch.setattr(Cache, "_preallocate", staticmethod(lambda path, size: path.write_bytes(b"")))
        it = ds.shuffle(**shuffle, shards_per_block=4).iterator()  # four shards at once do not fit on the disk
        with pytest.raises(tidal.StorageError) as err:
            list(it)
        it.close()  # the reader gives up its shards, as its process would by ending
        message = str(err.value)
        print(f"\n[disk full, {how}] {message}")
        assert f"the disk of the shard cache {cache} is full" in message, message
        assert no_parts_left(cache)  # downloads that failed, or were abandoned, leave nothing behind
        assert_every_cached_shard_is_whole(cache, data)
        monkeypatch.undo()
        again = [r["id"] for r in ds.shuffle(**shuffle, shards_per_block=2)]  # two at once fit: the next run reads
        assert again == [r["id"] for r in tidal.Dataset(data).shuffle(**shuffle, shards_per_block=2)]
        assert_every_cached_shard_is_whole(cache, data)


@pytest.mark.parametrize("how", ["fallocate", "write"])
def test_a_disk_that_fills_up_is_named_even_where_no_tmpfs_can_be_mounted(
    tmp_path: Path, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same, the disk simulated: ``ENOSPC`` in the cache's own write path, as a full disk gives it."""
    from tidal.storage.cache import Entry

    full = {"now": True}
    preallocate = Cache._preallocate

    def fallocate(path: Path, size: int) -> None:
        used = sum(p.stat().st_blocks * 512 for p in path.parent.iterdir() if p.is_file())
        if how == "fallocate" and full["now"] and used + size > 60_000:  # a disk of 60 KB
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        preallocate(path, size)

    def fill(path: Path, algorithm: str | None) -> None:
        with open(path, "r+b") as f:
            f.write(b"x" * 10_000)
            if how == "write" and full["now"]:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            f.write(b"x" * 20_000)

    monkeypatch.setattr(Cache, "_preallocate", staticmethod(fallocate))
    root = tmp_path / "cache"
    cache = Cache(root, 10**9)  # a limit far above what the disk holds
    held = cache.acquire(Entry("s3://b/first", 30_000, "v"), fill) if how == "fallocate" else None
    with pytest.raises(tidal.StorageError, match=f"s3://b/second: the disk of the shard cache {root} is full"):
        cache.acquire(Entry("s3://b/second", 30_000, "v"), fill)  # the first is held: nothing to evict
    assert not list(root.glob("shards/*.part"))
    assert len(list(root.glob("shards/*.shard"))) == (held is not None)  # the first, whole; never a half-written one
    if held is not None:
        held.release()
    full["now"] = False
    with cache.acquire(Entry("s3://b/second", 30_000, "v"), fill) as h:  # the next run: whole and right
        assert h is not None and h.path.read_bytes() == b"x" * 30_000


# -- secrets -----------------------------------------------------------------------------


def test_cache_files_and_directories_are_never_world_writable_even_under_umask_000(
    s3: S3Server, bucket: str, tmp_path: Path
) -> None:
    data = make_shards(tmp_path / "data", [20] * 4)
    url = s3.upload(data, bucket, "web")
    cache = tmp_path / "new" / "nested" / "cache"  # parents made by tidal too
    old = os.umask(0)
    try:
        ds = tidal.Dataset(url, storage=storage(s3.endpoint, cache))
        assert len(list(ds.shuffle(seed=1))) == 80
    finally:
        os.umask(old)
    written = [tmp_path / "new", tmp_path / "new" / "nested", *[cache, *cache.rglob("*")]]
    loose = [
        f"{p.relative_to(tmp_path)}: {stat.filemode(p.stat().st_mode)}"
        for p in written
        if p.stat().st_mode & 0o002 and not p.match("index/*.json")
    ]
    assert not loose, loose
    assert len(list(cache.glob("shards/*.shard"))) == 4


def test_the_index_of_a_remote_dataset_is_not_world_writable_even_under_umask_000(
    s3: S3Server, bucket: str, tmp_path: Path
) -> None:
    url = s3.upload(make_shards(tmp_path / "data", [5], kinds=("jsonl",)), bucket, "web")
    old = os.umask(0)
    try:
        tidal.Dataset(url, storage=storage(s3.endpoint, tmp_path / "cache"))
    finally:
        os.umask(old)
    (index,) = (tmp_path / "cache" / "index").glob("*.json")
    assert not index.stat().st_mode & 0o002


def test_credentials_never_appear_in_errors_logs_or_loader_state(
    s3: S3Server, bucket: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("torch")
    url = s3.upload(make_shards(tmp_path / "data", [30] * 4, kinds=("jsonl",)), bucket, "web")
    caplog.set_level(logging.DEBUG)  # every logger of every library: botocore prints each request it signs
    texts = []
    for backend in ("s3fs", "obstore"):
        options = {**s3.options(), "token": TOKEN}
        settings = Storage(options=options, cache_dir=str(tmp_path / backend), backend=backend, timeout=2)
        ds = tidal.Dataset(url, storage=settings).shuffle(seed=1, block_size=40).batch(10)
        loader = tidal.DataLoader(ds, num_workers=0)
        for step, _ in enumerate(loader):
            if step == 3:
                break
        texts += [json.dumps(loader.state_dict()), repr(settings), repr(ds)]
        with FaultProxy(("127.0.0.1", s3.port), every=1, kinds=("503",)) as proxy:
            failing = Storage(
                options={**options, "endpoint_url": proxy.endpoint},
                cache_dir=str(tmp_path / f"{backend}-failing"),
                backend=backend,
                retry=Retry(attempts=2, backoff=0.01, throttled_s=0),
            )
            with pytest.raises(tidal.StorageError) as err:
                list(tidal.Dataset(url, storage=failing))
        with pytest.raises(tidal.SourceError) as missing:
            tidal.Dataset(f"{url}/nothing.jsonl", storage=settings)
        for e in (err.value, missing.value):
            texts += ["".join(traceback.format_exception(e)), repr(e), str(e.args)]
    assert any("Sending http request" in r.getMessage() for r in caplog.records)  # the log was on
    texts += [caplog.text, *(r.getMessage() for r in caplog.records)]
    for text in texts:
        for secret in (KEY, SECRET, TOKEN):
            assert secret not in text, f"{secret!r} in: ...{text[max(0, text.find(secret) - 300) :][:400]}"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A directory of shards behind ``http://127.0.0.1:<free port>/``, which ignores query strings."""
    data = make_shards(tmp_path / "data", [10, 20, 5], kinds=("jsonl",))
    with serving(data, Quiet) as (url, _):
        yield url, data


def test_signed_urls_never_appear_in_errors_logs_or_loader_state(
    served: tuple[str, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("torch")
    base, data = served
    query = "?X-Amz-Credential=AKIASIGNED%2F20250101&X-Amz-Signature=f00dfeed"  # what a presigned URL carries
    caplog.set_level(logging.DEBUG)
    settings = Storage(cache_dir=str(tmp_path / "cache"), retry=Retry(attempts=2, backoff=0.01), timeout=2)
    signed = [f"{base}/part-{k:03d}.jsonl{query}" for k in range(3)]
    ds = tidal.Dataset(signed, format="jsonl", storage=settings)
    assert [r["id"] for r in ds] == [r["id"] for r in tidal.Dataset(data)]  # read, query strings and all
    loader = tidal.DataLoader(ds.batch(5), num_workers=0)
    next(iter(loader))
    texts = [json.dumps(loader.state_dict()), repr(ds)]
    with pytest.raises(tidal.TidalError) as err:
        tidal.Dataset([f"{base}/missing.jsonl{query}"], format="jsonl", storage=settings)
    assert f"{base}/missing.jsonl" in str(err.value)  # named, without its signature
    texts += ["".join(traceback.format_exception(err.value)), repr(err.value), caplog.text]
    texts += [r.getMessage() for r in caplog.records]
    for text in texts:
        assert "AKIASIGNED" not in text and "f00dfeed" not in text, text[:2000]


def test_storage_never_unpickles_or_evaluates_data() -> None:
    """No pickle, marshal, eval or exec anywhere in the storage package: it moves bytes, never runs them."""
    banned_modules = {"pickle", "cPickle", "_pickle", "marshal", "shelve", "dill", "cloudpickle", "joblib"}
    banned_calls = {"eval", "exec", "compile", "__import__", "loads_pickle"}
    for path in sorted((SRC / "tidal" / "storage").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                assert not {a.name.split(".")[0] for a in node.names} & banned_modules, f"{path.name}: {ast.dump(node)}"
            elif isinstance(node, ast.ImportFrom):
                assert (node.module or "").split(".")[0] not in banned_modules, f"{path.name}: imports {node.module}"
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id not in banned_calls, f"{path.name}:{node.lineno}: {node.func.id}()"
            elif isinstance(node, ast.keyword) and node.arg == "allow_pickle":
                raise AssertionError(f"{path.name}:{node.value.lineno}: allow_pickle")
