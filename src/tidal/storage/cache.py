"""The local shard cache: whole remote files on local disk, bounded, shared, crash-safe.

One directory, shared by every process of the machine and by any number of datasets.
Each cached file is an *entry*, named by the SHA-1 of its URL and version (ETag or
modification time), so a changed object is a new entry and an old copy is never mistaken
for it. An entry ``k`` lives in ``<root>/shards/`` as up to five files:

    k.shard   the bytes, complete and checked; only ever created by a rename
    k.meta    JSON: url, version, size, hash, and the size and mtime of k.shard when it
              was placed; written (atomically) after k.shard: no meta, no entry
    k.part    a download in progress, preallocated to its full size
    k.use     a lock held *shared* by every reader using the entry; evicting needs it
              *exclusively*, so an entry in use is never evicted
    k.fetch   a lock held *exclusively* by the one process downloading the entry; the
              others wait on it, then find the entry complete: one download per machine

All locks are ``flock`` locks: the kernel drops them when their process dies, so
``kill -9`` leaves nothing that blocks anyone. A killed download leaves a ``.part`` that no
one holds; the next sweep removes it. Nothing is ever read from a ``.part``.

Space is what ``du`` counts: every file and directory under the root, a download in
progress at its full size (preallocated before its first byte arrives). Reservations are
made under ``<root>/cache.lock`` against a ledger, ``<root>/cache.usage``, which never says
less than what is on disk: a reservation adds to it before the space is used, and nothing
but a full scan lowers it. When a reservation does not fit the ledger, the directory is
scanned, stale ``.part`` files are swept, and the least recently used entries no one holds
are evicted down to a low-water mark (90% of the limit), so that scans are rare even when
the cache is full; the scan's total becomes the ledger. A crash can only leave the ledger
too high, which the next scan corrects. Recency is the mtime of ``k.meta``, touched on
every use. The indexes of remote datasets (``<root>/index/``) count too.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import importlib.util
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tidal.errors import StorageError
from tidal.storage.stats import Stats

GLOBAL_LOCK = "cache.lock"
LEDGER = "cache.usage"
LOW_WATER = 0.9  # a scan that must evict evicts down to this share of the limit
_META_SLACK = 4096  # a .meta file on disk
_DIR_SHARE = 4096  # what an entry's five names may add to its directory: at most a block
_HASH_TRIES = 3  # downloads of one entry that may fail their size or hash check


@dataclass(frozen=True)
class Entry:
    """A remote file as the cache knows it: ``hash`` is ``"algo:hex"`` when the index has one."""

    url: str
    size: int
    version: str | None = None
    hash: str | None = None

    @property
    def key(self) -> str:
        return hashlib.sha1(f"{self.url}\n{self.version or self.size}".encode()).hexdigest()

    @property
    def algorithm(self) -> str:
        return self.hash.split(":", 1)[0] if self.hash else default_algorithm()


# writes the whole file into the given path; returns its "algo:hex" digest when given an algorithm
Fill = Callable[[Path, str | None], str | None]


class _NoRoom(Exception):
    """No room in the cache, and the caller would not wait for it."""


class Handle:
    """A cached file held open for use: it cannot be evicted until :meth:`release`."""

    def __init__(self, path: Path, fd: int, digest: str | None, fresh: bool = False):
        self.path, self._fd, self.digest = path, fd, digest
        self.fresh = fresh  # not in the cache when asked for: downloaded by us, or by another process meanwhile

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> Handle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:
        self.release()


class _Files:
    def __init__(self, root: Path, key: str):
        d = root / "shards"
        self.dir = d
        self.shard, self.meta, self.part = d / f"{key}.shard", d / f"{key}.meta", d / f"{key}.part"
        self.use, self.fetch = d / f"{key}.use", d / f"{key}.fetch"


def _lock(path: Path, how: int) -> int | None:
    """An fd of ``path`` locked with ``how``; None if ``LOCK_NB`` and it is busy.

    The lock is taken on the file the path names *after* locking: an evictor may have
    unlinked the path while we waited, and a lock on an unlinked file protects nothing.
    """
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, how)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)


def _usage(st: os.stat_result) -> int:
    return max(st.st_size, st.st_blocks * 512)


class Cache:
    """The cache directory ``root``, holding at most ``limit`` bytes on disk.

    >>> cache = Cache(Path("~/.cache/tidal/shards").expanduser(), limit=50 * 10**9)
    >>> with cache.acquire(Entry(url, size, etag), fill) as handle:
    ...     open(handle.path, "rb")        # complete, checked, and not evicted while held
    """

    def __init__(
        self, root: Path, limit: int, stats: Stats | None = None, *, verify: bool = False, hashes: bool = False
    ):
        self.root = Path(root)
        self.limit = limit
        self.stats = stats if stats is not None else Stats()
        self.verify = verify  # re-hash a cached file before its first use in this process
        self._scanned = False  # whether this process has recounted the cache yet
        self.hashes = hashes  # hash every download (else only those the index has a hash for, or verify)
        self._verified: set[str] = set()
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot create the shard cache {self.root}: {exc}") from None

    # -- use -------------------------------------------------------------------------

    def lookup(self, entry: Entry) -> Handle | None:
        """The entry, held, if it is complete in the cache; never downloads."""
        f = _Files(self.root, entry.key)
        if not f.meta.exists():
            return None
        fd = _lock(f.use, fcntl.LOCK_SH)
        assert fd is not None
        meta = self._valid(f, entry)
        if meta is None:
            os.close(fd)
            return None
        return Handle(f.shard, fd, meta.get("hash"))

    def acquire(self, entry: Entry, fill: Fill, *, wait: float = 300.0) -> Handle | None:
        """The entry, held: from the cache, or filled by ``fill`` (once per machine) and kept.

        With ``wait=0`` the call returns None instead of waiting for room in the cache
        (for prefetching); otherwise it waits up to ``wait`` seconds for readers elsewhere
        to release enough, then raises :class:`StorageError`.
        """
        if _footprint(entry.size) > self.limit:
            raise StorageError(
                f"{entry.url}: {entry.size:,} bytes do not fit in the cache_limit of {self.limit:,} bytes",
                url=entry.url,
            )
        f = _Files(self.root, entry.key)
        f.dir.mkdir(exist_ok=True)
        use = _lock(f.use, fcntl.LOCK_SH)
        assert use is not None
        try:
            meta = self._valid(f, entry)
            if meta is not None:
                return Handle(f.shard, use, meta.get("hash"))
            fetch = _lock(f.fetch, fcntl.LOCK_EX)  # another process may be filling it: wait
            assert fetch is not None
            try:
                meta = self._valid(f, entry)
                if meta is not None:  # it was: done once, by them
                    return Handle(f.shard, use, meta.get("hash"), fresh=True)
                try:
                    digest = self._fill(f, entry, fill, wait)
                except _NoRoom:
                    os.close(use)
                    return None
                return Handle(f.shard, use, digest, fresh=True)
            finally:
                os.close(fetch)
        except BaseException:
            os.close(use)
            raise

    def _fill(self, f: _Files, entry: Entry, fill: Fill, wait: float) -> str | None:
        """Download into ``k.part``, check it, rename it into place. Holds ``k.fetch``."""
        last = ""
        for _ in range(_HASH_TRIES):
            for p in (f.meta, f.shard, f.part):  # a stale or rejected copy: ours to replace
                p.unlink(missing_ok=True)
            if not self._reserve(f, entry, wait):
                raise _NoRoom
            try:
                wanted = entry.hash is not None or self.verify or self.hashes
                digest = fill(f.part, entry.algorithm if wanted else None)
                size = os.stat(f.part).st_size
                if size != entry.size or (entry.hash is not None and digest != entry.hash):
                    self.stats.add(corrupt=1)
                    got = f"{size:,} bytes" if size != entry.size else digest
                    problem = f"expected {entry.size:,} bytes" if size != entry.size else f"expected {entry.hash}"
                    last = f"{entry.url}: the download does not match the index ({problem}, got {got})"
                    continue
                os.replace(f.part, f.shard)
            except BaseException:
                f.part.unlink(missing_ok=True)
                raise
            st = os.stat(f.shard)
            meta = {"url": entry.url, "version": entry.version, "size": entry.size, "hash": digest}
            meta.update(placed_size=st.st_size, placed_mtime_ns=st.st_mtime_ns)
            tmp = f.meta.with_name(f.meta.name + f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(meta))
            os.replace(tmp, f.meta)
            self._verified.add(f.shard.name)
            return digest
        f.part.unlink(missing_ok=True)
        raise StorageError(f"{last}; tried {_HASH_TRIES} times", url=entry.url, attempts=_HASH_TRIES)

    def _valid(self, f: _Files, entry: Entry) -> dict | None:
        """The meta of a complete, unaltered copy of ``entry``; None (and the copy removed) otherwise.

        The caller holds ``k.use``. Checked: the meta says this URL, version and size (and
        hash, when the index has one), and the file still has the size and mtime it had
        when placed. With ``verify``, the first use in this process also re-hashes it.
        """
        try:
            meta = json.loads(f.meta.read_text())
            st = os.stat(f.shard)
        except (OSError, ValueError):
            return None
        ok = (
            meta.get("url") == entry.url
            and meta.get("size") == entry.size
            and st.st_size == entry.size == meta.get("placed_size")
            and st.st_mtime_ns == meta.get("placed_mtime_ns")
            and (entry.hash is None or meta.get("hash") == entry.hash)
        )
        if ok and self.verify and f.shard.name not in self._verified:
            recorded = meta.get("hash")
            if recorded is None:  # placed without a hash: nothing to check it against, so fetch it again
                f.meta.unlink(missing_ok=True)
                return None
            ok = recorded == file_digest(f.shard, recorded.split(":", 1)[0])
            if ok:
                self._verified.add(f.shard.name)
        if not ok:
            self.stats.add(corrupt=1)
            f.meta.unlink(missing_ok=True)  # the next filler replaces the shard itself
            return None
        with contextlib.suppress(OSError):
            os.utime(f.meta)  # most recently used
        return meta

    # -- space -----------------------------------------------------------------------

    def _reserve(self, f: _Files, entry: Entry, wait: float) -> bool:
        """Make room for ``entry`` and preallocate its ``.part``; False if there is none and ``wait`` is 0."""
        need = _footprint(entry.size)
        deadline = time.monotonic() + wait
        pause = 0.05
        while True:
            with self._space() as ledger:
                if ledger.fits(need):
                    try:
                        self._preallocate(f.part, entry.size)
                        ledger.add(need)
                        return True
                    except OSError as exc:
                        if exc.errno != errno.ENOSPC:
                            raise StorageError(f"cannot write to the shard cache {self.root}: {exc}") from None
                        if not ledger.evict_one():
                            raise StorageError(
                                f"{entry.url}: the disk of the shard cache {self.root} is full "
                                "and nothing in the cache can be evicted",
                                url=entry.url,
                            ) from None
                        continue
            if wait <= 0:
                return False
            if time.monotonic() > deadline:
                raise StorageError(
                    f"{entry.url}: no room in the shard cache {self.root} for {entry.size:,} bytes after "
                    f"{wait:.0f}s: readers hold shards that fill the cache_limit of {self.limit:,} bytes; "
                    "raise cache_limit or use fewer readers per machine",
                    url=entry.url,
                )
            time.sleep(pause)
            pause = min(1.0, pause * 2)

    def make_room(self, nbytes: int) -> None:
        """Count ``nbytes`` about to be written into the cache directory that are not an entry
        (an index), evicting what no one holds to fit them, as far as that goes."""
        with self._space() as ledger:
            ledger.fits(nbytes)
            ledger.add(nbytes)

    @contextlib.contextmanager
    def _space(self) -> Iterator[_Ledger]:
        held = _lock(self.root / GLOBAL_LOCK, fcntl.LOCK_EX)
        assert held is not None
        try:
            yield _Ledger(self)
        finally:
            os.close(held)

    @staticmethod
    def _preallocate(path: Path, size: int) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            if size:
                try:
                    os.posix_fallocate(fd, 0, size)
                except OSError as exc:
                    if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                        raise
                    os.ftruncate(fd, size)
        finally:
            os.close(fd)

    def usage(self) -> int:
        """Bytes the cache takes on disk now, by a full scan (what ``du`` counts)."""
        return sum(e[1] for e in self._scan().values()) + self._fixed()

    def _fixed(self) -> int:
        """Bytes on disk that are not entries: the directories, the ledger, the remote indexes."""
        total = 0
        for d in (self.root, self.root / "shards", self.root / "index"):
            with contextlib.suppress(FileNotFoundError):
                total += _usage(os.stat(d))
                if d.name != "shards":
                    total += sum(_usage(e.stat()) for e in os.scandir(d) if e.is_file())
        return total

    def _scan(self) -> dict[str, tuple[float, int, bool]]:
        """``{key: (last use, bytes on disk, complete)}`` of every entry."""
        out: dict[str, tuple[float, int, bool]] = {}
        try:
            files = list(os.scandir(self.root / "shards"))
        except FileNotFoundError:
            return out
        for e in files:
            key, _, kind = e.name.partition(".")
            try:
                st = e.stat()
            except FileNotFoundError:
                continue
            used, size, complete = out.get(key, (0.0, 0, False))
            if kind == "meta":
                used, complete = st.st_mtime, True
            elif kind == "part":  # a download in progress: its meta file is still to come
                used, size = max(used, st.st_mtime), size + _META_SLACK
            out[key] = (used, size + _usage(st), complete)
        return out

    def _evict(self, key: str, *, count: bool) -> bool:
        """Remove entry ``key`` if no one holds it; whether it was removed."""
        f = _Files(self.root, key)
        fd = _lock(f.use, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if fd is None:
            return False
        try:
            for p in (f.meta, f.shard, f.part, f.fetch, f.use):  # the lock file last, still locked
                p.unlink(missing_ok=True)
        finally:
            os.close(fd)
        if count:
            self.stats.add(evictions=1)
        return True


class _Ledger:
    """The cache's space, as seen under ``cache.lock``: an upper bound of what is on disk."""

    def __init__(self, cache: Cache):
        self.cache = cache
        self.path = cache.root / LEDGER
        try:
            self.used: int | None = int(self.path.read_text())
        except (OSError, ValueError):
            self.used = None  # first use, or damaged: scan
        if not cache._scanned:
            self.used = None  # each process scans once, first: it sweeps what dead ones left

    def fits(self, need: int) -> bool:
        """Whether ``need`` more bytes fit, scanning and evicting when the ledger says they do not."""
        if self.used is not None and self.used + need <= self.cache.limit:
            return True
        self._scan(need)
        assert self.used is not None
        return self.used + need <= self.cache.limit

    def _scan(self, need: int) -> None:
        """Recount the disk; sweep stale downloads; evict LRU entries no one holds down to the low-water mark."""
        cache = self.cache
        if not self.path.exists():
            self._write(0)  # the ledger file takes space too: let the scan see it
        entries = cache._scan()
        total = sum(e[1] for e in entries.values()) + cache._fixed()
        target = min(cache.limit, int(cache.limit * LOW_WATER)) - need
        for key, (_, size, complete) in sorted(entries.items(), key=lambda kv: kv[1][0]):
            if complete and total <= target:
                continue  # stale .part files and lock files of dead processes go whatever the room
            if cache._evict(key, count=complete):
                total -= size
        self.used = total
        self._write(total)
        cache._scanned = True

    def evict_one(self) -> bool:
        for key, (_, _, complete) in sorted(self.cache._scan().items(), key=lambda kv: kv[1][0]):
            if complete and self.cache._evict(key, count=True):
                self.used = None
                self._scan(0)
                return True
        return False

    def add(self, nbytes: int) -> None:
        assert self.used is not None
        self.used += nbytes
        self._write(self.used)

    def _write(self, value: int) -> None:
        # in place, not by rename: a second file would take a block the ledger does not count;
        # a torn write reads as damaged, which only costs a scan
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            data = str(value).encode()
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))
        finally:
            os.close(fd)


def _footprint(size: int) -> int:
    """What an entry of ``size`` bytes takes on disk: its blocks, its meta file, its names."""
    return -(-size // 4096) * 4096 + _META_SLACK + _DIR_SHARE


def file_digest(path: Path, algorithm: str) -> str:
    """``"algo:hex"`` of a file's bytes."""
    with open(path, "rb") as fh:
        return f"{algorithm}:{hashlib.file_digest(fh, lambda: hasher(algorithm)).hexdigest()}"


def hasher(algorithm: str) -> Any:
    """A hash object: ``xxh3_128``, ``xxh64`` (xxhash, which the remote extras install) or any of hashlib's."""
    if algorithm.startswith("xxh"):
        try:
            import xxhash
        except ImportError:
            raise StorageError(f"shards hashed with {algorithm} need xxhash: pip install xxhash") from None
        return getattr(xxhash, algorithm)()
    return hashlib.new(algorithm)


def default_algorithm() -> str:
    """What tidal hashes downloads with when the index names no algorithm: xxh3-128 (16 GB/s)
    where xxhash is installed, else SHA-256 (1.5 GB/s): on a fast link, hashing is a real cost."""
    return "xxh3_128" if importlib.util.find_spec("xxhash") is not None else "sha256"
