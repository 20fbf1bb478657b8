"""Remote files made local: fetched into the shard cache, or read in place by byte ranges.

A shard is downloaded as ranged GETs of ``part_size`` bytes, ``parallel`` of them in
flight, written in order into the cache's preallocated ``.part`` and hashed on the way.
Each part is a request of its own, with its own timeout and retries, so one reset costs one
part, not the shard. A part that comes back short is retried; a file that ends up with the
wrong size, or a hash other than the index's, is rejected by the cache and fetched again.

A remote file is read as the size and version (ETag, generation) its listing or index gave.
An object that is no longer that one is never read as if it were, nor retried as if the
network had failed: a part cut short, a range past the end, a hash other than the index's or a
"not found" sends one HEAD to ask the store, and an object replaced or deleted since it was
listed is a :class:`StorageError` at once that says so (:func:`changed`, :func:`gone`). A
cached copy of a file whose version comes from a published index (``Entry.check``) is used only
once the store has said it still has that version: one HEAD the first time a reader opens it,
which a download does anyway before its GETs.

:class:`RangeFile` is the other way: a seekable file whose reads are ranged GETs, for
reading the row groups a block needs of a large Parquet file, or the lines of a slice of a large
line file (from the index's line offsets), without downloading all of it. What the first batches
of a reader's first block read by point reads is :class:`Kept` in memory until the block, read
behind them, has read it again: those bytes come over the network once.
"""

from __future__ import annotations

import io
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

from tidal import fork_safe
from tidal.errors import ArgumentError, SourceError, StorageError
from tidal.pools import Threads
from tidal.storage.cache import Cache, Entry, Handle
from tidal.storage.config import Storage
from tidal.storage.digests import hasher
from tidal.storage.fs import FileStat, Remote
from tidal.storage.refusals import not_found
from tidal.storage.retry import Truncated, code_and_status, redact
from tidal.storage.stats import Stats
from tidal.storage.urls import protocol


class Fetcher:
    """Downloads remote files into the cache of ``storage``; one per process and reader.

    >>> fetcher = Fetcher(Storage(options={"anon": True}))
    >>> with fetcher.acquire(Entry("s3://bucket/a.jsonl", size, etag)) as handle:
    ...     handle.path                        # a complete local copy, held while in use
    """

    def __init__(self, storage: Storage, stats: Stats | None = None, *, data: bool = True):
        self.storage = storage
        self.data = data  # fetches for reading (else: for indexing, in the process that builds the dataset)
        self.stats = stats if stats is not None else Stats()
        self.cache = Cache(storage.root, storage.limit, self.stats, verify=storage.verify, hashes=not data)
        self.kept = Kept()  # ranges read by point reads, for the block read behind them
        self._remotes: dict[str, Remote] = {}
        self._confirmed: set[str] = set()  # keys of entries the store said it still has, as indexed
        self._parts: Threads | None = None
        self._closed = False

    def remote(self, url: str) -> Remote:
        proto = protocol(url)
        if proto is None:
            raise ArgumentError(f"{redact(url)} is not a remote URL")
        if proto not in self._remotes:
            self._remotes[proto] = Remote(proto, self.storage, self.stats, data=self.data)
        return self._remotes[proto]

    def acquire(self, entry: Entry, *, wait: float = 300.0, pin: bool = False, reserved: int = 0) -> Handle | None:
        """A held local copy of ``entry``: from the cache, or downloaded once per machine.

        ``wait=0``: None instead of waiting for room in the cache (prefetching); ``pin`` and
        ``reserved``: see :meth:`tidal.storage.cache.Cache.acquire`."""
        fill = lambda path, algo: self._download(entry, path, algo)  # noqa: E731
        return self._trusted(entry, self.cache.acquire(entry, fill, wait=wait, pin=pin, reserved=reserved))

    def lookup(self, entry: Entry) -> Handle | None:
        """A held local copy if the cache has one; never downloads."""
        return self._trusted(entry, self.cache.lookup(entry))

    def _trusted(self, entry: Entry, handle: Handle | None) -> Handle | None:
        """``handle``, once the store has said it still has ``entry`` as its index says
        (``Entry.check``: one HEAD, the first time this reader uses the entry); released, and
        the error raised, where it has not."""
        if handle is None or not entry.check or entry.key in self._confirmed:
            return handle
        try:
            self._confirm(self.remote(entry.url), entry)
        except BaseException:
            handle.release()
            raise
        return handle

    def _confirm(self, remote: Remote, entry: Entry) -> None:
        """One HEAD: the store still has ``entry`` at the size and version it was listed with, or
        a :class:`StorageError` that says it changed or is gone."""
        now = _stat(remote, entry)
        if now.size != entry.size or (entry.version is not None and now.version != entry.version):
            raise changed(entry, now)
        self._confirmed.add(entry.key)

    def _vet(self, remote: Remote, entry: Entry, exc: BaseException | None) -> None:
        """Where a failed GET (``exc``; None: a download whose hash is not the index's) may mean
        the object is no longer the one listed, ask the store (one HEAD) and raise what it says:
        it changed, or it is gone. Otherwise return, and the failure is what it seemed."""
        if exc is not None and not_found(exc):
            raise gone(entry, remote._no_bucket(entry.url, exc))  # its bucket may be what is gone: then it says so
        if exc is not None and not _suspect(exc):
            return
        now = _stat(remote, entry)
        if now.size != entry.size or (entry.version is not None and now.version != entry.version):
            raise changed(entry, now)

    def _download(self, entry: Entry, path: Path, algorithm: str | None) -> str | None:
        if self._closed:  # a prefetch that had not started when its reader was closed
            url = redact(entry.url)
            raise StorageError(f"{url}: download abandoned: its reader was closed", url=url)
        remote = self.remote(entry.url)
        if entry.check:
            self._confirm(remote, entry)
        digest = hasher(algorithm) if algorithm is not None else None
        size, part = entry.size, self.storage.part_size
        check = lambda exc: self._vet(remote, entry, exc)  # noqa: E731

        def get(start: int, end: int) -> bytes:
            return remote.cat(entry.url, start, end, check=check)

        with open(path, "r+b") as out:
            kept = self.kept.get(entry.url, 0, size) if size else None  # a point read brought it whole
            if kept is not None or size <= part or remote.ignores_ranges(entry.url):  # whole, in one GET
                data = kept if kept is not None else get(0, size) if size else b""  # ranged: no HEAD first
                out.write(data)
                if digest is not None:
                    digest.update(data)
            else:
                first = b""
                if remote.protocol in ("http", "https") and not remote.honours_ranges(entry.url):
                    # a web server may ignore Range (and send all of it): the first part alone says, before more go
                    first = remote.get(entry.url, 0, part, size=size, check=check)[1]
                    out.write(first)
                    if digest is not None:
                        digest.update(first)
                pool = self._pool()
                starts = iter(range(len(first), size, part))
                window: deque[Future[bytes]] = deque()

                def submit() -> None:
                    start = next(starts, None)
                    if start is not None:
                        window.append(pool.submit(get, start, min(start + part, size)))

                for _ in range(self.storage.parallel):
                    submit()
                try:
                    while window:
                        data = window.popleft().result()
                        submit()
                        out.write(data)
                        if digest is not None:
                            digest.update(data)
                finally:
                    for fut in window:
                        fut.cancel()
            out.truncate()  # whatever was preallocated beyond what came
        found = None if digest is None else f"{algorithm}:{digest.hexdigest()}"
        if entry.hash is not None and found != entry.hash:
            self._vet(remote, entry, None)  # replaced by a file of the same size? else the cache fetches it again
        return found

    def _pool(self) -> Threads:
        if self._closed:
            raise StorageError("download abandoned: its reader was closed")
        if self._parts is None:
            self._parts = Threads(self.storage.parallel * 2, thread_name_prefix="tidal-part")
        return self._parts

    def range_file(
        self, url: str, size: int, version: str | None = None, *, check: bool = False, window: int = 0
    ) -> RangeFile:
        """Ranged reads of the file ``url`` listed (or, ``check``, indexed) with ``size`` and
        ``version``: one that is no longer that file is an error, never read as if it were.
        ``window``: reads rounded out to windows of that many bytes (see :class:`RangeFile`)."""
        entry = Entry(url, size, version, check=check)
        remote = self.remote(url)
        if check and entry.key not in self._confirmed:
            self._confirm(remote, entry)
        check_read = lambda exc: self._vet(remote, entry, exc)  # noqa: E731
        return RangeFile(remote, url, size, self.stats, check=check_read, kept=self.kept, window=window)

    def ranged_reads(self, url: str) -> bool:
        """Whether reading a few parts of ``url`` in place moves fewer bytes than fetching it: not
        from a server that ignores ``Range`` (each read would bring the whole file)."""
        return not self.remote(url).ignores_ranges(url)

    def close(self) -> None:
        self._closed = True
        if self._parts is not None:
            self._parts.shutdown(wait=False, cancel_futures=True)
            self._parts = None


def _stat(remote: Remote, entry: Entry) -> FileStat:
    """What the store says of ``entry``'s object now (one HEAD, retried); :func:`gone` if nothing.
    Asked of the store itself: a listing's answers that the client keeps (s3fs, gcsfs and adlfs
    do) are dropped first."""
    try:
        remote.fs.invalidate_cache(remote.path(entry.url))
        return remote.stat(entry.url)
    except SourceError as exc:  # its bucket may be what is gone: then it says so
        raise gone(entry, str(exc) if "does not exist" in str(exc) else None) from None


def _suspect(exc: BaseException) -> bool:
    """Whether a failed GET may mean the object is not the one listed: a body shorter than the
    range asked for, a range the object does not reach (416), a precondition that failed (412)."""
    e: BaseException | None = exc
    for _ in range(6):
        if e is None:
            return False
        if isinstance(e, Truncated) or type(e).__name__ == "RangeIgnored":  # shorter, or neither range nor whole
            return True
        code, status = code_and_status(e)
        if status in (412, 416) or code in ("InvalidRange", "PreconditionFailed"):
            return True
        if "Range Not Satisfiable" in str(e) or "InvalidRange" in str(e):
            return True
        e = e.__cause__ or e.__context__
    return False


def _listed(entry: Entry) -> tuple[str, str]:
    """How ``entry`` was listed, in words, and where to look again."""
    version = f", version {entry.version}" if entry.version is not None else ""
    if entry.check:
        return (
            f"since the dataset's index was published ({entry.size:,} bytes{version})",
            "publish it again with `tidal index` (or pass a new index_url)",
        )
    return (
        f"since the dataset was listed ({entry.size:,} bytes{version})",
        "open the dataset again (tidal.Dataset lists and counts it afresh) to read it as it is now",
    )


def changed(entry: Entry, now: FileStat) -> StorageError:
    """The object at ``entry.url`` is another one than was listed: never read as if it were."""
    url = redact(entry.url)
    since, fix = _listed(entry)
    version = f", version {now.version}" if now.version is not None else ""
    return StorageError(
        f"{url} changed {since}; the store has {now.size:,} bytes{version} now: {fix}", url=url, permanent=True
    )


def gone(entry: Entry, why: str | None = None) -> StorageError:
    """The object at ``entry.url`` is not on the store any more (deleted or moved since it was
    listed); ``why``: what the store said, where it says more (its bucket does not exist)."""
    url = redact(entry.url)
    since, fix = _listed(entry)
    said = f" ({why.removeprefix(f'{url}: ')})" if why else ""
    return StorageError(f"{url} is gone from the store{said}: deleted or moved {since}: {fix}", url=url, permanent=True)


KEPT_BYTES = 256 << 20  # the most that point reads keep for the block behind them
# A Parquet footer is read from the file's end: its length, then (often past the first 64 KB
# pyarrow reads) the footer again. So the first read that ends at a file's end reads this much,
# or 1/64 of the file if less: the footer in one request, not two.
TAIL_BYTES = 256 << 10


class Kept:
    """Ranges of remote files read while :attr:`keeping` is on (a reader's point reads: the first
    batches of its first block, :mod:`tidal.stages.blocks`), served again from memory to any read
    that falls inside one (the block read behind them reads the same row groups and lines) until
    :meth:`drop`. At most :data:`KEPT_BYTES`; past that a range is not kept, only read again."""

    def __init__(self, limit: int = KEPT_BYTES):
        self.limit = limit
        self.keeping = False
        self._lock = fork_safe.Lock()
        self._ranges: dict[str, list[tuple[int, bytes]]] = {}
        self._bytes = 0

    def get(self, url: str, start: int, n: int) -> bytes | None:
        """Bytes ``[start, start + n)`` of ``url`` where a kept range holds them all, else None."""
        with self._lock:
            for at, data in self._ranges.get(url, ()):
                if at <= start and start + n <= at + len(data):
                    return data[start - at : start - at + n]
        return None

    def head(self, url: str, start: int, n: int) -> bytes:
        """The first of bytes ``[start, start + n)`` of ``url`` that kept ranges hold end to end
        (none: empty). Point reads fetch a row group a buffer at a time up to their records; the
        block behind them reads the group whole, and fetches only the rest."""
        parts: list[bytes] = []
        at, end = start, start + n
        with self._lock:
            ranges = sorted(self._ranges.get(url, ()), key=lambda r: r[0])
            for lo, data in ranges:
                if lo <= at < lo + len(data):
                    take = data[at - lo : min(len(data), end - lo)]
                    parts.append(take)
                    at += len(take)
                    if at >= end:
                        break
        return b"".join(parts)

    def put(self, url: str, start: int, data: bytes) -> None:
        """Keep ``data`` (bytes of ``url`` from ``start``) while keeping, and within the limit."""
        if not self.keeping:
            return
        with self._lock:
            if self._bytes + len(data) <= self.limit:
                self._ranges.setdefault(url, []).append((start, data))
                self._bytes += len(data)

    def drop(self) -> None:
        """Stop keeping, and let go of every range kept."""
        with self._lock:
            self.keeping = False
            self._ranges.clear()
            self._bytes = 0


class RangeFile(io.RawIOBase):
    """A read-only, seekable view of a remote file: every read is one ranged GET, retried; from a
    server that ignores ``Range``, the whole file in one GET, every read served from it.

    ``window``: reads are rounded out to windows of that many bytes, the last one kept: a line
    file is read a megabyte at a time, a GET of a few windows' worth each time; None or 0: each
    read is the range asked for (Parquet: pyarrow asks for a row group's column chunks at once).
    ``kept``: ranges a reader's point reads read, served from memory (:class:`Kept`).

    >>> pq.ParquetFile(fetcher.range_file(url, size))   # reads the footer, then only what is asked
    """

    def __init__(
        self,
        remote: Remote,
        url: str,
        size: int,
        stats: Stats,
        check: Callable[[BaseException], None] | None = None,
        *,
        kept: Kept | None = None,
        window: int = 0,
    ):
        super().__init__()
        self._remote, self.url, self.size, self._stats = remote, url, size, stats
        self._check = check  # sees a failed read's error: the file may have changed (see Fetcher.range_file)
        self._kept, self._window = kept, window
        self._pos = 0
        self._whole: bytes | None = None  # all of the file, where its server ignores Range
        self._last: tuple[int, bytes] = (0, b"")  # the last window read (with ``window``)
        self._tail: tuple[int, bytes] | None = None  # the file's last TAIL_BYTES: a footer and what it asks for
        self._tailed = False
        self._tail_bytes = min(TAIL_BYTES, size // 64)  # (never more than 1/64 of the file)

    def __repr__(self) -> str:
        return f"RangeFile({redact(self.url)!r})"

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        n = max(0, min(len(buffer), self.size - self._pos))
        if n == 0:
            return 0
        if self._window:
            at, last = self._last
            if not (at <= self._pos and self._pos + n <= at + len(last)):
                w = self._window
                lo = self._pos // w * w
                self._last = (lo, self._range(lo, min(self.size, -(-(self._pos + n) // w) * w)))
            at, last = self._last
            data = last[self._pos - at : self._pos - at + n]
        elif self._tail is not None and self._tail[0] <= self._pos:
            at, tail = self._tail
            data = tail[self._pos - at : self._pos - at + n]
        elif self._pos + n == self.size and n < self._tail_bytes and not self._tailed:  # a footer's first read
            at = self.size - self._tail_bytes
            self._tail, self._tailed = (at, self._range(at, self.size)), True
            data = self._tail[1][self._pos - at :]
        else:
            self._tail = None  # the footer is read: its memory let go
            data = self._range(self._pos, self._pos + n)
        memoryview(buffer).cast("B")[:n] = data
        self._pos += n
        return n

    def _keep_whole(self, data: bytes) -> None:
        """The whole file came: every read is served from it, and a point read's copy is kept for
        the block behind it (which, ranges being no use here, downloads the file to the cache)."""
        self._whole = data
        if self._kept is not None:
            self._kept.put(self.url, 0, data)

    def _range(self, start: int, end: int) -> bytes:
        """Bytes ``[start, end)``: kept from a point read, or one ranged GET (kept while keeping)."""
        kept = self._kept.get(self.url, start, end - start) if self._kept is not None else None
        if kept is not None:
            return kept
        head = self._kept.head(self.url, start, end - start) if self._kept is not None else b""
        if head:  # what point reads fetched of it, then the rest
            return head + self._range(start + len(head), end)
        t0 = time.monotonic()
        if self._whole is None and self._remote.ignores_ranges(self.url):  # the server sends all: once
            self._keep_whole(self._remote.cat(self.url, size=self.size, check=self._check))
        if self._whole is not None:
            data = self._whole[start:end]
        else:
            at, data = self._remote.get(self.url, start, end, size=self.size, check=self._check)
            if at != start or len(data) == self.size:  # the whole file (a server that ignores Range): kept
                self._keep_whole(data)
                data = data[start:end]
            elif self._kept is not None:
                self._kept.put(self.url, start, data)
        self._stats.add(io_wait_s=time.monotonic() - t0)
        return data

    def readall(self) -> bytes:
        return self.read(self.size - self._pos) or b""
