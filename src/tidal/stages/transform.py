"""Record-wise stages: ``map`` and ``filter``. They hold no position of their own."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tidal.stages import StageIterator
from tidal.tables import Table, keep, records


class MapIterator:
    def __init__(self, upstream: StageIterator, fn: Callable[[Any], Any]):
        self._up, self._fn = upstream, fn
        self.exact = getattr(upstream, "exact", False)  # one item per upstream item

    def next(self, max_items: int) -> Table:
        fn = self._fn
        return [fn(r) for r in records(self._up.next(max_items))]

    def state(self) -> dict:
        return self._up.state()

    def consumed(self) -> dict[str, list[int]]:
        return self._up.consumed()

    def close(self) -> None:
        self._up.close()


class FilterIterator:
    def __init__(self, upstream: StageIterator, fn: Callable[[Any], bool]):
        self._up, self._fn = upstream, fn

    def next(self, max_items: int) -> Table:
        fn = self._fn
        while True:  # StopIteration from upstream ends this stage too
            table = self._up.next(max_items)
            mask = [bool(fn(r)) for r in records(table)]
            if any(mask):
                return table if all(mask) else keep(table, mask)

    def state(self) -> dict:
        return self._up.state()

    def consumed(self) -> dict[str, list[int]]:
        return self._up.consumed()

    def close(self) -> None:
        self._up.close()
