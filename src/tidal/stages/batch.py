"""Batching: records into dicts of columns (numpy arrays where shapes allow, else lists)."""

from __future__ import annotations

from tidal.stages import StageIterator, Stateless
from tidal.tables import Table, columns, concat, length


class BatchIterator(Stateless):
    """Groups records into batches of ``size``; each call returns one batch (a list of one dict)."""

    def __init__(self, upstream: StageIterator, size: int, drop_last: bool):
        self._up, self._size, self._drop_last = upstream, size, drop_last

    def next(self, max_items: int) -> Table:
        parts: list[Table] = []
        have = 0
        while have < self._size:
            try:
                part = self._up.next(self._size - have)
            except StopIteration:
                if have == 0 or self._drop_last:
                    raise
                break
            parts.append(part)
            have += length(part)
        return [columns(concat(parts))]
