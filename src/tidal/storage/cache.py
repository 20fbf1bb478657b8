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

Space is what ``du`` counts, bounded by a ledger under ``<root>/cache.lock`` and freed by
evicting the least recently used entries no one holds: :mod:`tidal.storage.eviction`. The
locks are :mod:`tidal.storage.locks`; the digests downloads are checked against,
:mod:`tidal.storage.digests`. The indexes of remote datasets (``<root>/index/``) count too.

Nothing here is ever world-writable, whatever the umask (:mod:`tidal.storage.disk`). A directory that cannot be written, or
a disk that fills up, is a :class:`~tidal.errors.StorageError` naming the directory; a
download that fails half-way leaves only a ``.part``, which is never read.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from tidal.errors import StorageError, TidalError
from tidal.storage.digests import default_algorithm, file_digest
from tidal.storage.disk import DIR_MODE, FILE_MODE, mkdirs, write_error, write_file
from tidal.storage.eviction import GLOBAL_LOCK, Ledger, fixed, fixed_on_disk, footprint, scan
from tidal.storage.locks import EntryFiles, hold, lock
from tidal.storage.retry import redact
from tidal.storage.stats import Stats

T = TypeVar("T")

_HASH_TRIES = 3  # downloads of one entry that may fail their size or hash check
DISK_FULL_WAIT = 5.0  # seconds a reader waits for held entries to go before a full disk is an error


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
            raise StorageError(write_error(self.root, exc)) from None

    # -- use -------------------------------------------------------------------------

    def lookup(self, entry: Entry) -> Handle | None:
        """The entry, held, if it is complete in the cache; never downloads."""
        f = EntryFiles(self.root, entry.key)
        if not f.meta.exists():
            return None
        fd = lock(f.use, fcntl.LOCK_SH)
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
        f = EntryFiles(self.root, entry.key)
        use = self._writable(lambda: hold(f))
        try:
            meta = self._valid(f, entry)
            if meta is not None:
                handle = Handle(f.shard, use, meta.get("hash"))
            else:
                fetch = lock(f.fetch, fcntl.LOCK_EX)  # another process may be filling it: wait
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
            pinned = lock(f.pin, fcntl.LOCK_SH)
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
            raise StorageError(write_error(self.root, exc)) from None

    def _fill(self, f: EntryFiles, entry: Entry, fill: Fill, wait: float, reserved: int) -> str | None:
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
                    write_file(tmp, json.dumps(meta).encode())
                    os.replace(tmp, f.meta)
                finally:
                    tmp.unlink(missing_ok=True)
            except BaseException as exc:
                for p in (f.meta, f.shard, f.part):
                    p.unlink(missing_ok=True)
                if isinstance(exc, OSError) and not isinstance(exc, TidalError):  # the disk, not the store
                    raise StorageError(f"{url}: {write_error(self.root, exc)}", url=url) from None
                raise
            self._verified.add(f.shard.name)
            return digest
        f.part.unlink(missing_ok=True)
        raise StorageError(f"{last}; tried {_HASH_TRIES} times", url=url, attempts=_HASH_TRIES)

    def _valid(self, f: EntryFiles, entry: Entry) -> dict | None:
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

    def _reserve(self, f: EntryFiles, entry: Entry, wait: float, reserved: int) -> bool:
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
                            raise StorageError(f"{url}: {write_error(self.root, exc)}", url=url) from None
                        if ledger.evict_one(force):  # the disk is fuller than the limit: make room on it
                            continue
                        if not force:
                            return False
                        if time.monotonic() >= full_until:
                            raise StorageError(
                                f"{url}: {write_error(self.root, exc)}; nothing in the cache can be evicted",
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
    def _space(self) -> Iterator[Ledger]:
        held = self._writable(lambda: lock(self.root / GLOBAL_LOCK, fcntl.LOCK_EX))
        assert held is not None
        ledger = Ledger(self.root, self.limit, self.stats, scanned=self._scanned)
        try:
            yield ledger
        finally:
            self._scanned = self._scanned or ledger.scanned
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
        return sum(e[1] for e in scan(self.root).values()) + fixed_on_disk(self.root)

    def fixed(self) -> int:
        """Bytes kept for what is not an entry, which no eviction frees: the directories, the
        ledger, the remote indexes, and two blocks in which the directories may grow."""
        return fixed(self.root)
