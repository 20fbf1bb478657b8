"""The source stage: one reader's share of each epoch, block by block, in epoch order.

Bad data meets the ``errors`` policy here (see :class:`tidal.stages.policy.Policy`). Format readers hand each
bad record, row group or segment to it and mark what they skipped; what a reader lets
escape (a file that cannot be opened, or read to the rows asked for) is named by file and
handed to the policy too, and under ``"skip"`` the slice read is skipped: counted, never
silently short. Two things are errors under every policy, since skipping cannot fix them and
would spin: a block in which no record has a column asked for (``columns=`` on JSON lines or
WebDataset, which have no schema to check first: a record without it has None there, but a
column no record of a block has is taken for a typo), and, under ``repeat()``, an epoch of a
reader's share in which every record was skipped (in a finite pass: a warning).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from tidal import env
from tidal.errors import (
    ArgumentError,
    ConfigError,
    FormatError,
    RecordError,
    SchemaError,
    SourceError,
    StateError,
    StorageError,
    TidalError,
)
from tidal.formats import Errors, Located, Piece, Reader, data_errors, exhausted, module, threaded
from tidal.order import EpochOrder, Intervals, share
from tidal.shards import Shards
from tidal.stages import Context, Locator, Stage, StageIterator, Unlocated
from tidal.stages.policy import Policy
from tidal.stages.readers import NotOpened, OpenReaders
from tidal.stages.transform import reference
from tidal.state import keys as k
from tidal.state.view import View
from tidal.storage.config import Storage, public_source
from tidal.storage.retry import redact_urls
from tidal.tables import Table, concat, cut, decoded, length, take
from tidal.world import World

if TYPE_CHECKING:
    from tidal.storage.prefetch import Prefetcher

LOOKAHEAD_BLOCKS = 512  # how far ahead the reader looks for shards to prefetch
log = logging.getLogger("tidal")
_WARNED_SMALL: set[tuple[str, str, int, int]] = (
    set()
)  # sources warned of having fewer records than readers, once a process


@dataclass(frozen=True)
class ReadPlan:
    """What the source stage needs: the shards and how to order them."""

    shards: Shards
    columns: tuple[str, ...] | None
    errors: Errors
    seed: int | None
    block_size: int
    shards_per_block: int
    epochs: int | None  # None: forever
    storage: Storage | None = None  # how to reach remote shards; None when every shard is local
    options: dict = field(default_factory=dict)  # format options (tidal.formats.OPTIONS)
    given: dict = field(default_factory=dict, compare=False)  # src, format, follow_links as given: for to_config()
    indexed: bool = field(default=False, compare=False)  # listed from a published index: checked on download

    @property
    def total(self) -> int:
        return self.shards.total


@dataclass(frozen=True, repr=False)
class Read(Stage):
    """The source: this reader's share of each epoch of the shards, block by block, in epoch order."""

    plan: ReadPlan

    def open(self, ctx: Context, position: View | None) -> ReadIterator:
        origin = (ctx.origin or {}).get(ctx.key)
        return ReadIterator(self.plan, ctx.world, position, ctx.first_epoch, origin, ctx.key)

    def describe(self) -> list:
        p = self.plan
        names = [path[path.rfind("/") + 1 :] for path in p.shards.paths]  # basenames, of URLs too
        shards = list(zip(names, p.shards.rows.tolist(), strict=True))
        return [["Read", shards, p.columns, p.seed, p.block_size, p.shards_per_block, p.epochs, p.options]]

    def call(self) -> str:
        p = self.plan
        text = f"Dataset({len(p.shards)} shards, {p.total} records)"
        if p.seed is not None:
            text += f".shuffle(seed={p.seed}, block_size={p.block_size}, shards_per_block={p.shards_per_block})"
        if p.epochs != 1:
            text += f".repeat({p.epochs})"
        return text

    def sources(self, key: str = "") -> dict[str, ReadPlan]:
        return {key: self.plan}

    def epochs_per_pass(self) -> int:
        return self.plan.epochs or 0

    def with_source(self, change: Callable[[Read], Read]) -> Stage:
        return change(self)

    def to_config(self) -> dict:
        p = self.plan
        if not p.given:
            raise ConfigError(f"{self.call()}: a source built by hand, not by tidal.Dataset(...), has no config")
        src, removed = public_source(p.given["src"])
        source = {
            "src": src,
            "columns": list(p.columns) if p.columns is not None else None,
            "format": p.given["format"],
            "errors": p.errors if isinstance(p.errors, str) else reference(p.errors, "errors="),
            "format_options": dict(p.options),
            "follow_links": p.given["follow_links"],
        }
        if p.storage is not None:
            source.update(p.storage.to_config(p.shards.paths))
        if removed:  # credentials in the URL itself
            source["storage_options_removed"] = ["src", *source.get("storage_options_removed", [])]
        steps: list[dict] = []
        if p.seed is not None:
            steps.append(
                {"shuffle": {"seed": p.seed, "block_size": p.block_size, "shards_per_block": p.shards_per_block}}
            )
        if p.epochs != 1:
            steps.append({"repeat": {"epochs": p.epochs}})
        return {"source": {k: v for k, v in source.items() if v is not None and v != {}}, "steps": steps}


RELEASE_BYTES = 32 << 20


class _Block:
    """One loaded block, its records already in yield order, and where skipped records were."""

    def __init__(
        self,
        table: Table,
        valid_before: np.ndarray | None,
        slices: list[tuple[int, int, int]],
        rows: np.ndarray | None,
    ):
        self.table = table
        self.valid_before = valid_before  # kept records before each position; None: all kept
        self.slices = slices  # (shard, first row, stop) of each file read, in order
        self.rows = rows  # where each record of ``table`` was among the slices' rows; None: in order

    def span(self, offset: int, stop: int, max_items: int) -> tuple[int, int, int]:
        """(first row, last row, next offset) of up to ``max_items`` kept records from ``offset``."""
        if self.valid_before is None:
            end = min(stop, offset + max_items)
            return offset, end, end
        vb = self.valid_before
        first = int(vb[offset])
        last = min(int(vb[stop]), first + max_items)
        # the position just past the record numbered last - 1
        nxt = int(np.searchsorted(vb, last, side="left")) if last > first else stop
        return first, last, min(nxt, stop)


class _Owned:
    """Which rows of a block's files fall in this reader's share of the epoch: every reader
    reads the whole block and yields its share of it, so a bad record is raised or counted
    by the reader that would have yielded it, once in the job (worked out only for bad rows)."""

    def __init__(
        self,
        reader: ReadIterator,
        order: EpochOrder,
        b: int,
        slices: list[tuple[int, int, int]],
        perm: np.ndarray | None,
    ):
        self._base = int(order.starts[b])
        self._n = int(order.starts[b + 1]) - self._base
        intervals, _ = reader._share(order.epoch)
        self._intervals = [
            (a - self._base, z - self._base) for a, z in intervals if a < self._base + self._n and z > self._base
        ]
        self._perm = perm
        self._files: dict[str, list[tuple[int, int, int]]] = {}  # path: (first row, stop, where in the block)
        at = 0
        for shard, a, z in slices:
            self._files.setdefault(redact_urls(reader._plan.shards[shard].path), []).append((a, z, at))
            at += z - a
        self._mine: np.ndarray | None = None

    def mine(self) -> np.ndarray:
        """Per row of the block (in file order), whether it is in this reader's share."""
        if self._mine is None:
            positions = np.zeros(self._n, dtype=bool)
            for a, z in self._intervals:
                positions[max(a, 0) : min(z, self._n)] = True
            if self._perm is None:
                self._mine = positions
            else:  # position j yields row perm[j]
                self._mine = np.zeros(self._n, dtype=bool)
                self._mine[self._perm[positions]] = True
        return self._mine

    def count(self, bad: np.ndarray) -> int:
        return int((bad & self.mine()).sum())

    def __call__(self, path: str, row: int) -> bool:
        for a, z, at in self._files.get(path, ()):
            if a <= row < z:
                return bool(self.mine()[at + row - a])
        return True  # not a row of this block: it cannot be told, so it is this reader's


class _Rows(Locator):
    """Where the records of a table the source stage returned came from: records ``first ..``
    of a block (not the block itself, which may be freed by then)."""

    def __init__(self, reader: ReadIterator, block: _Block, first: int):
        self._reader, self._slices, self._rows, self._first = reader, block.slices, block.rows, first

    def reject(self, i: int, why: str) -> None:
        at = self._first + i
        at = int(self._rows[at]) if self._rows is not None else at
        for shard, a, z in self._slices:
            if at < z - a:
                self._reader.reject(shard, a + at, why)
                return
            at -= z - a
        raise IndexError(i)


class ReadIterator(StageIterator):
    """Reads one consumer's (rank x worker) share of each epoch, in epoch order.

    The share of an epoch is :func:`tidal.order.share` of it: with no ``origin``, a
    contiguous range of positions; after an elastic restore, an equal part of what the
    previous topology left of the epochs named in ``origin`` (``{"epoch": e, "done":
    {epoch: intervals}}``), starting at its ``epoch``. Position: the epoch and how many
    positions of its share were passed (``offset``).
    """

    MAX_OPEN = 64  # idle readers kept open; those in use are never closed (see OpenReaders)

    def __init__(
        self,
        plan: ReadPlan,
        world: World,
        position: View | None = None,
        first_epoch: int = 0,
        origin: dict | None = None,
        key: str = "",
    ):
        self._plan = plan
        self._world = world
        self.key = key
        self.exact = True  # one record per position (bar records skipped as bad)
        self._readers = OpenReaders(self._open_reader, self._reader_closed, self.MAX_OPEN)
        self._order: EpochOrder | None = None
        self._block_index = -1
        self._block: _Block | None = None
        self._last: tuple[_Block, int] | None = None  # the block the last table was cut from, and where
        self.rows_read = 0  # rows read from files, yielded or not: what a resume costs
        self.skipped = 0  # bad records dropped under errors="skip"
        self._policy = Policy(plan.errors)
        self._broken: dict[int, TidalError] = {}  # shards that could not be opened: skipped from then on
        # files the index could not read: counted by one reader, so counts add up over readers
        self._unindexed = sum(e is not None for e in plan.shards.errors) if world.consumer == 0 else 0
        self._origin = origin or {k.EPOCH: first_epoch, k.DONE: {}}
        self._shares: dict[int, tuple[Intervals, np.ndarray]] = {}
        # (epoch, offsets from, to, then position = offset + delta, block, its first position, its stop):
        # the offsets one interval and one block cover, found once, not by two searches a batch
        self._run: tuple[int, int, int, int, int, int, int] | None = None
        self._arrow_loaded = 0  # bytes of Arrow blocks loaded since the pool last released memory
        # threads a block's files are read with (see _read_slices): where decoding releases the GIL
        # (Parquet, Arrow) and this reader is its process's only one (remote files too: their local
        # copies, or ranged GETs, which release the GIL as they wait)
        alone = world.num_workers == 1
        self._threads = env.read_threads() if alone and threaded(plan.shards.formats) else 1
        self._pool: tuple[int, ThreadPoolExecutor] | None = None  # (the pid it was made in, its threads)
        self._reading: list[Future[Piece]] = []  # reads in flight
        # the next block, being read (see _read_ahead): (pid, its slices, their reads, what they skipped)
        self._ahead: tuple[int, list, dict[int, Future[Piece]], dict[str, list[TidalError]]] | None = None
        total = plan.total
        if total == 0 and plan.epochs is None:
            files = ", ".join(plan.shards.paths[:3]) + (", ..." if len(plan.shards) > 3 else "")
            raise SourceError(f"the dataset has no records, so it cannot repeat forever (its files: {files})")
        if plan.epochs is None and not share(total, [], world.consumers, world.consumer, drop_remainder=False):
            raise ArgumentError(
                f"{total} records cannot feed {world.consumers} readers ({world.world_size} ranks x "
                f"{world.num_workers} workers) forever: each needs at least one record per epoch"
            )
        small = (key, plan.shards.paths[0] if len(plan.shards) else "", total, world.consumers)
        if (
            plan.epochs is not None
            and 0 < total < world.consumers
            and world.consumer == 0
            and small not in _WARNED_SMALL
        ):
            _WARNED_SMALL.add(small)  # said once, by the job's first reader
            log.warning(
                "the dataset holds %d records and is read by %d readers (%d ranks x %d workers): every reader "
                "takes the same number of records an epoch, %d // %d = 0, so none yields anything; use fewer "
                "ranks or workers, or repeat() it",
                total,
                world.consumers,
                world.world_size,
                world.num_workers,
                total,
                world.consumers,
            )
        self.passed = 0  # positions passed since the first epoch, across restores
        if position is None:
            self._first, self._epoch, self._offset = first_epoch, max(first_epoch, int(self._origin[k.EPOCH])), 0
        else:
            self._first = position.integer(k.FIRST_EPOCH)
            self._epoch = position.integer(k.EPOCH, lo=self._first)
            if plan.epochs is not None and self._epoch >= self._first + plan.epochs:
                raise StateError(f"{position.where(k.EPOCH)}: epoch {self._epoch} is past the last epoch of the pass")
            self._offset = position.integer(k.OFFSET, hi=int(self._share(self._epoch)[1][-1]))
            self.passed = position.integer(k.PASSED)
        self._kept = 0  # records yielded this epoch
        self._whole_epoch = self._offset == 0  # whether this iterator saw the epoch from its start

    def stats(self) -> dict:
        """``rows_read``; ``skipped``: records dropped as bad (their positions still count);
        ``bad_files``: files dropped whole because the index could not read them (counted
        by the first reader) or found truncated or corrupt while reading (by each reader
        that found it); ``passed``; and the remote counters."""
        out: dict = {
            "rows_read": self.rows_read,
            "skipped": self.skipped,
            "bad_files": self._unindexed + len(self._policy.bad_files),
            "passed": self.passed,
        }
        if self._remote is not None:
            out.update(self._remote.stats.dict())
        return out

    def position(self) -> dict:
        return {k.FIRST_EPOCH: self._first, k.EPOCH: self._epoch, k.OFFSET: self._offset, k.PASSED: self.passed}

    def used(self) -> dict[str, list[int]]:
        """What this reader has passed, for elastic restores: ``{key: [epoch, offset]}``."""
        return {self.key: [self._epoch, self._offset]}

    def _share(self, epoch: int) -> tuple[Intervals, np.ndarray]:
        if epoch not in self._shares:
            done = self._origin[k.DONE].get(str(epoch), [])
            w, plan = self._world, self._plan
            intervals = share(plan.total, done, w.consumers, w.consumer, drop_remainder=plan.epochs is not None)
            ends = np.cumsum([0] + [b - a for a, b in intervals])
            self._shares = {epoch: (intervals, ends)}  # only the current epoch is ever needed
        return self._shares[epoch]

    def next(self, max_items: int) -> Table:
        while True:
            intervals, ends = self._share(self._epoch)
            if self._offset >= ends[-1]:
                self._check_epoch(int(ends[-1]))
                if self._plan.epochs is not None and self._epoch + 1 >= self._first + self._plan.epochs:
                    raise StopIteration
                self._epoch, self._offset = self._epoch + 1, 0
                self._kept, self._whole_epoch = 0, True
                continue
            run = self._run
            if run is None or run[0] != self._epoch or not run[1] <= self._offset < run[2]:
                j = int(np.searchsorted(ends, self._offset, side="right")) - 1
                start, end = intervals[j]
                delta = start - int(ends[j])  # position = offset + delta, within this interval
                order = self._epoch_order()
                b = order.block_at(self._offset + delta)
                base = int(order.starts[b])
                stop = min(end, int(order.starts[b + 1])) - base
                upto = min(int(ends[j + 1]), base + stop - delta)  # where the interval or the block ends
                run = self._run = (self._epoch, self._offset, upto, delta, b, base, stop)
            delta, b, base, stop = run[3:]
            pos = self._offset + delta
            order = self._epoch_order()
            block = self._load(order, b)
            first, last, nxt = block.span(pos - base, stop, max_items)
            self._offset += base + nxt - pos
            self.passed += base + nxt - pos
            if last > first:
                self._kept += last - first
                self._last = (block, first)
                return cut(block.table, first, last)

    def locate(self) -> Locator:
        return _Rows(self, *self._last) if self._last is not None else Unlocated()

    def reject(self, shard: int, row: int, why: str) -> None:
        """Record ``row`` of ``shard``, yielded last, was found bad downstream: to the policy."""
        path = redact_urls(self._plan.shards[shard].path)
        self._policy.now(path, RecordError(why, path=path, row=row), mine=True)  # raises unless it skips it
        self.skipped += 1
        self._kept -= 1

    def _check_epoch(self, records: int) -> None:
        """An epoch of this reader's share in which every record was skipped: under ``repeat()``
        an error, since the reader would spin forever finding nothing to yield; in a finite pass
        a warning (a reader's share of a small dataset may hold only bad records)."""
        if not self._whole_epoch or records == 0 or self._kept > 0:
            return
        why = "; ".join(self._policy.first) or "no error recorded"
        message = (
            f"every one of the {records} records this reader read in epoch {self._epoch} was skipped as bad "
            f"(errors={self._policy.errors!r}), so it yields nothing{' forever' if self._plan.epochs is None else ''}"
            f". The first: {why}. Check format= and columns=, and the files"
        )
        if self._plan.epochs is None:
            raise FormatError(message)
        log.warning("%s", message)

    def _epoch_order(self) -> EpochOrder:
        if self._order is None or self._order.epoch != self._epoch:
            p = self._plan
            self._order = EpochOrder(
                p.shards.rows,
                seed=p.seed,
                epoch=self._epoch,
                block_size=p.block_size,
                shards_per_block=p.shards_per_block,
            )
            self._block_index, self._block = -1, None
        return self._order

    def _load(self, order: EpochOrder, b: int) -> _Block:
        if self._block_index == b and self._block is not None:
            return self._block
        self._block = self._last = None  # free the old block before reading the new one
        slices = order.slices(b)
        remote = self._prefetcher()
        if remote is not None:  # fetch this block's and the next blocks' shards in the background
            remote.require(order.epoch, lambda: self._held_per_block(order, remote), self._world.num_workers)
            now = [s for s, _, _ in slices]
            later = self._upcoming(order, b)
            first_later = [s for s, _, _ in order.slices(b + 1)] if b + 1 < order.blocks else []
            keep = {*now, *first_later}
            self._readers.close_idle(lambda i: i in keep or not remote.is_remote(i))  # done with: evictable
            remote.ahead(now, later)
        perm = order.permutation(b)
        owned = self._policy.owns = _Owned(self, order, b, slices, perm)  # bad records: this reader's only
        tables, masks, any_skipped = [], [], False
        absent: dict[str, str] | None = None  # columns asked for that no record of the block has so far
        for (_, a, z), piece in zip(slices, self._read_slices(slices), strict=True):
            self.rows_read += z - a
            if length(piece.table):
                absent = piece.absent if absent is None else {c: w for c, w in absent.items() if c in piece.absent}
            if piece.valid is None or piece.valid.any():
                tables.append(piece.table)
            masks.append(np.ones(z - a, dtype=bool) if piece.valid is None else piece.valid)
            any_skipped |= piece.valid is not None
        if absent:
            column, where = next(iter(absent.items()))
            raise SchemaError(
                f"no record of a block of {int(order.starts[b + 1] - order.starts[b])} has the column {column!r} "
                f"asked for with columns= ({where}): a typo? A field so rare that a whole block lacks it is "
                "read without columns= (each record keeps the fields it has)"
            )
        table = concat(tables) if tables else []
        del tables  # the pieces: freed once the block is made of them
        rows = perm  # where each record of the block's table was among the slices' rows
        valid_before = None
        if any_skipped:
            valid = np.concatenate(masks)
            self.skipped += owned.count(~valid)  # the bad records of this reader's share
            rows = np.flatnonzero(valid) if perm is None else perm[valid[perm]]
            kept_index = np.cumsum(valid) - 1  # row in ``table`` of each kept position
            if perm is not None:
                valid = valid[perm]
                perm = kept_index[perm][valid]
            valid_before = np.concatenate([[0], np.cumsum(valid)])
        if isinstance(table, pa.Table):
            self._arrow_loaded += table.nbytes
            if perm is not None:  # permuted Python objects are cheaper than Arrow's take, then a conversion per batch
                table = decoded(table)
        if perm is not None:
            table = take(table, perm)
        self._block_index, self._block = b, _Block(table, valid_before, slices, rows)
        self._read_ahead(order, b + 1)
        if self._arrow_loaded >= RELEASE_BYTES:  # the blocks' freed memory back to the system, now and then:
            pa.default_memory_pool().release_unused()  # a call costs ~2 ms, too much for every small block
            self._arrow_loaded = 0
        return self._block

    def _read_slices(self, slices: list[tuple[int, int, int]]) -> Iterator[Piece]:
        """Each slice's rows, in order. Where decoding releases the GIL and this reader is alone in
        its process, the files are read side by side in threads (one thread decodes Parquet at
        0.5 GB/s). The block read ahead (see :meth:`_read_ahead`) is taken as it is when it is
        the one asked for."""
        ahead, self._ahead = self._ahead, None
        if self._reading:  # reads ahead, or reads an interrupt left running: they use the readers, so they end first
            if self._pool is not None and self._pool[0] == os.getpid():
                wait(self._reading)
            # else made before a fork: their threads are not in this process; the readers they were
            # using are the parent's, closed by OpenReaders when this process first uses it
            self._reading = []
        self._policy.deferred = None
        if not self._threaded(slices):
            for shard, a, z in slices:
                yield self._read(shard, a, z)
            return
        if ahead is not None and ahead[0] == os.getpid() and ahead[1] == slices:
            reads, deferred = ahead[2], ahead[3]
        else:
            reads, deferred = self._submit(slices)
            try:
                wait(self._reading)
                self._reading = []
            finally:
                self._policy.deferred = None
        for shard, a, z in slices:
            yield self._read(shard, a, z, reads.get(shard), deferred)

    def _threaded(self, slices: list[tuple[int, int, int]]) -> bool:
        return self._threads >= 2 and len(slices) >= 2 and len({s for s, _, _ in slices}) == len(slices)

    def _submit(
        self, slices: list[tuple[int, int, int]]
    ) -> tuple[dict[int, Future[Piece]], dict[str, list[TidalError]]]:
        """Start reading ``slices`` in the threads, each opening its file's reader if none is open;
        what they skip is deferred until each piece is taken (:meth:`_read`), so that the policy
        sees it in file order."""
        pool = self._pool
        if pool is None or pool[0] != os.getpid():  # made in the process that reads (a fork has no threads)
            pool = self._pool = (os.getpid(), ThreadPoolExecutor(self._threads, thread_name_prefix="tidal-read"))
        deferred: dict[str, list[TidalError]] = {}
        self._policy.deferred = deferred
        reads = {s: pool[1].submit(self._read_held, s, a, z) for s, a, z in slices if s not in self._broken}
        self._reading = list(reads.values())
        return reads, deferred

    def _read_held(self, index: int, a: int, z: int) -> Piece:
        with self._readers.using(index) as reader:
            return reader.read(a, z)

    def _read_ahead(self, order: EpochOrder, b: int) -> None:
        """Start reading block ``b`` in the threads while the loop takes the batches of the block
        before it, so that it waits for a block only when it takes batches faster than the threads
        decode (one block more in memory, read, not yet made Python). Only for local files:
        remote ones are fetched ahead by the prefetcher."""
        if b >= order.blocks or self._plan.storage is not None:
            return
        slices = order.slices(b)
        begin, end = int(order.starts[b]), int(order.starts[b + 1])
        intervals, _ = self._share(order.epoch)
        if not self._threaded(slices) or not any(a < end and begin < z for a, z in intervals):
            return  # not this reader's to read: no read ahead at the end of its share
        reads, deferred = self._submit(slices)
        self._ahead = (os.getpid(), slices, reads, deferred)

    def _read(
        self,
        index: int,
        a: int,
        z: int,
        done: Future[Piece] | None = None,
        deferred: dict[str, list[TidalError]] | None = None,
    ) -> Piece:
        """Rows ``[a, z)`` of shard ``index`` (or what reading them in a thread gave, ``done``,
        and skipped, ``deferred``); what its reader cannot read goes to the policy."""
        path = redact_urls(self._plan.shards[index].path)  # as its reader names it
        if index in self._broken:  # could not be opened: handed to the policy once, skipped since
            return Piece([], np.zeros(z - a, dtype=bool))
        failure: Exception
        try:
            if done is not None and deferred is not None:
                self._policy.replay(path, deferred)  # the records it skipped, then what ended it
                return done.result()
            return self._read_held(index, a, z)
        except NotOpened as exc:
            failure, opened = exc.cause, False
        except Exception as exc:
            failure, opened = exc, True
        error = self._unreadable(path, failure)  # out of the except: what it re-raises keeps its own traceback
        if not opened:
            self._broken[index] = error
        self._policy(path, error)  # raises unless the policy skips it
        return Piece([], np.zeros(z - a, dtype=bool))

    def _unreadable(self, path: str, exc: Exception) -> TidalError:
        """What a reader raised, as a FormatError naming the file; re-raised as it is where no
        policy may skip it (the network, a schema, the user's own stop, a record under "raise")."""
        policy = self._policy
        if exc is policy.stopped or isinstance(exc, (SchemaError, StorageError, StateError)):
            raise exc
        short = exhausted(exc)
        if short is not None:  # the machine's fault, not the file's: never skipped
            raise StorageError(f"{path}: out of {short} while reading it: {exc}") from exc
        if isinstance(exc, TidalError):
            if policy.errors == "raise":
                raise exc
            return exc
        if not isinstance(exc, data_errors()):
            raise exc  # not bad data: a bug, which no policy hides
        error = FormatError(f"{path}: unreadable ({type(exc).__name__}): {exc}")
        if policy.errors == "raise":
            raise error from exc
        return error

    def _open_reader(self, index: int) -> Reader:
        shard = self._plan.shards[index]
        columns = list(self._plan.columns) if self._plan.columns is not None else None
        info, remote, name = shard.info, self._prefetcher(), shard.path
        if remote is not None and remote.is_remote(index):
            info = {**info, "file": Located(remote.open(index))}  # a held local copy, or ranged reads
            name = redact_urls(shard.path)  # errors name the shard, never a signed URL's query
        try:
            fmt = module(shard.format)
            errors = self._policy.for_file(name)
            return fmt.open(name, shard.compression, info, columns, errors, self._plan.options)
        except BaseException:
            if remote is not None:
                remote.release(index)
            raise

    def _reader_closed(self, index: int) -> None:
        remote = self._remote
        if remote is not None and remote.is_remote(index):
            remote.release(index)  # the cache may evict its copy again

    def close(self) -> None:
        pool, self._pool = self._pool, None
        try:
            if pool is not None and pool[0] == os.getpid():
                pool[1].shutdown(wait=True)  # a read in flight (the loop was interrupted) ends before its file closes
        except Exception:  # the interpreter is exiting (its globals are gone): the threads were joined already
            pass
        self._readers.close()
        self._block = self._last = None
        if self._remote is not None:
            self._remote.close()

    # -- remote shards ---------------------------------------------------------------

    _remote: Prefetcher | None = None  # created on first use, in the process that reads

    def _prefetcher(self) -> Prefetcher | None:
        storage = self._plan.storage
        if storage is None:
            return None
        if self._remote is None or self._remote.closed:
            from tidal.storage.prefetch import Prefetcher

            stats = self._remote.stats if self._remote is not None else None
            self._remote = Prefetcher(self._plan.shards, storage, self._plan.columns, stats, check=self._plan.indexed)
        return self._remote

    def _held_per_block(self, order: EpochOrder, remote: Prefetcher) -> Iterator[tuple[int, set[int]]]:
        """``(block, remote shards open while it is read)`` for each block this reader reads this
        epoch, in order: what :meth:`_load` keeps open (this block's shards, and those of the
        next block that are open already), for the prefetcher to check the cache can hold it."""
        intervals, _ = self._share(order.epoch)
        held = {i for i in self._readers.indices() if remote.is_remote(i)}
        last, after = -1, set[int]()
        for a, z in intervals:
            if z <= a:
                continue
            for b in range(max(order.block_at(a), last + 1), order.block_at(z - 1) + 1):
                now = after if b == last + 1 and last >= 0 else {s for s, _, _ in order.slices(b)}
                after = {s for s, _, _ in order.slices(b + 1)} if b + 1 < order.blocks else set()
                held = (held & (now | after)) | now
                last = b
                yield b, held

    def _upcoming(self, order: EpochOrder, b: int) -> Iterator[int]:
        """The shards of the blocks this reader reads after block ``b`` this epoch, in order, lazily."""
        intervals, _ = self._share(order.epoch)
        after = int(order.starts[b + 1])
        budget = LOOKAHEAD_BLOCKS
        for a, z in intervals:
            a = max(a, after)
            if a >= z:
                continue
            for block in range(order.block_at(a), order.block_at(z - 1) + 1):
                if block <= b:
                    continue
                budget -= 1
                if budget < 0:
                    return
                for s, _, _ in order.slices(block):
                    yield s
