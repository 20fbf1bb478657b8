"""One reader's remote shards: fetched ahead in background threads, held while in use.

The read stage knows its future exactly: the epoch order says which shards the next blocks
read. It tells the :class:`Prefetcher` (``ahead``), which downloads those of them that are
not in the cache yet, up to ``Storage.prefetch`` beyond the current block, in background
threads. When the reader opens a shard (``open``) it is usually on disk already; the time
it waits when it is not is counted as ``io_wait_s``.

Shards that a reader has open are *held*: nothing evicts them. A shard fetched ahead is
*pinned* until the reader opens it: no prefetch (of this reader or any other on the
machine) evicts it, but a reader that needs room for the shard it reads *now* does, so
readers that fetched ahead can never leave one another without room for the present.
And a prefetch never waits for room, nor goes further ahead than the cache has room for
beside what this reader holds and will read sooner: it fetches shards in the order they
will be read, and stops at the first that would not fit. So a prefetch never evicts a
shard that its reader reads before it, and a lone reader downloads each shard once per
epoch, however small the cache.

The room the readers of a machine need, a reader checks before its first block (``require``):
what they may hold at once in the worst epoch (:mod:`tidal.storage.room`), the figure ``tidal
plan`` prints. Parquet shards are read in place where that makes the rest fit; a cache that
cannot hold it otherwise is a :class:`~tidal.errors.StorageError` at once, naming the limit
needed and the argument that bounds what a reader holds.

Large Parquet files, and large line files (JSON lines, text) that are not compressed, are not
downloaded before a block reads them but read in place, by byte ranges
(:class:`tidal.storage.fetch.RangeFile`): a Parquet file the row groups of the block's slices, a
line file the lines of its slices from the index's line offsets. So a block starts after the bytes
it reads, not after whole files. A file read again later (another epoch of ``repeat()``) is also
copied whole into the cache in the background once the reader's first block is read, where the
cache has room, and read from that copy from then on (:meth:`Prefetcher.ahead`). A compressed line
file (``.jsonl.zst``, ``.gz``) cannot be read from the middle: it is fetched whole.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np

from tidal import fork_safe
from tidal.errors import StorageError
from tidal.pools import Threads
from tidal.storage.cache import Entry, Handle
from tidal.storage.config import Storage
from tidal.storage.eviction import footprint
from tidal.storage.fetch import Fetcher, RangeFile
from tidal.storage.room import Room, cached_sizes, fit, streamable
from tidal.storage.stats import Stats
from tidal.storage.urls import is_remote

RANGE_MIN_BYTES = 32 << 20  # smaller files are cheaper to fetch whole (a request or two, cached)
RANGE_MAX_SHARE = 0.5  # a copy for later epochs only where the columns read are this share of the file
LINE_FORMATS = ("jsonl", "text")  # read by ranges from the index's line offsets where not compressed
LINE_WINDOW = 4 << 20  # a line file read in place is read in windows of this many bytes
# shards pinned or being fetched ahead at once, at most: each pin holds a file descriptor, and a
# block may read thousands of small files; more are fetched as the reader opens these
AHEAD_MAX = 32


def entry(shard: Any, check: bool = False) -> Entry:
    """The cache entry of a :class:`tidal.Shard`; ``check``: its size and version come from
    a published index, not from this job's listing, so a download checks them first."""
    return Entry(shard.path, shard.bytes, shard.version, shard.hash, check=check)


def wants_ranges(shard: Any, columns: Sequence[str] | None) -> bool:
    """Whether ``shard`` is read in place by ranges rather than fetched whole before it is read."""
    return _wants_ranges(shard.format, shard.info, int(shard.bytes), columns, getattr(shard, "compression", None))


def _wants_ranges(
    format: str, info: dict, size: int, columns: Sequence[str] | None, compression: str | None = None
) -> bool:
    """Large files that can be read from the middle: Parquet (its row groups), and line files that
    are not compressed (from the line offsets the index keeps). A small file is cheaper whole."""
    if compression is not None or size < RANGE_MIN_BYTES:
        return False
    return format == "parquet" or format in LINE_FORMATS


def _worth_a_copy(shard: Any, columns: Sequence[str] | None) -> bool:
    """Whether a file read in place is worth a whole copy for another epoch: not where only a
    small share of it is read (a few columns of a wide Parquet file)."""
    sizes = shard.info.get("column_bytes")
    if shard.format != "parquet" or columns is None or not sizes:
        return True
    return sum(sizes.get(c, 0) for c in columns) >= RANGE_MAX_SHARE * int(shard.bytes)


def fetched_whole(shards: Any, columns: Sequence[str] | None) -> np.ndarray:
    """Per shard of ``shards`` (a :class:`tidal.Shards`), whether a reader fetches it whole into
    the cache before reading it: remote, and not read in place by ranges (:func:`wants_ranges`)."""
    columns_of = zip(
        shards.paths, shards.formats, shards.infos, shards.bytes.tolist(), shards.compressions, strict=True
    )
    return np.array(
        [is_remote(p) and not _wants_ranges(f, info, b, columns, c) for p, f, info, b, c in columns_of], dtype=bool
    )


class Prefetcher:
    """The remote shards of one reader, by index in the plan's shard list.

    >>> pre = Prefetcher(plan.shards, storage, columns)
    >>> pre.require(readers, seed=0, block_size=16384, shards_per_block=8)   # before its first block
    >>> pre.ahead([4], [9, 2])               # the shards of this block, then of the next ones, in order
    >>> file = pre.open(4)                   # a local path (or an opener for ranged reads)
    >>> pre.release(4)                       # when its reader is closed
    """

    def __init__(
        self,
        shards: Sequence[Any],
        storage: Storage,
        columns: Sequence[str] | None = None,
        stats: Stats | None = None,
        *,
        check: bool = False,
    ):
        self._shards = shards
        self._check = check  # the shards' sizes and versions come from a published index (see entry)
        self._storage = storage
        self._columns = columns
        self.stats = stats if stats is not None else Stats()
        self._fetcher = Fetcher(storage, self.stats)
        self._lock = fork_safe.Lock()
        self._pending: dict[int, Future[bool | None]] = {}  # fetches ahead, running or queued
        self._pinned: dict[int, Handle] = {}  # fetched ahead, not opened yet
        self._held: dict[int, Handle] = {}  # shards the reader has open
        self._near: dict[int, Handle] = {}  # files read beside them (see beside)
        self._chosen: set[int] = set()  # what the last ``ahead`` decided to have on disk
        self._wanted: list[int] = []  # the same, in the order the reader opens them
        self._next = 0  # the first of them not started yet (see _fill)
        self._ranged: set[int] = set()  # Parquet shards read in place because the cache cannot hold them
        self._by_ranges: set[int] = set()  # shards the reader has open in place, by ranges
        # whether the shards read in place are read again (another epoch): then copied whole in the
        # background, once the reader's first block is read (see ahead)
        self.again = False
        self._checked = False  # whether ``require`` has checked the room the readers need
        self._pool: Threads | None = None
        self._closed = False

    def is_remote(self, index: int) -> bool:
        return is_remote(self._shards[index].path)

    def _size(self, index: int) -> int:
        return footprint(self._shards[index].bytes)

    def open(self, index: int) -> str | Callable[[], RangeFile]:
        """Where the reader finds shard ``index``: a held local path, or an opener of ranged reads.

        Held until :meth:`release`."""
        shard = self._shards[index]
        if self._in_place(index):
            with self._lock:
                future = self._pending.pop(index, None)
            if future is not None and not future.cancel():  # a whole copy on its way: read from it, not twice
                with contextlib.suppress(Exception):  # the copy failed: read in place, which says what is wrong
                    future.result()
            with self._lock:
                handle = self._pinned.pop(index, None)  # copied whole for a later epoch: read from the copy
                self._fill()
            handle = handle or self._fetcher.lookup(entry(shard, self._check))  # a whole copy is cheaper still
            if handle is None:
                window = LINE_WINDOW if shard.format in LINE_FORMATS else 0
                with self._lock:
                    self._by_ranges.add(index)

                def opener() -> RangeFile:
                    return self._fetcher.range_file(
                        shard.path, shard.bytes, shard.version, check=self._check, window=window
                    )

                return opener
            self.stats.add(cache_hits=1)
        else:
            handle = self._take(index)
        return self._hold(self._held, index, handle)

    def _in_place(self, index: int) -> bool:
        """Whether shard ``index`` is read by ranges unless a whole copy of it is in the cache."""
        shard = self._shards[index]
        if index in self._ranged:
            return True
        return wants_ranges(shard, self._columns) and self._fetcher.ranged_reads(shard.path)

    def copied(self, index: int) -> bool:
        """Whether shard ``index``, open by ranges, has a whole copy in the cache now (fetched for
        a later epoch): its reader, reopened, reads the copy."""
        with self._lock:
            return index in self._by_ranges and index in self._pinned

    def keep(self) -> None:
        """Keep in memory what ranged reads read from now on, until :meth:`drop_kept` (the point
        reads of a reader's first block, which the block read behind them reads again)."""
        self._fetcher.kept.keeping = True

    def drop_kept(self) -> None:
        self._fetcher.kept.drop()

    def _hold(self, held: dict[int, Handle], index: int, handle: Handle) -> str:
        """Keep ``handle`` under ``index`` in ``held`` (releasing one kept there before); its path."""
        with self._lock:
            old = held.pop(index, None)
            held[index] = handle
        if old is not None:
            old.release()
        return str(handle.path)

    def _take(self, index: int) -> Handle:
        """Shard ``index``, held: after its fetch ahead, if one runs, else fetched now."""
        with self._lock:
            future = self._pending.pop(index, None)
        t0 = time.monotonic()
        pin = None
        try:
            fresh = False
            if future is not None and not future.cancel():  # started: let it finish
                fresh = bool(future.result())  # its error, if it failed, is the reader's
            with self._lock:
                pin = self._pinned.pop(index, None)
                reserved = sum(self._size(i) for i in self._held if i != index)
            handle = self._fetcher.acquire(entry(self._shards[index], self._check), reserved=reserved)
            assert handle is not None
            fresh |= handle.fresh
            self.stats.add(cache_misses=int(fresh), cache_hits=int(not fresh))
            return handle
        finally:
            if pin is not None:  # held now (or failed): the pin has done its work
                pin.release()
            with self._lock:
                self._fill()  # one fewer ahead: the next wanted one may start
            self.stats.add(io_wait_s=time.monotonic() - t0)

    def beside(self, index: int, near: Entry) -> str:
        """A held local copy of ``near``, a file the reader of shard ``index`` reads beside it (a
        Megatron ``.idx``): fetched once per machine like a shard, held until :meth:`release`."""
        with self._lock:
            reserved = sum(self._size(i) for i in self._held)
        handle = self._fetcher.acquire(near, reserved=reserved)
        assert handle is not None
        return self._hold(self._near, index, handle)

    def release(self, index: int) -> None:
        """The reader of shard ``index`` is closed: the shard may be evicted again."""
        with self._lock:
            handles = [self._held.pop(index, None), self._near.pop(index, None)]
            self._by_ranges.discard(index)
        for handle in handles:
            if handle is not None:
                handle.release()

    @property
    def closed(self) -> bool:
        return self._closed

    def require(self, readers: int = 1, who: str = "", **order: Any) -> None:
        """Check, once, that the cache can hold what the readers of this machine hold at once in
        the worst epoch of ``order`` (the shuffle's ``seed``, ``block_size``, ``shards_per_block``,
        ``block_bytes``): :func:`tidal.storage.room.fit`. ``readers``: how many share the cache
        (``who``: them in words); they may all hold their most at once (a DataLoader takes its
        workers' batches in turn, so a worker ahead of the others keeps its block's shards open
        while it waits for its turn). Where they do not fit, Parquet shards are read in place
        instead (the fewest, largest first); where that is not enough, a :class:`StorageError`
        names the limit needed and the argument that bounds what a reader holds.
        """
        if self._checked:
            return
        self._checked = True
        cache = self._fetcher.cache
        shards: Any = self._shards  # a tidal.Shards: its columns
        whole = fetched_whole(shards, self._columns)
        whole[sorted(self._ranged)] = False
        held = cached_sizes(shards, whole)
        space = cache.limit - cache.fixed()
        need, ranged = fit(shards.rows, shards.bytes, held, streamable(shards), space, readers=readers, **order)
        if need.needed > space:
            raise StorageError(self._too_small(need, who, len(ranged), int(shards.bytes[whole].max(initial=0))))
        self._ranged.update(ranged)  # read in place from now on: the rest fits

    def _too_small(self, need: Room, who: str, ranged: int, largest: int) -> str:
        cache = self._fetcher.cache
        fixed = cache.fixed()
        shared = ""
        if need.readers > 1:
            shared = (
                f", times the {who or f'{need.readers} readers'} that share the cache and may each hold as much at once"
            )
            if need.needed < need.readers * need.per_reader:
                shared += f" (more than every shard once: {need.needed:,})"
        also = f" with the {ranged} Parquet shard{'s' * (ranged != 1)} read in place by ranges" if ranged else ""
        fix = need.fix()
        return (
            f"the cache_limit of {cache.limit:,} bytes is too small: a reader holds up to {need.shards} "
            f"shard{'s' * (need.shards != 1)} at once in the worst epoch ({need.why()}), up to {need.per_reader:,} "
            f"bytes in the cache with their metadata{also}{shared}, and the index and directories of {cache.root} take "
            f"{fixed:,}: cache_limit must be at least {need.needed + fixed:,} bytes for every epoch (the largest shard "
            f"is {largest:,} bytes; `tidal plan` gives the same figure). Raise cache_limit"
            + (f", or hold fewer shards at once: {fix}" if fix else "")
        )

    def ahead(self, now: Iterable[int], later: Iterable[int], *, settled: bool = True) -> None:
        """Have on disk the shards the reader opens ``now`` and, in the background, the next
        ``Storage.prefetch`` distinct ones of ``later`` (in order) as far as the cache has room
        for them beside what this reader holds; drop the fetches and pins of the others.

        Shards read in place are not fetched, but where they are read again (:attr:`again`) and
        the reader is ``settled`` (its first block read: a copy never competes with it), copied
        whole in the background like those of ``later``, where the cache has room."""
        now, later = list(now), list(later)
        seen = dict.fromkeys(i for i in now if self._fetches_whole(i))  # in order, each once
        first_later = len(seen)
        copies = self.again and settled
        budget = self._storage.prefetch
        for i in [*now, *later] if copies else later:
            if budget <= 0:
                break
            if i not in seen and (self._fetches_whole(i) or (copies and self._copy_worth(i))):
                seen[i] = None
                budget -= 1
        wanted = list(seen)
        cache = self._fetcher.cache
        room = cache.limit - cache.fixed()
        unpin: list[Handle] = []
        with self._lock:
            if self._closed:
                return
            room -= sum(self._size(i) for i in self._held if i not in seen)  # held, not needed again soon
            chosen: list[int] = []
            for n, i in enumerate(wanted):
                room -= self._size(i)
                if room < 0 and n >= first_later:
                    break  # no room without evicting what the reader reads sooner: not yet
                chosen.append(i)
            self._chosen = set(chosen)
            for i in [i for i in self._pending if i not in self._chosen]:
                self._pending.pop(i).cancel()  # not needed soon after all; if it runs, its pin is dropped
            for i in [i for i in self._pinned if i not in self._chosen]:
                unpin.append(self._pinned.pop(i))
            self._wanted, self._next = chosen, 0
            self._fill()
        for h in unpin:
            h.release()

    def _copy_worth(self, index: int) -> bool:
        """A shard read in place whose whole copy a later epoch reads (see :meth:`ahead`)."""
        return (
            self.is_remote(index)
            and index not in self._ranged  # the cache cannot hold it: never copied
            and self._in_place(index)
            and _worth_a_copy(self._shards[index], self._columns)
        )

    def _fill(self) -> None:
        """Start fetching the wanted shards not yet started (each once per :meth:`ahead`) that are
        neither held nor pinned, in order, while fewer than :data:`AHEAD_MAX` are pinned or on
        their way (lock held)."""
        if self._closed:
            return
        ahead = len(self._pending.keys() | self._pinned.keys())
        while self._next < len(self._wanted) and ahead < AHEAD_MAX:
            i = self._wanted[self._next]
            self._next += 1
            if i in self._held or i in self._pinned:
                continue
            fut = self._pending.get(i)
            done = fut is not None and fut.done() and not fut.cancelled() and fut.exception() is None
            if fut is not None and done and fut.result() is None:  # there was no room then: try again
                del self._pending[i]
                fut = None
            if fut is None:
                self._pending[i] = self._executor().submit(self._prefetch, i)
                ahead += 1

    def _fetches_whole(self, index: int) -> bool:
        """Whether shard ``index`` is fetched whole before it is read (remote, not read in place)."""
        return self.is_remote(index) and not self._in_place(index)

    def _prefetch(self, index: int) -> bool | None:
        """Fetch shard ``index`` into the cache and pin it; whether it was not there yet, None if there was no room."""
        handle = self._fetcher.acquire(entry(self._shards[index], self._check), wait=0, pin=True)
        if handle is None:
            return None
        with self._lock:
            keep = not self._closed and index in self._chosen and index not in self._held
            if keep:
                old = self._pinned.get(index)
                self._pinned[index] = handle
        if not keep:
            handle.release()  # not wanted any more: in the cache, most recently used, but not pinned
        elif old is not None:
            old.release()
        return handle.fresh

    def _executor(self) -> Threads:
        if self._pool is None:
            workers = max(1, min(self._storage.prefetch, self._storage.parallel))
            self._pool = Threads(workers, thread_name_prefix="tidal-prefetch")
        return self._pool

    def close(self) -> None:
        """Stop prefetching and let go of every shard."""
        with self._lock:
            self._closed = True
            pending = list(self._pending.values())
            self._pending.clear()
            handles = [*self._held.values(), *self._near.values(), *self._pinned.values()]
            self._held.clear()
            self._near.clear()
            self._pinned.clear()
        for fut in pending:
            fut.cancel()
        for h in handles:
            h.release()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        self._fetcher.close()
