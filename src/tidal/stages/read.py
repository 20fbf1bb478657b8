"""The source stage: one reader's share of each epoch, block by block, in epoch order."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from tidal.errors import StateError, TidalError
from tidal.formats import Errors, Reader, module
from tidal.order import EpochOrder, consumer_range
from tidal.shards import Shard
from tidal.tables import Table, concat, cut, take
from tidal.world import World


@dataclass(frozen=True)
class ReadPlan:
    """What the source stage needs: the shards and how to order them."""

    shards: tuple[Shard, ...]
    columns: tuple[str, ...] | None
    errors: Errors
    seed: int | None
    block_size: int
    shards_per_block: int
    epochs: int | None  # None: forever

    @property
    def total(self) -> int:
        return sum(s.rows for s in self.shards)


class _Block:
    """One loaded block, its records already in yield order, and where skipped records were."""

    def __init__(self, table: Table, valid_before: np.ndarray | None):
        self.table = table
        self.valid_before = valid_before  # kept records before each position; None: all kept

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


class ReadIterator:
    """Reads positions ``[start, stop)`` of each epoch for one consumer (rank x worker)."""

    MAX_OPEN = 64

    def __init__(self, plan: ReadPlan, world: World, state: dict | None = None, first_epoch: int = 0):
        self._plan = plan
        self._world = world
        self._readers: OrderedDict[int, Reader] = OrderedDict()
        self._order: EpochOrder | None = None
        self._block_index = -1
        self._block: _Block | None = None
        self.rows_read = 0  # rows read from files, yielded or not: what a resume costs
        self.skipped = 0  # bad records dropped under errors="skip"
        total = plan.total
        if total == 0 and plan.epochs is None:
            raise TidalError("the dataset has no records, so it cannot repeat forever")
        self._start, self._stop = consumer_range(
            total, world.consumers, world.consumer, drop_remainder=plan.epochs is not None
        )
        if plan.epochs is None and self._start == self._stop:
            raise TidalError(
                f"{total} records cannot feed {world.consumers} readers ({world.world_size} ranks x "
                f"{world.num_workers} workers) forever: each needs at least one record per epoch"
            )
        if state is None:
            self._first, self._epoch, self._pos = first_epoch, first_epoch, self._start
        else:
            self._first, self._epoch, self._pos = int(state["first_epoch"]), int(state["epoch"]), int(state["pos"])
            if not self._start <= self._pos <= self._stop:
                raise StateError(f"position {self._pos} is outside this reader's range {self._start}..{self._stop}")

    def stats(self) -> dict:
        return {"rows_read": self.rows_read, "skipped": self.skipped}

    def state(self) -> dict:
        return {"first_epoch": self._first, "epoch": self._epoch, "pos": self._pos}

    def next(self, max_items: int) -> Table:
        while True:
            if self._pos >= self._stop:
                if self._plan.epochs is not None and self._epoch + 1 >= self._first + self._plan.epochs:
                    raise StopIteration
                self._epoch, self._pos = self._epoch + 1, self._start
                continue
            order = self._epoch_order()
            b = order.block_at(self._pos)
            block = self._load(order, b)
            base = int(order.starts[b])
            stop = min(self._stop, int(order.starts[b + 1])) - base
            first, last, nxt = block.span(self._pos - base, stop, max_items)
            self._pos = base + nxt
            if last > first:
                return cut(block.table, first, last)

    def _epoch_order(self) -> EpochOrder:
        if self._order is None or self._order.epoch != self._epoch:
            p = self._plan
            self._order = EpochOrder(
                [s.rows for s in p.shards],
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
        self._block = None  # free the old block before reading the new one
        tables, masks, any_skipped = [], [], False
        for shard, a, z in order.slices(b):
            piece = self._reader(shard).read(a, z)
            self.rows_read += z - a
            if piece.valid is not None:
                self.skipped += int((~piece.valid).sum())
            tables.append(piece.table)
            masks.append(np.ones(z - a, dtype=bool) if piece.valid is None else piece.valid)
            any_skipped |= piece.valid is not None
        table = concat(tables)
        perm = order.permutation(b)
        valid_before = None
        if any_skipped:
            valid = np.concatenate(masks)
            kept_index = np.cumsum(valid) - 1  # row in ``table`` of each kept position
            if perm is not None:
                valid = valid[perm]
                perm = kept_index[perm][valid]
            valid_before = np.concatenate([[0], np.cumsum(valid)])
        if perm is not None:
            table = take(table, perm)
        self._block_index, self._block = b, _Block(table, valid_before)
        return self._block

    def _reader(self, index: int) -> Reader:
        reader = self._readers.get(index)
        if reader is None:
            shard = self._plan.shards[index]
            columns = list(self._plan.columns) if self._plan.columns is not None else None
            reader = module(shard.format).open(shard.path, shard.compression, shard.info, columns, self._plan.errors)
            self._readers[index] = reader
            if len(self._readers) > self.MAX_OPEN:
                self._readers.popitem(last=False)[1].close()
        else:
            self._readers.move_to_end(index)
        return reader

    def close(self) -> None:
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()
        self._block = None
