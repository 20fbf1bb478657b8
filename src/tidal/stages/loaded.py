"""A block as the source stage holds it: its records in yield order, and where skipped ones were.

:class:`Block` is a block loaded whole (:mod:`tidal.stages.blocks`); :class:`Points` the first
records of a reader's first block, read by point reads (:mod:`tidal.stages.points`) while the
block loads behind them. The source stage (:mod:`tidal.stages.read`) cuts its items from either
the same way, through ``span``.
"""

from __future__ import annotations

import numpy as np

from tidal.tables import Table


class Block:
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


class Points(Block):
    """The records of positions ``[first, end)`` of a block, read by point reads (every one kept):
    ``table[i]`` is position ``first + i``, ``rows[i]`` its row among the slices."""

    def __init__(self, table: Table, slices: list[tuple[int, int, int]], rows: np.ndarray, first: int, end: int):
        super().__init__(table, None, slices, rows)
        self.first, self.end = first, end

    def span(self, offset: int, stop: int, max_items: int) -> tuple[int, int, int]:
        end = min(stop, offset + max_items, self.end)
        return offset - self.first, end - self.first, end
