"""Continuous batch rows: each row of a batch is a stream of its own, continued step after step.

``batch(n, continuous=True)`` is what truncated backpropagation through time and models that
carry memory from one step to the next (Transformer-XL, RWKV/Mamba-style recurrent state)
need: row ``i`` of step ``t + 1`` continues row ``i`` of step ``t``. Over a packed stream
(``pack(seq_len)``, concat), the tokens of row ``i`` run on from one step to the next, so
with ``shift_labels=True`` the label of the last position of row ``i`` at step ``t`` is the
first token of row ``i`` at step ``t + 1``.

Each row is a reader of its own. The stage opens its upstream once per row, with the
reader's :class:`~tidal.world.World` split into *lanes* (:meth:`World.with_lane`), so each
epoch is shared, disjointly, between ranks x workers x rows, and each row streams a
contiguous part of the (shuffled) epoch. Every batch steps every row by one item; when one
row ends (a finite pass), the stream ends.

Several workers: each of a rank's ``W`` workers holds ``n / W`` of its rows (``n`` must divide
evenly), and :class:`tidal.DataLoader` and :class:`tidal.jax.Loader` put one batch of every
worker side by side into each step of ``n`` rows, in worker order; so the rows of a rank are
the same streams whatever the worker count, and each step continues the one before it. A
loader that yields each worker's batch on its own (torch's own ``DataLoader`` with workers)
would yield those partial batches in turn: use tidal's loaders.

Position: ``{"rows": [each row's position]}``. What each row has used up counts as a reader's
(:mod:`tidal.state.elastic`): ``used()`` gives, per source, every row's ``[epoch, offset]``
one after the other (``[e0, o0, e1, o1, ...]``), so a state restores elastically on any
topology, with nothing lost or repeated at the granularity of the upstream.

``stats()["rows_refilled"]``: how many times a row took in new source data at a step (a new
document began in it, or, unpacked, its next record), summed over steps and rows.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from tidal.errors import ArgumentError, StateError
from tidal.stages import Context, Stage, StageIterator, add_stats
from tidal.stages.batch import Batch
from tidal.stages.locators import Locator, Origin, Unlocated
from tidal.state import keys as k
from tidal.state.view import View
from tidal.tables import Table, columns, concat


def rows_per_reader(size: int, workers: int) -> int:
    """Rows each of ``workers`` readers of a rank streams for batches of ``size`` continuous rows."""
    if size % workers:
        raise ArgumentError(
            f"batch({size}, continuous=True): {size} rows cannot be shared evenly by {workers} workers; "
            "use a batch size that the worker count divides"
        )
    return size // workers


def shared_rows(stage: Stage, workers: int) -> bool:
    """Whether a loader of ``workers`` readers per rank makes each batch of ``stage`` from one
    batch of every reader, side by side (:func:`tidal.transport.bundles.steps`): continuous rows shared by
    several workers. Raises when the rows cannot be shared evenly."""
    if not isinstance(stage, ContinuousBatch) or workers == 1:
        return False
    rows_per_reader(stage.size, workers)
    return True


@dataclass(frozen=True, repr=False)
class ContinuousBatch(Batch):
    """``size`` rows per batch, each a stream of its own that the next batch continues."""

    EXTRA = (("continuous", "drop_last"),)  # batch(size, continuous=True)

    def open(self, ctx: Context, position: View | None) -> StageIterator:
        return ContinuousBatchIterator(self, ctx, position)

    def facts(self) -> list:
        return [self.size]

    def call(self) -> str:
        return f"batch({self.size}, continuous=True)"

    def config_args(self) -> dict[str, Any]:
        return {"size": self.size, "continuous": True}  # drop_last: always


class ContinuousBatchIterator(StageIterator):
    """One upstream iterator per row; each ``next`` takes one item of every row."""

    def __init__(self, stage: ContinuousBatch, ctx: Context, position: View | None):
        world = ctx.world
        lanes = rows_per_reader(stage.size, world.num_workers)
        saved: list[View | None] = [None] * lanes
        if position is not None:
            rows = position.entries(k.ROWS)
            if len(rows) != lanes:
                raise StateError(
                    f"{position.where(k.ROWS)}: {len(rows)} rows saved where this reader streams {lanes} "
                    f"(batch({stage.size}, continuous=True) over {world.num_workers} workers)"
                )
            saved = [View(r, f"{position.where(k.ROWS)}[{i}]") for i, r in enumerate(rows)]
        self._rows: list[StageIterator] = []
        try:
            for lane in range(lanes):
                row_ctx = replace(ctx, world=world.with_lane(lane, lanes))
                self._rows.append(stage.upstream.open(row_ctx, saved[lane]))
        except BaseException:
            self.close()
            raise
        self._ended = False
        self.refilled = 0

    def next(self, max_items: int) -> Table:
        if self._ended:
            raise StopIteration
        parts: list[Table] = []
        for row in self._rows:
            before = row.used()
            try:
                parts.append(row.next(1))
            except StopIteration:
                self._ended = True  # one row ended: every row's stream ends with it
                raise
            if row.used() != before:
                self.refilled += 1
        return [columns(concat(parts))]

    def locate(self) -> Locator:
        return _Lanes(self._rows)

    def position(self) -> dict:
        return {k.ROWS: [row.position() for row in self._rows]}

    def used(self) -> dict[str, list[int]]:
        """Per source, each row's ``[epoch, offset]``, one after the other."""
        parts = [row.used() for row in self._rows]
        return {key: [v for part in parts for v in part[key]] for key in parts[0]}

    def stats(self) -> dict:
        mine = {"rows": len(self._rows), "rows_refilled": self.refilled}
        return add_stats(*(row.stats() for row in self._rows), mine)

    def close(self) -> None:
        for row in self._rows:
            row.close()


class _Lanes(Unlocated):
    """The batch a continuous batch iterator returned last: one row per lane, each lane's last item."""

    def __init__(self, lanes: list[StageIterator]):
        self._lanes = [lane.locate() for lane in lanes]

    def rows(self, i: int) -> list[list[Origin]]:
        return [lane.origins(0) for lane in self._lanes]
