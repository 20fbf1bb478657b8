"""The shard cache on its own: LRU under a limit, held entries, checks, locks that die with their process."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import sys
import time
from pathlib import Path

import procs
import pytest

from tidal.errors import SourceError, StorageError
from tidal.storage import cache as cache_module
from tidal.storage.cache import Cache, Entry
from tidal.storage.digests import default_algorithm, file_digest, hasher
from tidal.storage.eviction import footprint
from tidal.storage.stats import Stats

SRC = str(Path(__file__).resolve().parents[2] / "src")


def content(name: str, size: int) -> bytes:
    return hashlib.sha256(name.encode()).digest() * (size // 32) + b"x" * (size % 32)


def filler(data: bytes, calls: list[str] | None = None):
    def fill(path: Path, algorithm: str | None) -> str | None:
        if calls is not None:
            calls.append(str(path))
        path.write_bytes(data)
        if algorithm is None:
            return None
        h = hasher(algorithm)
        h.update(data)
        return f"{algorithm}:{h.hexdigest()}"

    return fill


def entry(name: str, size: int, **kw: object) -> Entry:
    return Entry(f"s3://bucket/{name}", size, "v1", **kw)  # type: ignore[arg-type]


def disk_usage(root: Path) -> int:
    """What ``du`` says of the cache directory (files and directories), measured here, not by the cache."""
    total = 0
    for p in [root, *root.rglob("*")]:
        with contextlib.suppress(FileNotFoundError):  # removed while we looked
            total += p.stat().st_blocks * 512
    return total


def test_a_file_is_filled_once_then_found(tmp_path: Path) -> None:
    stats = Stats()
    cache = Cache(tmp_path, 10**6, stats, hashes=True)
    calls: list[str] = []
    e = entry("a.jsonl", 1000)
    with cache.acquire(e, filler(content("a", 1000), calls)) as h:
        assert h.path.read_bytes() == content("a", 1000) and h.fresh
        assert h.digest == file_digest(h.path, default_algorithm())
    with cache.acquire(e, filler(b"never", calls)) as h:
        assert h.path.read_bytes() == content("a", 1000) and not h.fresh
    assert len(calls) == 1 and calls[0].endswith(".part")  # written beside, renamed into place
    assert not list(tmp_path.glob("shards/*.part"))
    # another version of the same URL is another entry
    with cache.acquire(Entry(e.url, 1000, "v2"), filler(content("b", 1000), calls)) as h:
        assert h.path.read_bytes() == content("b", 1000)


def test_least_recently_used_files_are_evicted_to_stay_under_the_limit_never_one_held(tmp_path: Path) -> None:
    stats = Stats()
    cache = Cache(tmp_path, 120_000, stats)  # about eight files of 8 KB, their meta files and directories
    held = cache.acquire(entry("held", 8000), filler(content("held", 8000)))
    assert held is not None
    for i in range(12):
        with cache.acquire(entry(f"f{i}", 8000), filler(content(f"f{i}", 8000))):
            assert disk_usage(tmp_path) <= cache.limit
        if i == 3:
            time.sleep(0.02)
            with cache.acquire(entry("f1", 8000), filler(b"")):  # f1 used again: recent
                pass
    assert held.path.read_bytes() == content("held", 8000)  # the oldest, but held: kept
    assert cache.lookup(entry("f11", 8000)) is not None  # the newest are kept...
    assert cache.lookup(entry("f0", 8000)) is None  # ...the oldest evicted
    assert stats.dict()["evictions"] >= 4
    held.release()
    assert cache.usage() == disk_usage(tmp_path) <= cache.limit


def test_a_file_larger_than_the_limit_is_refused_and_prefetches_never_wait_for_room(tmp_path: Path) -> None:
    cache = Cache(tmp_path, 60_000)
    with pytest.raises(StorageError, match="do not fit in the cache_limit"):
        cache.acquire(entry("big", 60_000), filler(b""))
    held = cache.acquire(entry("a", 20_000), filler(content("a", 20_000)))
    assert cache.acquire(entry("b", 20_000), filler(content("b", 20_000)), wait=0) is None  # no room: not now
    with pytest.raises(StorageError, match="no room in the shard cache"):
        cache.acquire(entry("b", 20_000), filler(content("b", 20_000)), wait=0.3)
    assert held is not None
    held.release()
    b = cache.acquire(entry("b", 20_000), filler(content("b", 20_000)), wait=0)
    assert b is not None and cache.lookup(entry("a", 20_000)) is None  # released, then evicted for b
    b.release()


def test_a_prefetch_never_evicts_a_pinned_entry_but_a_reader_that_needs_room_now_does(tmp_path: Path) -> None:
    stats = Stats()
    cache = Cache(tmp_path, 0, stats)
    cache.limit = cache.fixed() + 4096 + 2 * footprint(20_000)  # the ledger's block, and two entries
    a = cache.acquire(entry("a", 20_000), filler(content("a", 20_000)), wait=0, pin=True)
    time.sleep(0.02)
    b = cache.acquire(entry("b", 20_000), filler(content("b", 20_000)), wait=0, pin=True)
    assert a is not None and b is not None  # fetched ahead: pinned, not held
    assert cache.acquire(entry("c", 20_000), filler(content("c", 20_000)), wait=0) is None  # later still: no room
    with cache.acquire(entry("c", 20_000), filler(content("c", 20_000))) as c:  # needed now: the oldest pin gives way
        assert c is not None and c.path.read_bytes() == content("c", 20_000)
    assert cache.lookup(entry("a", 20_000)) is None and stats.dict()["evictions"] == 1
    held = cache.lookup(entry("b", 20_000))
    assert held is not None
    held.release()
    a.release()
    b.release()
    unpinned = cache.acquire(entry("d", 20_000), filler(content("d", 20_000)), wait=0)  # pins gone: b, c may go
    assert unpinned is not None
    unpinned.release()


def test_a_download_of_the_wrong_size_or_hash_is_never_kept(tmp_path: Path) -> None:
    stats = Stats()
    cache = Cache(tmp_path, 10**6, stats)
    with pytest.raises(StorageError, match=r"s3://bucket/a.jsonl: the download does not match.*tried 3 times"):
        cache.acquire(entry("a.jsonl", 1000), filler(content("a", 999)))
    good = content("a", 1000)
    wrong = "sha256:" + "0" * 64
    with pytest.raises(StorageError, match="expected sha256:000"):
        cache.acquire(entry("a.jsonl", 1000, hash=wrong), filler(good))
    assert not [p for p in tmp_path.rglob("*") if p.suffix in (".shard", ".part", ".meta")]
    assert stats.dict()["corrupt"] == 6
    right = "sha256:" + hashlib.sha256(good).hexdigest()
    with cache.acquire(entry("a.jsonl", 1000, hash=right), filler(good)) as h:
        assert h.path.read_bytes() == good


def test_a_store_that_says_not_found_is_not_a_cache_that_cannot_be_written(tmp_path: Path) -> None:
    """The store's "not found" (a SourceError, which is also a FileNotFoundError) raised by a
    download comes out as it is: it was taken for the disk ("cannot write to the shard cache")."""
    cache = Cache(tmp_path, 10**6)

    def fill(path: Path, algorithm: str | None) -> str | None:
        raise SourceError("s3://bucket/a.jsonl: no such file or directory")

    with pytest.raises(SourceError, match="no such file") as err:
        cache.acquire(entry("a.jsonl", 100), fill)
    assert "shard cache" not in str(err.value)
    assert not list((tmp_path / "shards").glob("*.part")) and not list((tmp_path / "shards").glob("*.shard"))


def test_a_cached_file_altered_on_disk_is_detected_and_fetched_again(tmp_path: Path) -> None:
    good = content("a", 4000)
    e = entry("a.jsonl", 4000)
    calls: list[str] = []
    with Cache(tmp_path, 10**6, hashes=True).acquire(e, filler(good, calls)) as h:
        path = h.path
    # changed in place (same size): its mtime gives it away
    with open(path, "r+b") as f:
        f.write(b"garbage")
    stats = Stats()
    with Cache(tmp_path, 10**6, stats, hashes=True).acquire(e, filler(good, calls)) as h:
        assert h.path.read_bytes() == good
    assert len(calls) == 2 and stats.dict()["corrupt"] == 1
    # a bit flipped under a preserved mtime: only a hash check sees it
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[100] ^= 1
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    with Cache(tmp_path, 10**6).acquire(e, filler(good, calls)) as h:
        assert h.path.read_bytes() != good  # stat checks only: not noticed
    stats = Stats()
    with Cache(tmp_path, 10**6, stats, verify=True).acquire(e, filler(good, calls)) as h:
        assert h.path.read_bytes() == good
    assert len(calls) == 3 and stats.dict()["corrupt"] == 1  # the recorded hash did not match


HANG = """
import sys, time
from pathlib import Path
sys.path.insert(0, {src!r})
from tidal.storage.cache import Cache, Entry
from tidal.storage.digests import default_algorithm, file_digest, hasher

def fill(path, algorithm):
    with open(path, "r+b") as f:
        f.write(b"half" * 1000)
        f.flush()
        Path({ready!r}).write_text("downloading")
        time.sleep(60)
    raise AssertionError("killed before this")

Cache(Path({root!r}), 10**6).acquire(Entry("s3://bucket/a", 8000, "v1"), fill)
"""


def test_kill_9_in_the_middle_of_a_download_leaves_no_shard_and_no_lock_that_blocks(tmp_path: Path) -> None:
    root, ready = tmp_path / "cache", tmp_path / "ready"
    code = HANG.format(src=SRC, ready=str(ready), root=str(root))
    with procs.Tree([procs.Command("downloader", [sys.executable, "-c", code], procs.child_env())]) as tree:
        child = tree.procs[0]
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.02)
        assert ready.exists(), f"the child never started its download\n{tree.report()}"
        cache = Cache(root, 10**6)
        assert cache.lookup(Entry("s3://bucket/a", 8000, "v1")) is None  # in progress: nothing to read
        child.send_signal(signal.SIGKILL)  # leaving the tree kills it anyway, also when a check above fails
        child.wait(10)
    assert list(root.glob("shards/*.part")) and not list(root.glob("shards/*.shard"))  # half a file, never a shard
    t0 = time.monotonic()
    good = content("a", 8000)
    with cache.acquire(Entry("s3://bucket/a", 8000, "v1"), filler(good)) as h:
        assert h.path.read_bytes() == good
    assert time.monotonic() - t0 < 10  # no lock of the dead process to wait for (acquire waits up to 300 s)
    assert not list(root.glob("shards/*.part"))
    # a stale .part of another entry goes when the next process first needs room
    stale = root / "shards" / ("ab" + "0" * 38 + ".part")
    stale.write_bytes(b"x" * 5000)
    with Cache(root, 10**6).acquire(Entry("s3://bucket/b", 100, "v1"), filler(content("b", 100))):
        pass
    assert not stale.exists()


ONCE = """
import sys, time
from pathlib import Path
sys.path.insert(0, {src!r})
from tidal.storage.cache import Cache, Entry
from tidal.storage.digests import default_algorithm, file_digest, hasher

def fill(path, algorithm):
    with open({log!r}, "a") as log:
        log.write("fill\\n")
    time.sleep(0.5)
    data = b"z" * 5000
    path.write_bytes(data)
    return None

with Cache(Path({root!r}), 10**6).acquire(Entry("s3://bucket/a", 5000, "v1"), fill) as h:
    assert h.path.read_bytes() == b"z" * 5000
"""


@pytest.mark.slow
def test_four_processes_that_want_the_same_file_download_it_once(tmp_path: Path) -> None:
    log = tmp_path / "fills.log"
    code = ONCE.format(src=SRC, log=str(log), root=str(tmp_path / "cache"))
    procs.run([procs.Command(f"process {i}", [sys.executable, "-c", code], procs.child_env()) for i in range(4)], 60)
    assert log.read_text() == "fill\n"


def test_hashes_of_any_hashlib_algorithm_or_xxhash_are_checked(tmp_path: Path) -> None:
    data = content("a", 3000)
    for algorithm in ("sha256", "md5", "xxh3_128", "xxh64"):
        h = hasher(algorithm)
        h.update(data)
        e = Entry(f"s3://bucket/{algorithm}", 3000, "v1", f"{algorithm}:{h.hexdigest()}")
        with Cache(tmp_path, 10**6).acquire(e, filler(data)) as handle:
            assert handle.digest == e.hash == file_digest(handle.path, algorithm)
        with pytest.raises(StorageError, match="does not match"):
            Cache(tmp_path, 10**6).acquire(Entry(e.url, 3000, "v2", e.hash), filler(content("b", 3000)))


def test_a_scan_while_an_entry_is_placed_leaves_room_for_its_meta(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process may scan the cache between an entry's rename into place and its meta
    file: the scan must count the meta to come, or the ledger says less than the disk holds."""
    cache, other = Cache(tmp_path, 10**6), Cache(tmp_path, 10**6)
    write = cache_module.write_file

    def scanned_first(path: Path, data: bytes) -> None:
        if path.name.endswith(".tmp"):  # the shard is in place, its meta not written yet
            with other._space() as ledger:
                ledger.fits(10**6, force=False)  # more than the ledger has room for: a full scan
        write(path, data)

    monkeypatch.setattr(cache_module, "write_file", scanned_first)
    with cache.acquire(entry("a", 5000), filler(content("a", 5000))) as h:
        assert h.path.read_bytes() == content("a", 5000)
    assert int((tmp_path / "cache.usage").read_text()) >= disk_usage(tmp_path)


def test_a_scan_that_lists_a_download_just_before_it_is_placed_still_counts_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A download is renamed into place without the cache lock: a scan that listed its ``.part``
    finds that name gone when it looks at the file, and must count the ``.shard`` instead."""
    cache, other = Cache(tmp_path, 10**6), Cache(tmp_path, 10**6)
    data = content("a", 20_000)
    listing = os.scandir

    def placed_after_the_listing(path: Path, algorithm: str | None) -> None:
        path.write_bytes(data)
        shard = path.with_suffix(".shard")

        def listed(d: object) -> object:
            files = list(listing(d))  # type: ignore[arg-type]
            if path.exists() and Path(str(d)) == path.parent:
                os.replace(path, shard)  # the downloader renames it into place between the listing and the stat
            return iter(files)

        monkeypatch.setattr(os, "scandir", listed)
        with other._space() as ledger:
            ledger.fits(10**6, force=False)  # more than the ledger has room for: a full scan
        monkeypatch.setattr(os, "scandir", listing)
        os.replace(shard, path)  # back where the real rename expects it
        return None

    with cache.acquire(entry("a", 20_000), placed_after_the_listing) as h:
        assert h.path.read_bytes() == data
    assert int((tmp_path / "cache.usage").read_text()) >= disk_usage(tmp_path)
