"""The local shard cache: whole remote files on local disk, bounded, shared, crash-safe.

One directory, shared by every process of the machine and by any number of datasets.
Each cached file is an *entry*, named by the SHA-1 of its URL and version (ETag or
modification time), so a changed object is a new entry and an old copy is never mistaken
for it. An entry ``k`` lives in ``<root>/shards/`` as up to six files:

    k.shard   the bytes, complete and checked; only ever created by a rename
    k.meta    JSON: url, version, size, hash, and the size and mtime of k.shard when it
              was placed; written (atomically) after k.shard: no meta, no entry
    k.part    a download in progress, preallocated to its full size
    k.use     a lock held *shared* by every reader using the entry; evicting needs it
              *exclusively*, so an entry in use is never evicted
    k.fetch   a lock held *exclusively* by the one process downloading the entry; the
              others wait on it, then find the entry complete: one download per machine
    k.pin     a lock held *shared* by a reader that fetched the entry ahead and will read
              it soon: a prefetch never evicts a pinned entry, a reader that needs room
              now may (the shard it needs now comes before one it needs later)

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
the cache is full; the scan's total, plus two blocks in which the directories may grow,
becomes the ledger. A crash can only leave the ledger too high, which the next scan
corrects. Recency is the mtime of ``k.meta``, touched on every use. The indexes of remote
datasets (``<root>/index/``) count too.

Nothing here is ever world-writable, whatever the umask: directories are made ``0o755``
and files ``0o644`` (less where the umask says so). A directory that cannot be written, or
a disk that fills up, is a :class:`~tidal.errors.StorageError` naming the directory; a
download that fails half-way leaves only a ``.part``, which is never read.
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
from typing import Any, TypeVar

from tidal.errors import StorageError, TidalError, needs
from tidal.storage.retry import redact
from tidal.storage.stats import Stats

T = TypeVar("T")

GLOBAL_LOCK = "cache.lock"
LEDGER = "cache.usage"
LOW_WATER = 0.9  # a scan that must evict evicts down to this share of the limit
_META_SLACK = 4096  # a .meta file on disk
_DIR_SHARE = 4096  # what an entry's six names may add to its directory: at most a block
_DIR_GROWTH = 2 * 4096  # kept free by every scan: lock files are made before their entry reserves room,
# and ext4 turns a full one-block directory into an indexed one of three blocks at once
_HASH_TRIES = 3  # downloads of one entry that may fail their size or hash check
DISK_FULL_WAIT = 5.0  # seconds a reader waits for held entries to go before a full disk is an error
DIR_MODE = 0o755  # never group- or world-writable, whatever the umask
FILE_MODE = 0o644


@dataclass(frozen=True)
class Entry:
    """A remote file as the cache knows it: ``hash`` is ``"algo:hex"`` when the index has one."""

    url: str
    size: int
    version: str | None = None
    hash: str | None = None
    check: bool = False  # compare the size and version with the store's before downloading it

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
        self.use, self.fetch, self.pin = d / f"{key}.use", d / f"{key}.fetch", d / f"{key}.pin"


def _lock(path: Path, how: int) -> int | None:
    """An fd of ``path`` locked with ``how``; None if ``LOCK_NB`` and it is busy.

    The lock is taken on the file the path names *after* locking: an evictor may have
    unlinked the path while we waited, and a lock on an unlinked file protects nothing.
    """
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, FILE_MODE)
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


def _hold(f: _Files) -> int:
    """An fd holding ``f``'s ``use`` lock shared (its directory made first, if it went)."""
    f.dir.mkdir(mode=DIR_MODE, exist_ok=True)
    fd = _lock(f.use, fcntl.LOCK_SH)
    assert fd is not None
    return fd


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
        try:  # here, once, rather than as a strange error in the middle of a download
            mkdirs(self.root)
            for d in (self.root / "shards", self.root / "index"):
                with contextlib.suppress(FileExistsError):
                    d.mkdir(mode=DIR_MODE)
            os.close(os.open(self.root / GLOBAL_LOCK, os.O_RDWR | os.O_CREAT, FILE_MODE))
        except OSError as exc:
            raise StorageError(_write_error(self.root, exc)) from None

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

    def acquire(
        self, entry: Entry, fill: Fill, *, wait: float = 300.0, pin: bool = False, reserved: int = 0
    ) -> Handle | None:
        """The entry, held: from the cache, or filled by ``fill`` (once per machine) and kept.

        With ``wait=0`` (prefetching) the call returns None instead of waiting for room in
        the cache, and evicts nothing pinned; otherwise it evicts pinned entries too if it
        must, and waits up to ``wait`` seconds for readers elsewhere to release enough, then
        raises :class:`StorageError`. ``reserved``: bytes of entries the caller holds and
        will not release while it waits; when they leave no room, it raises at once.
        ``pin``: the handle pins the entry (see the module docstring) instead of holding it.
        """
        need = footprint(entry.size)
        if need + reserved > self.limit:
            held = f" beside the {reserved:,} bytes of shards its reader holds" if reserved else ""
            raise StorageError(
                f"{redact(entry.url)}: {entry.size:,} bytes ({need:,} in the cache with its metadata) do not fit "
                f"in the cache_limit of {self.limit:,} bytes{held}: raise cache_limit",
                url=redact(entry.url),
            )
        f = _Files(self.root, entry.key)
        use = self._writable(lambda: _hold(f))
        try:
            meta = self._valid(f, entry)
            if meta is not None:
                handle = Handle(f.shard, use, meta.get("hash"))
            else:
                fetch = _lock(f.fetch, fcntl.LOCK_EX)  # another process may be filling it: wait
                assert fetch is not None
                try:
                    meta = self._valid(f, entry)
                    if meta is not None:  # it was: done once, by them
                        handle = Handle(f.shard, use, meta.get("hash"), fresh=True)
                    else:
                        try:
                            digest = self._fill(f, entry, fill, wait, reserved)
                        except _NoRoom:
                            os.close(use)
                            return None
                        handle = Handle(f.shard, use, digest, fresh=True)
                finally:
                    os.close(fetch)
        except BaseException:
            os.close(use)
            raise
        if pin:  # pinned before the hold goes: never a moment in which a prefetch could evict it
            pinned = _lock(f.pin, fcntl.LOCK_SH)
            assert pinned is not None
            os.close(use)
            handle._fd = pinned
        return handle

    def _writable(self, action: Callable[[], T]) -> T:
        """``action()``, an error writing the cache directory made a :class:`StorageError` naming it."""
        try:
            return action()
        except StorageError:
            raise
        except OSError as exc:
            raise StorageError(_write_error(self.root, exc)) from None

    def _fill(self, f: _Files, entry: Entry, fill: Fill, wait: float, reserved: int) -> str | None:
        """Download into ``k.part``, check it, rename it into place. Holds ``k.fetch``.

        Whatever fails on the way (the network, the disk, a check) removes what was
        written: only a complete, checked file with its meta is ever an entry."""
        last = ""
        url = redact(entry.url)
        for _ in range(_HASH_TRIES):
            for p in (f.meta, f.shard, f.part):  # a stale or rejected copy: ours to replace
                p.unlink(missing_ok=True)
            if not self._reserve(f, entry, wait, reserved):
                raise _NoRoom
            try:
                wanted = entry.hash is not None or self.verify or self.hashes
                digest = fill(f.part, entry.algorithm if wanted else None)
                size = os.stat(f.part).st_size
                if size != entry.size or (entry.hash is not None and digest != entry.hash):
                    self.stats.add(corrupt=1)
                    got = f"{size:,} bytes" if size != entry.size else digest
                    problem = f"expected {entry.size:,} bytes" if size != entry.size else f"expected {entry.hash}"
                    last = f"{url}: the download does not match the index ({problem}, got {got})"
                    continue
                os.replace(f.part, f.shard)
                st = os.stat(f.shard)
                meta = {"url": entry.url, "version": entry.version, "size": entry.size, "hash": digest}
                meta.update(placed_size=st.st_size, placed_mtime_ns=st.st_mtime_ns)
                tmp = f.meta.with_name(f.meta.name + f".{os.getpid()}.tmp")
                try:
                    _write_file(tmp, json.dumps(meta).encode())
                    os.replace(tmp, f.meta)
                finally:
                    tmp.unlink(missing_ok=True)
            except BaseException as exc:
                for p in (f.meta, f.shard, f.part):
                    p.unlink(missing_ok=True)
                if isinstance(exc, OSError) and not isinstance(exc, TidalError):  # the disk, not the store
                    raise StorageError(f"{url}: {_write_error(self.root, exc)}", url=url) from None
                raise
            self._verified.add(f.shard.name)
            return digest
        f.part.unlink(missing_ok=True)
        raise StorageError(f"{last}; tried {_HASH_TRIES} times", url=url, attempts=_HASH_TRIES)

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

    def _reserve(self, f: _Files, entry: Entry, wait: float, reserved: int) -> bool:
        """Make room for ``entry`` and preallocate its ``.part``; False if there is none and ``wait`` is 0.

        A reader that needs the entry now (``wait > 0``) may evict pinned entries: what
        it reads now comes before what anyone reads later. A prefetch (``wait=0``) may not."""
        need = footprint(entry.size)
        force = wait > 0
        url = redact(entry.url)
        deadline = time.monotonic() + wait
        full_until = time.monotonic() + min(wait, DISK_FULL_WAIT)
        pause = 0.05
        while True:
            with self._space() as ledger:
                while ledger.fits(need, force):
                    try:
                        self._preallocate(f.part, entry.size)
                    except OSError as exc:
                        f.part.unlink(missing_ok=True)  # a failed fallocate may leave blocks behind
                        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                            raise StorageError(f"{url}: {_write_error(self.root, exc)}", url=url) from None
                        if ledger.evict_one(force):  # the disk is fuller than the limit: make room on it
                            continue
                        if not force:
                            return False
                        if time.monotonic() >= full_until:
                            raise StorageError(
                                f"{url}: {_write_error(self.root, exc)}; nothing in the cache can be evicted",
                                url=url,
                            ) from None
                        break  # held entries may be let go in a moment (a reader closing): try again
                    ledger.add(need)
                    return True
                if force and self.fixed() + reserved + need > self.limit:
                    raise StorageError(  # only this reader's own shards could make room: waiting cannot help
                        f"{url}: no room in the shard cache {self.root} for {entry.size:,} bytes: its reader holds "
                        f"{reserved:,} bytes of shards it reads now, the index and directories take "
                        f"{self.fixed():,} with room to grow, and the cache_limit is {self.limit:,} bytes; raise cache_limit",
                        url=url,
                    )
            if not force:
                return False
            if time.monotonic() > deadline:
                raise StorageError(
                    f"{url}: no room in the shard cache {self.root} for {entry.size:,} bytes after "
                    f"{wait:.0f}s: readers hold shards that fill the cache_limit of {self.limit:,} bytes; "
                    "raise cache_limit or use fewer readers per machine",
                    url=url,
                )
            time.sleep(pause)
            pause = min(1.0, pause * 2)

    def make_room(self, nbytes: int) -> None:
        """Count ``nbytes`` about to be written into the cache directory that are not an entry
        (an index), evicting what no one holds to fit them, as far as that goes."""
        with self._space() as ledger:
            ledger.fits(nbytes, force=False)
            ledger.add(nbytes)

    @contextlib.contextmanager
    def _space(self) -> Iterator[_Ledger]:
        held = self._writable(lambda: _lock(self.root / GLOBAL_LOCK, fcntl.LOCK_EX))
        assert held is not None
        try:
            yield _Ledger(self)
        finally:
            os.close(held)

    @staticmethod
    def _preallocate(path: Path, size: int) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
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
        return sum(e[1] for e in self._scan().values()) + self._fixed_on_disk()

    def fixed(self) -> int:
        """Bytes kept for what is not an entry, which no eviction frees: the directories, the
        ledger, the remote indexes, and two blocks in which the directories may grow."""
        return self._fixed_on_disk() + _DIR_GROWTH

    def _fixed_on_disk(self) -> int:
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
        coming: set[str] = set()  # entries whose meta file is still to come
        for e in files:
            key, _, kind = e.name.partition(".")
            try:
                st = e.stat()
            except FileNotFoundError:
                if kind != "part":
                    continue
                try:  # renamed into place since the listing, which has not got the new name: count it
                    st, kind = os.stat(_Files(self.root, key).shard), "shard"
                except FileNotFoundError:
                    continue
            used, size, complete = out.get(key, (0.0, 0, False))
            if kind == "meta":
                used, complete = st.st_mtime, True
            elif kind in ("part", "shard"):  # downloading, or renamed into place: the meta is written next
                used = max(used, st.st_mtime)
                coming.add(key)
            out[key] = (used, size + _usage(st), complete)
        for key in coming:
            used, size, complete = out[key]
            if not complete:  # counted now, or a scan between the rename and the meta undercounts a block
                out[key] = (used, size + _META_SLACK, complete)
        return out

    def _evict(self, key: str, *, count: bool, pinned: bool = False) -> bool:
        """Remove entry ``key`` if no one holds it (nor pins it, unless ``pinned``); whether it was removed."""
        f = _Files(self.root, key)
        fd = _lock(f.use, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if fd is None:
            return False
        pin = None
        try:
            if not pinned:
                pin = _lock(f.pin, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if pin is None:
                    return False
            for p in (f.meta, f.shard, f.part, f.fetch, f.pin, f.use):  # the lock files last, still locked
                p.unlink(missing_ok=True)
        finally:
            if pin is not None:
                os.close(pin)
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

    def fits(self, need: int, force: bool) -> bool:
        """Whether ``need`` more bytes fit, scanning and evicting when the ledger says they do not
        (pinned entries too, with ``force``, as far as ``need`` requires)."""
        if self.used is not None and self.used + need <= self.cache.limit:
            return True
        self._scan(need, force)
        assert self.used is not None
        return self.used + need <= self.cache.limit

    def _scan(self, need: int, force: bool) -> None:
        """Recount the disk; sweep stale downloads; evict LRU entries no one holds or pins down to
        the low-water mark; with ``force``, then pinned ones until ``need`` fits."""
        cache = self.cache
        if not self.path.exists():
            self._write(0)  # the ledger file takes space too: let the scan see it
        entries = sorted(cache._scan().items(), key=lambda kv: kv[1][0])
        total = sum(e[1] for _, e in entries) + cache.fixed()
        target = min(cache.limit, int(cache.limit * LOW_WATER)) - need
        gone: set[str] = set()
        for key, (_, size, complete) in entries:
            if complete and total <= target:
                continue  # stale .part files and lock files of dead processes go whatever the room
            if cache._evict(key, count=complete):
                total -= size
                gone.add(key)
        for key, (_, size, complete) in entries:
            if not force or total + need <= cache.limit:
                break
            if complete and key not in gone and cache._evict(key, count=True, pinned=True):
                total -= size
        self.used = total
        self._write(total)
        cache._scanned = True

    def evict_one(self, force: bool) -> bool:
        """Evict the least recently used complete entry that no one holds (nor pins, unless ``force``)."""
        for pinned in (False, True) if force else (False,):
            for key, (_, _, complete) in sorted(self.cache._scan().items(), key=lambda kv: kv[1][0]):
                if complete and self.cache._evict(key, count=True, pinned=pinned):
                    self.used = None
                    self._scan(0, force=False)
                    return True
        return False

    def add(self, nbytes: int) -> None:
        assert self.used is not None
        self.used += nbytes
        self._write(self.used)

    def _write(self, value: int) -> None:
        # in place, not by rename: a second file would take a block the ledger does not count;
        # a torn write reads as damaged, which only costs a scan
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, FILE_MODE)
            try:
                data = str(value).encode()
                os.pwrite(fd, data, 0)
                os.ftruncate(fd, len(data))
            finally:
                os.close(fd)
        except OSError as exc:
            raise StorageError(_write_error(self.cache.root, exc)) from None


def footprint(size: int) -> int:
    """What an entry of ``size`` bytes takes on disk: its blocks, its meta file, its names."""
    return -(-size // 4096) * 4096 + _META_SLACK + _DIR_SHARE


def mkdirs(path: Path) -> None:
    """``mkdir -p`` that makes every level it creates ``DIR_MODE``, whatever the umask allows beyond it."""
    missing = []
    while not path.is_dir():
        missing.append(path)
        if path.parent == path:
            break
        path = path.parent
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):
            d.mkdir(mode=DIR_MODE)


def _write_file(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def _write_error(root: Path, exc: OSError) -> str:
    """What a failed write into the cache directory means, naming it."""
    why = exc.strerror or str(exc)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"the disk of the shard cache {root} is full ({why}): free space there, or set a cache_limit it can hold"
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"the shard cache {root} is not writable ({why}): give Storage(cache_dir=...) a directory this process can write"
    return f"cannot write to the shard cache {root}: {why}"


def file_digest(path: Path, algorithm: str) -> str:
    """``"algo:hex"`` of a file's bytes."""
    with open(path, "rb") as fh:
        return f"{algorithm}:{hashlib.file_digest(fh, lambda: hasher(algorithm)).hexdigest()}"


def hasher(algorithm: str) -> Any:
    """A hash object: ``xxh3_128``, ``xxh64`` (xxhash, which the remote extras install) or any of hashlib's."""
    if algorithm.startswith("xxh"):
        xxhash = needs("xxhash", f"checking shards hashed with {algorithm}", package="xxhash")
        return getattr(xxhash, algorithm)()
    return hashlib.new(algorithm)


def default_algorithm() -> str:
    """What tidal hashes downloads with when the index names no algorithm: xxh3-128 (16 GB/s)
    where xxhash is installed, else SHA-256 (1.5 GB/s): on a fast link, hashing is a real cost."""
    return "xxh3_128" if importlib.util.find_spec("xxhash") is not None else "sha256"
