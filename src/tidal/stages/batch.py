"""Batching: records into dicts of columns (numpy arrays where shapes allow, else lists)."""

from __future__ import annotations

from dataclasses import dataclass

from tidal.stages import Context, StageIterator, Stateless, Step
from tidal.stages.locators import Batched, Locator, Unlocated
from tidal.state.view import View
from tidal.tables import Table, columns, concat, length


@dataclass(frozen=True, repr=False)
class Batch(Step):
    METHOD = "batch"

    size: int
    drop_last: bool = True

    def open(self, ctx: Context, position: View | None) -> StageIterator:
        return BatchIterator(self.upstream.open(ctx, position), self.size, self.drop_last, ctx.trace)

    def facts(self) -> list:
        return [self.size, self.drop_last]

    def records_per_item(self) -> int | None:
        each = self.upstream.records_per_item()
        return self.size * each if each is not None else None

    def may_end_unevenly(self) -> bool:
        return self.upstream.may_end_unevenly()  # readers of as many records make as many batches

    def batch_size(self) -> int | None:
        return self.size

    def call(self) -> str:
        return f"batch({self.size}, drop_last={self.drop_last})"


class BatchIterator(Stateless):
    """Groups records into batches of ``size``; each call returns one batch (a list of one dict)."""

    def __init__(self, upstream: StageIterator, size: int, drop_last: bool, trace: bool = False):
        super().__init__(upstream)
        self._size, self._drop_last = size, drop_last
        self._trace = trace
        self._located: Locator = Unlocated()  # with trace: where the last batch's rows came from

    def next(self, max_items: int) -> Table:
        parts: list[Table] = []
        located: list[tuple[int, Locator]] = []
        have = 0
        while have < self._size:
            try:
                part = self._up.next(self._size - have)
            except StopIteration:
                if have == 0 or self._drop_last:
                    raise
                break
            if self._trace:
                located.append((have, self._up.locate()))
            parts.append(part)
            have += length(part)
        if self._trace:
            self._located = Batched(located, have)
        return [columns(concat(parts))]

    def locate(self) -> Locator:
        return self._located
