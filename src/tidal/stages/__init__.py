"""Stages: iterators over tables of records that can report and restore their position.

Every stage iterator has ``next(max_items) -> Table`` (between 1 and ``max_items`` items;
``StopIteration`` at the end) and ``state() -> dict``, the position after the last item it
returned. A stage never takes more from upstream than the items it returns need, so its
state is exact at every call boundary, and none keeps a buffer between calls.
"""

from __future__ import annotations

from typing import Protocol

from tidal.tables import Table


class StageIterator(Protocol):
    def next(self, max_items: int) -> Table: ...

    def state(self) -> dict: ...

    def close(self) -> None: ...
