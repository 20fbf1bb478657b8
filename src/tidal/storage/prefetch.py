"""One reader's remote shards: fetched ahead in background threads, held while in use.

The read stage knows its future exactly: the epoch order says which shards the next blocks
read. It tells the :class:`Prefetcher` (``ahead``), which downloads up to
``Storage.prefetch`` of them in background threads, each into the shared cache, each held
(so not evicted) until the reader opens it or no longer needs it. When the reader opens a
shard (``open``) it is usually already on disk; the time it waits when it is not is
counted as ``io_wait_s``. A prefetch never waits for room in the cache: when the cache is
full of shards in use, it leaves the shard to be fetched when needed.

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
from tidal.storage.fs import is_remote
from tidal.storage.stats import Stats

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
        self._pending: dict[int, Future[Handle | None]] = {}
        self._held: dict[int, Handle] = {}  # fetched ahead or open
        self._open: set[int] = set()
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False

    def is_remote(self, index: int) -> bool:
        return is_remote(self._shards[index].path)

    def open(self, index: int) -> str | Callable[[], RangeFile]:
        """Where the reader finds shard ``index``: a held local path, or an opener of ranged reads."""
        shard = self._shards[index]
        handle = None
        if wants_ranges(shard, self._columns):
            handle = self._fetcher.lookup(entry(shard))  # a whole copy already here is cheaper still
            if handle is None:
                with self._lock:
                    self._open.add(index)
                return lambda: self._fetcher.range_file(shard.path, shard.bytes)
        else:
            handle = self._take(index)
        with self._lock:
            old = self._held.pop(index, None)
            self._held[index] = handle
            self._open.add(index)
        if old is not None and old is not handle:
            old.release()
        return str(handle.path)

    def _take(self, index: int) -> Handle:
        """The held handle of shard ``index``, waiting for its prefetch or fetching it now."""
        with self._lock:
            handle = self._held.get(index)
            future = self._pending.pop(index, None)  # ours now: ahead() and close() no longer see it
        if handle is not None:
            return handle
        t0 = time.monotonic()
        try:
            if future is not None and not future.cancel():  # started: wait for it; else fetch it here
                handle = future.result()
            if handle is None:  # not prefetched, or no room for it then
                handle = self._fetcher.acquire(entry(self._shards[index]))
            assert handle is not None
            return handle
        finally:
            self.stats.add(io_wait_s=time.monotonic() - t0)

    def release(self, index: int) -> None:
        """The reader of shard ``index`` is closed: the shard may be evicted again."""
        with self._lock:
            self._open.discard(index)
            handle = self._held.pop(index, None)
        if handle is not None:
            handle.release()

    @property
    def closed(self) -> bool:
        return self._closed

    def ahead(self, now: Iterable[int], later: Iterable[int]) -> None:
        """Fetch in the background the shards the reader opens ``now`` and the next
        ``Storage.prefetch`` distinct ones of ``later`` (in order), and let go of shards
        fetched ahead that are no longer among them."""
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
        keep = set(wanted)
        drop: list[Handle] = []
        with self._lock:
            if self._closed:
                return
            for i in [i for i in self._held if i not in keep and i not in self._open]:
                drop.append(self._held.pop(i))
            for i in [i for i in self._pending if i not in keep]:
                _drop(self._pending.pop(i))
            for i in wanted:
                if i not in self._held and i not in self._pending:
                    self._pending[i] = self._executor().submit(self._prefetch, i)
        for h in drop:
            h.release()

    def _fetches_whole(self, index: int) -> bool:
        return self.is_remote(index) and not wants_ranges(self._shards[index], self._columns)

    def _prefetch(self, index: int) -> Handle | None:
        return self._fetcher.acquire(entry(self._shards[index]), wait=0)

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
            self._open.clear()
        for fut in pending:
            _drop(fut)
        for h in held:
            h.release()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        self._fetcher.close()


def _drop(future: Future[Handle | None]) -> None:
    """Cancel a prefetch, or release what it fetches once it is done."""
    if not future.cancel():
        future.add_done_callback(_release_result)


def _release_result(future: Future[Handle | None]) -> None:
    if not future.cancelled() and future.exception() is None:
        handle = future.result()
        if handle is not None:
            handle.release()
