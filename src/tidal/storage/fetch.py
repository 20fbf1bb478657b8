"""Remote files made local: fetched into the shard cache, or read in place by byte ranges.

A shard is downloaded as ranged GETs of ``part_size`` bytes, ``parallel`` of them in
flight, written in order into the cache's preallocated ``.part`` and hashed on the way.
Each part is a request of its own, with its own timeout and retries, so one reset costs one
part, not the shard. A part that comes back short is retried; a file that ends up with the
wrong size, or a hash other than the index's, is rejected by the cache and fetched again.

:class:`RangeFile` is the other way: a seekable file whose reads are ranged GETs, for
reading a few columns or row groups of a large Parquet file without downloading all of it.
"""

from __future__ import annotations

import io
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from tidal.errors import ArgumentError, StorageError
from tidal.storage.cache import Cache, Entry, Handle, hasher
from tidal.storage.config import Storage
from tidal.storage.fs import Remote
from tidal.storage.retry import redact
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
        self._remotes: dict[str, Remote] = {}
        self._parts: ThreadPoolExecutor | None = None
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
        return self.cache.acquire(entry, fill, wait=wait, pin=pin, reserved=reserved)

    def lookup(self, entry: Entry) -> Handle | None:
        """A held local copy if the cache has one; never downloads."""
        return self.cache.lookup(entry)

    def _download(self, entry: Entry, path: Path, algorithm: str | None) -> str | None:
        if self._closed:  # a prefetch that had not started when its reader was closed
            url = redact(entry.url)
            raise StorageError(f"{url}: download abandoned: its reader was closed", url=url)
        remote = self.remote(entry.url)
        if entry.check:
            _check_unchanged(remote, entry)
        digest = hasher(algorithm) if algorithm is not None else None
        size, part = entry.size, self.storage.part_size
        with open(path, "r+b") as out:
            if size <= part or remote.ignores_ranges(entry.url):  # whole, in one GET
                data = remote.cat(entry.url, 0, size) if size else b""  # ranged: no HEAD first
                out.write(data)
                if digest is not None:
                    digest.update(data)
            else:
                first = b""
                if remote.protocol in ("http", "https") and not remote.honours_ranges(entry.url):
                    # a web server may ignore Range (and send all of it): the first part alone says, before more go
                    first = remote.get(entry.url, 0, part, size=size)[1]
                    out.write(first)
                    if digest is not None:
                        digest.update(first)
                pool = self._pool()
                starts = iter(range(len(first), size, part))
                window: deque[Future[bytes]] = deque()

                def submit() -> None:
                    start = next(starts, None)
                    if start is not None:
                        window.append(pool.submit(remote.cat, entry.url, start, min(start + part, size)))

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
        return None if digest is None else f"{algorithm}:{digest.hexdigest()}"

    def _pool(self) -> ThreadPoolExecutor:
        if self._closed:
            raise StorageError("download abandoned: its reader was closed")
        if self._parts is None:
            self._parts = ThreadPoolExecutor(self.storage.parallel * 2, thread_name_prefix="tidal-part")
        return self._parts

    def range_file(self, url: str, size: int) -> RangeFile:
        return RangeFile(self.remote(url), url, size, self.stats)

    def ranged_reads(self, url: str) -> bool:
        """Whether reading a few parts of ``url`` in place moves fewer bytes than fetching it: not
        from a server that ignores ``Range`` (each read would bring the whole file)."""
        return not self.remote(url).ignores_ranges(url)

    def close(self) -> None:
        self._closed = True
        if self._parts is not None:
            self._parts.shutdown(wait=False, cancel_futures=True)
            self._parts = None


def _check_unchanged(remote: Remote, entry: Entry) -> None:
    """A shard listed from a published index is the file that index counted, or an error."""
    now = remote.stat(entry.url)
    if now.size != entry.size or (entry.version is not None and now.version != entry.version):
        url = redact(entry.url)
        raise StorageError(
            f"{url} changed since the dataset's index was published ({entry.size:,} bytes, version "
            f"{entry.version}; now {now.size:,} bytes, version {now.version}): publish it again with "
            "`tidal index` (or pass a new index_url)",
            url=url,
        )


class RangeFile(io.RawIOBase):
    """A read-only, seekable view of a remote file: every read is one ranged GET, retried; from a
    server that ignores ``Range``, the whole file in one GET, every read served from it.

    >>> pq.ParquetFile(fetcher.range_file(url, size))   # reads the footer, then only what is asked
    """

    def __init__(self, remote: Remote, url: str, size: int, stats: Stats):
        super().__init__()
        self._remote, self.url, self.size, self._stats = remote, url, size, stats
        self._pos = 0
        self._whole: bytes | None = None  # all of the file, where its server ignores Range

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
        t0 = time.monotonic()
        if self._whole is None and self._remote.ignores_ranges(self.url):  # the server sends all: once
            self._whole = self._remote.cat(self.url, size=self.size)
        if self._whole is not None:
            data = self._whole[self._pos : self._pos + n]
        else:
            at, data = self._remote.get(self.url, self._pos, self._pos + n, size=self.size)
            if at != self._pos or len(data) == self.size:  # the whole file (a server that ignores Range): kept
                self._whole, data = data, data[self._pos : self._pos + n]
        self._stats.add(io_wait_s=time.monotonic() - t0)
        memoryview(buffer).cast("B")[:n] = data
        self._pos += n
        return n

    def readall(self) -> bytes:
        return self.read(self.size - self._pos) or b""
