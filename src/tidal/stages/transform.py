"""Record-wise stages: ``map`` and ``filter``. They hold no position of their own.

Their function travels with the chain into DataLoader workers: under ``fork`` any function
does, under ``spawn`` and ``forkserver`` it must pickle (a function defined at the top level
of a module, or a ``functools.partial`` of one). :func:`name_of` makes ``repr`` readable.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tidal.stages import Context, StageIterator, Stateless, Step
from tidal.state.view import View
from tidal.tables import Table, keep, records


def name_of(fn: Callable) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


@dataclass(frozen=True, repr=False)
class Map(Step):
    fn: Callable[[Any], Any]

    def open(self, ctx: Context, position: View | None) -> StageIterator:
        return MapIterator(self.upstream.open(ctx, position), self.fn)

    def call(self) -> str:
        return f"map({name_of(self.fn)})"


@dataclass(frozen=True, repr=False)
class Filter(Step):
    fn: Callable[[Any], bool]

    def open(self, ctx: Context, position: View | None) -> StageIterator:
        return FilterIterator(self.upstream.open(ctx, position), self.fn)

    def call(self) -> str:
        return f"filter({name_of(self.fn)})"


class MapIterator(Stateless):
    def __init__(self, upstream: StageIterator, fn: Callable[[Any], Any]):
        super().__init__(upstream)
        self._fn = fn
        self.exact = upstream.exact  # one item per upstream item

    def next(self, max_items: int) -> Table:
        fn = self._fn
        return [fn(r) for r in records(self._up.next(max_items))]


class FilterIterator(Stateless):
    def __init__(self, upstream: StageIterator, fn: Callable[[Any], bool]):
        super().__init__(upstream)
        self._fn = fn

    def next(self, max_items: int) -> Table:
        fn = self._fn
        while True:  # StopIteration from upstream ends this stage too
            table = self._up.next(max_items)
            mask = [bool(fn(r)) for r in records(table)]
            if any(mask):
                return table if all(mask) else keep(table, mask)
