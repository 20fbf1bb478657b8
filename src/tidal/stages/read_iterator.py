"""The source stage's iterator: one reader's share of each epoch, block by block, in epoch order.

This is the share cursor (which positions of each epoch a reader yields, and where it is);
:mod:`tidal.stages.blocks` reads the blocks those positions fall in, and
:mod:`tidal.stages.read` is the stage that opens it.

Bad data meets the ``errors`` policy (see :class:`tidal.stages.policy.Policy`). Format readers hand each
bad record, row group or segment to it and mark what they skipped; what a reader lets
escape (a file that cannot be opened, or read to the rows asked for) is named by file and
handed to the policy too, and under ``"skip"`` the slice read is skipped: counted, never
silently short. The remainder of a finite epoch (the last positions, fewer than the readers,
that no reader yields: see :func:`tidal.order.consumer_range`) is read by the job's last
reader after its share, its records dropped, so that a bad record there is raised or counted
once, as anywhere else in the data. Two things are errors under every policy, since skipping
cannot fix them and would spin: a block in which no record has a column asked for
(``columns=`` on JSON lines or WebDataset, which have no schema to check first: a record
without it has None there, but a column no record of a block has is taken for a typo), and,
under ``repeat()``, an epoch of a reader's share in which every record was skipped (in a
finite pass: a warning).
"""

from __future__ import annotations

import logging
from typing import NamedTuple

import numpy as np

from tidal.errors import ArgumentError, FormatError, RecordError, SourceError, StateError
from tidal.order import EpochOrder, Intervals, remainder, share
from tidal.stages import StageIterator
from tidal.stages.blocks import BlockReader
from tidal.stages.loaded import Block
from tidal.stages.locators import Locator, Origin, Unlocated
from tidal.stages.plan import ReadPlan
from tidal.stages.policy import Policy
from tidal.state import keys as k
from tidal.state.view import View
from tidal.storage.retry import redact_urls
from tidal.tables import Table, Unparsed, cut
from tidal.world import World

log = logging.getLogger("tidal")


_WARNED_SMALL: set[tuple[str, str, int, int]] = (
    set()
)  # sources warned of having fewer records than readers, once a process


class _Run(NamedTuple):
    """The offsets of a reader's share that fall in one interval of it and one block."""

    epoch: int
    first: int  # offsets first .. stop of the share
    stop: int
    delta: int  # position in the epoch = offset + delta
    block: int
    base: int  # the block's first position
    block_stop: int  # where the interval ends in the block, from its start


class _Rows(Locator):
    """Where the records of a table the source stage returned came from: records ``first ..``
    of a block (not the block itself, which may be freed by then)."""

    def __init__(
        self,
        reader: ReadIterator,
        block: Block,
        first: int,
        kept: list[int] | None,
        offset: int | None = None,
        at: int = 0,
    ):
        self._reader, self._slices, self._rows, self._first = reader, block.slices, block.rows, first
        self._kept = kept  # where bad lines were dropped as the table was parsed: the records' places in the cut
        self._epoch = reader.epoch
        # the reader's offset where the table's positions began, that position in the block, and where
        # the block's records are among its positions (None: one record a position)
        self._offset, self._at, self._valid_before = offset, at, block.valid_before

    def used(self, n: int) -> dict[str, list[int]] | None:
        """The reader's ``used()`` just past item ``n - 1``: its position and those before it."""
        if self._offset is None:
            return None
        j = n - 1 if self._kept is None else self._kept[n - 1]  # its place in the cut
        vb = self._valid_before
        past = j + 1 if vb is None else int(np.searchsorted(vb, self._first + j + 1, side="left")) - self._at
        return {self._reader.key: [self._epoch, self._offset + past]}

    def where(self, i: int) -> tuple[int, int]:
        """(shard, row) of item ``i``."""
        at = self._first + (i if self._kept is None else self._kept[i])
        at = int(self._rows[at]) if self._rows is not None else at
        for shard, a, z in self._slices:
            if at < z - a:
                return shard, a + at
            at -= z - a
        raise IndexError(i)

    def reject(self, i: int, why: str) -> None:
        self._reader.reject(*self.where(i), why)

    def origins(self, i: int) -> list[Origin]:
        shard, row = self.where(i)
        reader = self._reader
        return [Origin(reader.path(shard), row, None, None, reader.stream, self._epoch, reader.key)]


class ReadIterator(StageIterator):
    """Reads one consumer's (rank x worker) share of each epoch, in epoch order.

    The share of an epoch is :func:`tidal.order.share` of it: with no ``origin``, a
    contiguous range of positions; after an elastic restore, an equal part of what the
    previous topology left of the epochs named in ``origin`` (``{"epoch": e, "done":
    {epoch: intervals}}``), starting at its ``epoch``. Position: the epoch and how many
    positions of its share were passed (``offset``).
    """

    def __init__(
        self,
        plan: ReadPlan,
        world: World,
        position: View | None = None,
        first_epoch: int = 0,
        origin: dict | None = None,
        key: str = "",
        replay: bool = False,
    ):
        self._plan = plan
        self._world = world
        self.key = key
        self._paths: dict[int, str] | None = None  # shard paths as provenance names them, once each
        self.exact = True  # one record per position (bar records skipped as bad)
        self._order: EpochOrder | None = None
        self._following: EpochOrder | None = None  # the next epoch's, once its first block is read ahead
        # the block the last table was cut from, where, and which of its records were kept (None: all)
        self._last: tuple[Block, int, list[int] | None, int, int] | None = None  # and offset, position in block
        self._policy = Policy(plan.errors, quiet=replay, key=key, epoch=lambda: self._epoch)
        # files the index could not read: counted by one reader, so counts add up over readers
        self._unindexed = sum(e is not None for e in plan.shards.errors) if world.consumer == 0 else 0
        self._origin = origin or {k.EPOCH: first_epoch, k.DONE: {}}
        # per epoch: this reader's share, where each of its intervals ends in offsets, and the
        # remainder it reads without yielding (see _read_remainder)
        self._shares: dict[int, tuple[Intervals, np.ndarray, Intervals]] = {}
        self._remainder_read = -1  # the last epoch whose remainder this reader read
        self._run: _Run | None = None  # where the offsets being read are: found once, not twice a batch
        self._blocks = BlockReader(plan, world, self._policy, self._reads, self._order_after, self._owned)
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
        """``rows_read`` and ``bytes_read`` (each file's bytes, of the columns read, in proportion to its rows read); ``skipped``: records dropped as bad (their positions still count);
        ``bad_files``: files dropped whole because the index could not read them (counted
        by the first reader) or found truncated or corrupt while reading (by each reader
        that found it); ``passed``; and the remote counters."""
        blocks = self._blocks
        out: dict = {
            "rows_read": blocks.rows_read,
            "bytes_read": blocks.bytes_read,
            "skipped": blocks.skipped,
            "bad_files": self._unindexed + len(self._policy.bad_files),
            "passed": self.passed,
        }
        out.update(blocks.stats())
        return out

    def position(self) -> dict:
        return {k.FIRST_EPOCH: self._first, k.EPOCH: self._epoch, k.OFFSET: self._offset, k.PASSED: self.passed}

    def used(self) -> dict[str, list[int]]:
        """What this reader has passed, for elastic restores: ``{key: [epoch, offset]}``."""
        return {self.key: [self._epoch, self._offset]}

    def _share(self, epoch: int) -> tuple[Intervals, np.ndarray]:
        intervals, ends, _ = self._epoch_share(epoch)
        return intervals, ends

    def _reads(self, epoch: int) -> Intervals:
        """The positions of ``epoch`` this reader reads: its share, then the remainder where it
        reads it; the blocks it loads, and the bad records that are its own."""
        intervals, _, rest = self._epoch_share(epoch)
        return intervals + rest

    def _owned(self, epoch: int) -> Intervals:
        """The positions of ``epoch`` whose bad records are this reader's to raise or count: those
        it reads (:meth:`_reads`) from where it is on. A reader restored mid-block reads the block
        again, but the bad records before its position were the saving run's: not again."""
        intervals, ends, rest = self._epoch_share(epoch)
        if epoch != self._epoch or self._offset == 0:
            return intervals + rest
        j = int(np.searchsorted(ends, self._offset, side="right")) - 1
        if j >= len(intervals):
            return rest
        at = intervals[j][0] + self._offset - int(ends[j])
        return [(at, intervals[j][1]), *intervals[j + 1 :], *rest]

    def _epoch_share(self, epoch: int) -> tuple[Intervals, np.ndarray, Intervals]:
        if epoch not in self._shares:
            done = self._origin[k.DONE].get(str(epoch), [])
            w, plan = self._world, self._plan
            finite = plan.epochs is not None
            intervals = share(plan.total, done, w.consumers, w.consumer, drop_remainder=finite)
            ends = np.cumsum([0] + [b - a for a, b in intervals])
            # the remainder no reader yields: read by the last one (its share is just before it)
            rest = remainder(plan.total, done, w.consumers) if finite and w.consumer == w.consumers - 1 else []
            # only the current epoch is ever needed, and the next one's start to read ahead
            kept = {e: v for e, v in self._shares.items() if e == epoch - 1}
            self._shares = kept | {epoch: (intervals, ends, rest)}
        return self._shares[epoch]

    def next(self, max_items: int) -> Table:
        while True:
            intervals, ends = self._share(self._epoch)
            if self._offset >= ends[-1]:
                self._read_remainder()
                self._check_epoch(int(ends[-1]))
                if self._plan.epochs is not None and self._epoch + 1 >= self._first + self._plan.epochs:
                    raise StopIteration
                self._epoch, self._offset = self._epoch + 1, 0
                self._kept, self._whole_epoch = 0, True
                continue
            run = self._run
            if run is None or run.epoch != self._epoch or not run.first <= self._offset < run.stop:
                j = int(np.searchsorted(ends, self._offset, side="right")) - 1
                start, end = intervals[j]
                delta = start - int(ends[j])  # position = offset + delta, within this interval
                order = self._epoch_order()
                b = order.block_at(self._offset + delta)
                base = int(order.starts[b])
                block_stop = min(end, int(order.starts[b + 1])) - base
                upto = min(int(ends[j + 1]), base + block_stop - delta)  # where the interval or the block ends
                run = self._run = _Run(self._epoch, self._offset, upto, delta, b, base, block_stop)
            pos = self._offset + run.delta
            order = self._epoch_order()
            self._last = None
            block = self._blocks.block(order, run.block, pos - run.base, run.block_stop, max_items)
            first, last, nxt = block.span(pos - run.base, run.block_stop, max_items)
            start = self._offset
            self._offset += run.base + nxt - pos
            self.passed += run.base + nxt - pos
            if last > first:
                table: Table
                kept: list[int] | None = None
                if isinstance(block.table, Unparsed):
                    table, kept = self._parsed(block, first, last)
                    self._kept += len(table)
                    if not table:
                        continue
                else:
                    self._kept += last - first
                    table = cut(block.table, first, last)
                self._last = (block, first, kept, start, pos - run.base)
                return table

    def _read_remainder(self) -> None:
        """The remainder of the epoch, where this reader reads it (:meth:`_epoch_share`), read
        once its share is: its records are dropped, its bad ones handed to the policy (a block
        read whole met it as it was loaded: the remainder is among this reader's own records)."""
        if self._remainder_read == self._epoch:
            return
        self._remainder_read = self._epoch
        for a, z in self._epoch_share(self._epoch)[2]:
            while a < z:
                order = self._epoch_order()
                b = order.block_at(a)
                base, stop = int(order.starts[b]), min(z, int(order.starts[b + 1]))
                block = self._blocks.load(order, b)
                if isinstance(block.table, Unparsed):
                    first, last, _ = block.span(a - base, stop - base, stop - a)
                    if last > first:
                        self._parsed(block, first, last)
                a = stop

    def _parsed(self, block: Block, first: int, last: int) -> tuple[list, list[int] | None]:
        """The records of a block's lines held unparsed (:mod:`tidal.formats.jsonl`) ``first``
        to ``last``, and which of them they are where some were bad: each bad one handed to the
        policy (raised, or counted)."""
        held, parse = block.table, self._blocks.parse
        assert isinstance(held, Unparsed) and parse is not None
        records, bad, _ = parse(held["line"][first:last], self._plan.columns)
        if not bad:
            return records, None
        where = _Rows(self, block, first, None)
        for i, why in bad:
            shard, row = where.where(i)
            path = self.path(shard)
            error = RecordError(why, path=path, line=int(held["number"][first + i]), row=row)
            try:
                new = self._policy.now(path, error, mine=True)  # raises unless it skips it
            except BaseException:
                self._blocks.close_file(shard)  # as a read that fails closes its file (OpenReaders.using)
                raise
            self._blocks.count_skipped(int(new))  # (not a record reported before in the pass)
        dropped = {i for i, _ in bad}
        return records, [i for i in range(last - first) if i not in dropped]

    def locate(self) -> Locator:
        return _Rows(self, *self._last) if self._last is not None else Unlocated()

    @property
    def epoch(self) -> int:
        """The epoch being read."""
        return self._epoch

    def path(self, shard: int) -> str:
        """Shard ``shard``'s path or URL, as the shard list has it (never a signed URL's query)."""
        if self._paths is None:
            self._paths = {}
        path = self._paths.get(shard)
        if path is None:
            path = self._paths[shard] = redact_urls(self._plan.shards[shard].path)
        return path

    @property
    def stream(self) -> str | None:
        """The mixture stream this source is read as (``"web"``, ``"outer/inner"``), else None."""
        return self.key.rstrip("/") or None

    def reject(self, shard: int, row: int, why: str) -> None:
        """Record ``row`` of ``shard``, yielded last, was found bad downstream: to the policy."""
        path = redact_urls(self._plan.shards[shard].path)
        new = self._policy.now(path, RecordError(why, path=path, row=row), mine=True)  # raises unless it skips it
        self._blocks.count_skipped(int(new))  # (not a record reported before in the pass)
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
            following, self._following = self._following, None
            self._order = (
                following if following is not None and following.epoch == self._epoch else self._made(self._epoch)
            )
            self._blocks.forget()
        return self._order

    def _order_after(self, epoch: int) -> EpochOrder | None:
        """The order of the epoch after ``epoch`` (to read its first block ahead), None where the
        pass ends before it."""
        following = epoch + 1
        if self._plan.epochs is not None and following >= self._first + self._plan.epochs:
            return None
        if self._following is None or self._following.epoch != following:
            self._following = self._made(following)
        return self._following

    def _made(self, epoch: int) -> EpochOrder:
        p = self._plan
        return EpochOrder(
            p.shards.rows,
            seed=p.seed,
            epoch=epoch,
            block_size=p.block_size,
            shards_per_block=p.shards_per_block,
            bytes=p.shards.bytes,
            block_bytes=p.block_bytes,
        )

    def close(self) -> None:
        self._last = None
        self._blocks.close()
