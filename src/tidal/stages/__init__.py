"""Stages: iterators over tables of records that can report and restore their position.

Every stage iterator has ``next(max_items) -> Table`` (between 1 and ``max_items`` items;
``StopIteration`` at the end) and ``state() -> dict``, the position after the last item it
returned. A stage never takes more from upstream than the items it returns need, so its
state is exact at every call boundary; a stage that buffers (packing) saves where its
buffer began upstream and an offset into it, never the buffer.

``consumed()`` says, for elastic restores, which records of each source are used up:
``{source key: [epoch, offset in the reader's share]}``. ``exact`` is true when each item a
stage returns stands for exactly one source record, in order (no filter, batch or pack).
"""

from __future__ import annotations

from typing import Protocol

from tidal.tables import Table


class StageIterator(Protocol):
    def next(self, max_items: int) -> Table: ...

    def state(self) -> dict: ...

    def consumed(self) -> dict[str, list[int]]: ...

    def close(self) -> None: ...


class Stateless:
    """Base of stages with no position of their own: one that returns every item it computes
    from what it took upstream (map, filter, batch, tokenize) is where its upstream is."""

    _up: StageIterator

    def state(self) -> dict:
        return self._up.state()

    def consumed(self) -> dict[str, list[int]]:
        return self._up.consumed()

    def close(self) -> None:
        self._up.close()
