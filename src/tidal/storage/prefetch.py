"""One reader's remote shards: fetched ahead in background threads, held while in use.

The read stage knows its future exactly: the epoch order says which shards the next blocks
read. It tells the :class:`Prefetcher` (``ahead``), which downloads those of them that are
not in the cache yet, up to ``Storage.prefetch`` beyond the current block, in background
threads. When the reader opens a shard (``open``) it is usually on disk already; the time
it waits when it is not is counted as ``io_wait_s``.

Only shards that a reader has open are *held* (cannot be evicted). A shard fetched ahead is
merely the most recently used one in the cache: were it held too, readers of other
processes could fill the cache with shards they do not read yet and leave none of them
room for the shard they need now. For the same reason a prefetch never waits for room.

Large Parquet shards of which the reader wants only a small share (a few columns) are not
downloaded but read in place through byte ranges (:class:`tidal.storage.fetch.RangeFile`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from tidal.storage.cache import Entry, Handle
from tidal.storage.config import Storage
from tidal.storage.fetch import Fetcher, RangeFile
from tidal.storage.stats import Stats
from tidal.storage.urls import is_remote

RANGE_MIN_BYTES = 32 << 20  # smaller files are cheaper to fetch whole
RANGE_MAX_SHARE = 0.5  # read in place when the wanted columns are under this share of the file


def entry(shard: Any) -> Entry:
    """The cache entry of a :class:`tidal.shards.Shard`."""
    return Entry(shard.path, shard.bytes, shard.version, shard.hash)


def wants_ranges(shard: Any, columns: Sequence[str] | None) -> bool:
    """Whether reading ``columns`` of ``shard`` in place moves fewer bytes than fetching it whole."""
    sizes = shard.info.get("column_bytes")
    if shard.format != "parquet" or columns is None or not sizes or shard.bytes < RANGE_MIN_BYTES:
        return False
    wanted = sum(sizes.get(c, 0) for c in columns)
    return wanted < RANGE_MAX_SHARE * shard.bytes


class Prefetcher:
    """The remote shards of one reader, by index in the plan's shard list.

    >>> pre = Prefetcher(plan.shards, storage, columns)
    >>> pre.ahead([4, 9, 2])                 # the shards of the next blocks, in order
    >>> file = pre.open(4)                   # a local path (or an opener for ranged reads)
    >>> pre.release(4)                       # when its reader is closed
    """

    def __init__(
        self,
        shards: Sequence[Any],
        storage: Storage,
        columns: Sequence[str] | None = None,
        stats: Stats | None = None,
    ):
        self._shards = shards
        self._storage = storage
        self._columns = columns
        self.stats = stats if stats is not None else Stats()
        self._fetcher = Fetcher(storage, self.stats)
        self._lock = threading.Lock()
        self._pending: dict[int, Future[bool]] = {}  # fetches ahead, running or queued
        self._held: dict[int, Handle] = {}  # shards the reader has open
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False

    def is_remote(self, index: int) -> bool:
        return is_remote(self._shards[index].path)

    def open(self, index: int) -> str | Callable[[], RangeFile]:
        """Where the reader finds shard ``index``: a held local path, or an opener of ranged reads.

        Held until :meth:`release`."""
        shard = self._shards[index]
        if wants_ranges(shard, self._columns):
            handle = self._fetcher.lookup(entry(shard))  # a whole copy already here is cheaper still
            if handle is None:
                return lambda: self._fetcher.range_file(shard.path, shard.bytes)
            self.stats.add(cache_hits=1)
        else:
            handle = self._take(index)
        with self._lock:
            old = self._held.pop(index, None)
            self._held[index] = handle
        if old is not None:
            old.release()
        return str(handle.path)

    def _take(self, index: int) -> Handle:
        """Shard ``index``, held: after its fetch ahead, if one runs, else fetched now."""
        with self._lock:
            future = self._pending.pop(index, None)
        t0 = time.monotonic()
        try:
            fresh = False
            if future is not None and not future.cancel():  # started: let it finish
                fresh = future.result()  # its error, if it failed, is the reader's
            handle = self._fetcher.acquire(entry(self._shards[index]))
            assert handle is not None
            fresh |= handle.fresh
            self.stats.add(cache_misses=int(fresh), cache_hits=int(not fresh))
            return handle
        finally:
            self.stats.add(io_wait_s=time.monotonic() - t0)

    def release(self, index: int) -> None:
        """The reader of shard ``index`` is closed: the shard may be evicted again."""
        with self._lock:
            handle = self._held.pop(index, None)
        if handle is not None:
            handle.release()

    @property
    def closed(self) -> bool:
        return self._closed

    def ahead(self, now: Iterable[int], later: Iterable[int]) -> None:
        """Fetch in the background the shards the reader opens ``now`` and the next
        ``Storage.prefetch`` distinct ones of ``later`` (in order); drop queued fetches of
        shards no longer among them."""
        wanted: list[int] = []
        for i in now:
            if i not in wanted and self._fetches_whole(i):
                wanted.append(i)
        budget = self._storage.prefetch
        for i in later:
            if budget <= 0:
                break
            if i not in wanted and self._fetches_whole(i):
                wanted.append(i)
                budget -= 1
        with self._lock:
            if self._closed:
                return
            for i in [i for i in self._pending if i not in wanted]:
                self._pending.pop(i).cancel()  # not needed soon after all; if it runs, let it finish
            for i in wanted:
                if i not in self._held and i not in self._pending:
                    self._pending[i] = self._executor().submit(self._prefetch, i)

    def _fetches_whole(self, index: int) -> bool:
        return self.is_remote(index) and not wants_ranges(self._shards[index], self._columns)

    def _prefetch(self, index: int) -> bool:
        """Fetch shard ``index`` into the cache; whether it was not there yet."""
        handle = self._fetcher.acquire(entry(self._shards[index]), wait=0)
        if handle is None:
            return False
        handle.release()  # in the cache, most recently used; held once the reader opens it
        return handle.fresh

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            workers = max(1, min(self._storage.prefetch, self._storage.parallel))
            self._pool = ThreadPoolExecutor(workers, thread_name_prefix="tidal-prefetch")
        return self._pool

    def close(self) -> None:
        """Stop prefetching and let go of every shard."""
        with self._lock:
            self._closed = True
            pending = list(self._pending.values())
            self._pending.clear()
            held = list(self._held.values())
            self._held.clear()
        for fut in pending:
            fut.cancel()
        for h in held:
            h.release()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        self._fetcher.close()
