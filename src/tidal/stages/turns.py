"""DataLoader workers read their first records by point reads in turn, in the loop's order.

A worker's first batch comes from point reads (:mod:`tidal.stages.blocks`): a few pages of each
of a handful of files, decoded in threads with the GIL released. Two workers doing so side by
side on 2 cores each get one, and the loop waits for the first of them; one at a time, the
first has the cores to itself (a Parquet resume, 2 workers: 0.25 -> 0.21 s to the first batch).
So the workers of a pass take turns, in the order the loop asks for their batches, as many at
once as their threads fill the rank's cores (``TIDAL_WARMUP_WORKERS`` over ``TIDAL_READ_THREADS``:
one on 2 cores, 16 on 64): each reads its points once those before it have read theirs (or are
reading their first block whole instead). Remote point reads wait on the network more than on
the cores: where one worker fills the cores, the first worker's go alone (the loop waits on
them) and the others' then side by side (8 x 137 MB Parquet over a shaped link, 2 workers: 1.7
-> 1.35 s, 95 -> 38 MB before the first batch); elsewhere all at once.

:mod:`tidal.transport.warmup` gives each worker process its turn; the training process's own
reader (no workers) has none.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Protocol

from tidal import env


class Turn(Protocol):
    def wait(self, behind: int) -> None:
        """Return once ``behind`` workers (of those before this one) have read their points, or
        they took too long."""

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
    """Around a worker's first point reads: its turn waited for, the next worker's given when
    they end. Yields whether they took turns: the reader may then read with the threads of a
    reader alone on the rank's cores, not with its share of them."""
    turn = _turn
    if turn is None:
        yield False
        return
    # as many workers at once as their threads fill the rank's cores (on 2 cores, one)
    together = max(1, env.warmup_workers() // max(1, env.read_threads()))
    try:
        if remote:
            turn.wait(min(turn.place, 1) if together == 1 else 0)
        else:
            turn.wait(max(0, turn.place - together + 1))
        yield not remote
    finally:
        turn.done()


def no_point_reads() -> None:
    """A worker whose first block is read whole (a format without point reads, a first batch of
    half its block): the next worker's turn now, not once the block is read."""
    if _turn is not None:
        _turn.done()
