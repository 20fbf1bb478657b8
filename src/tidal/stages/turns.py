"""DataLoader workers read their first records by point reads in turn, in the loop's order.

A worker's first batch comes from point reads (:mod:`tidal.stages.blocks`): a few pages of each
of a handful of files, decoded in threads with the GIL released. Two workers doing so side by
side on 2 cores each get one, and the loop waits for the first of them; one at a time, the
first has the cores to itself (a Parquet resume, 2 workers: 0.25 -> 0.21 s to the first batch).
So the workers of a pass take turns, in the order the loop asks for their batches: each reads
its points once the one before has read its own (or is reading its first block whole instead).
Remote point reads wait on the network more than on the cores: only the first worker's go
alone (the loop waits on them), the others' then side by side (8 x 137 MB Parquet over a
shaped link, 2 workers: 1.7 -> 1.35 s, 95 -> 38 MB before the first batch).

:mod:`tidal.transport.warmup` gives each worker process its turn; the training process's own
reader (no workers) has none.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Protocol


class Turn(Protocol):
    def wait(self, behind: int) -> None:
        """Return once the ``behind`` workers before this one (at most) have read their points,
        or they took too long."""

    @property
    def place(self) -> int:
        """How many workers come before this one in the loop's order."""

    def done(self) -> None:
        """The next worker's turn (once: later calls do nothing)."""


_turn: Turn | None = None  # this process's (a DataLoader worker's)


def take(turn: Turn | None) -> None:
    """This process's turn: set in a worker as it starts."""
    global _turn
    _turn = turn


@contextlib.contextmanager
def point_reads(remote: bool) -> Iterator[bool]:
    """Around a worker's first point reads: its turn waited for (``remote``: the first worker's
    alone), the next worker's given when they end. Yields whether they run alone, so that the
    reader may use the rank's cores, not its share of them."""
    turn = _turn
    if turn is None:
        yield False
        return
    try:
        turn.wait(min(turn.place, 1) if remote else turn.place)
        yield not remote
    finally:
        turn.done()


def no_point_reads() -> None:
    """A worker whose first block is read whole (a format without point reads, a first batch of
    half its block): the next worker's turn now, not once the block is read."""
    if _turn is not None:
        _turn.done()
