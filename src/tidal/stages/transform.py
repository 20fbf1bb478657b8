"""Record-wise stages: ``map`` and ``filter``. They hold no position of their own."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tidal.stages import StageIterator, Stateless
from tidal.tables import Table, keep, records


class MapIterator(Stateless):
    def __init__(self, upstream: StageIterator, fn: Callable[[Any], Any]):
        self._up, self._fn = upstream, fn
        self.exact = getattr(upstream, "exact", False)  # one item per upstream item

    def next(self, max_items: int) -> Table:
        fn = self._fn
        return [fn(r) for r in records(self._up.next(max_items))]


class FilterIterator(Stateless):
    def __init__(self, upstream: StageIterator, fn: Callable[[Any], bool]):
        self._up, self._fn = upstream, fn

    def next(self, max_items: int) -> Table:
        fn = self._fn
        while True:  # StopIteration from upstream ends this stage too
            table = self._up.next(max_items)
            mask = [bool(fn(r)) for r in records(table)]
            if any(mask):
                return table if all(mask) else keep(table, mask)
