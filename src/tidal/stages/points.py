"""The first records of a reader's first block, read by point reads while the block loads behind.

A block is read whole before any of it is yielded: its slices, permuted. At a reader's start (a
job's start, a resume, an elastic restore) that is every file of the block before the first
batch, though a batch of 8 needs 8 records. So the reader's first batch comes from *point reads*:
the permutation says which rows of which slices the positions asked for hold, and only those are
read (:mod:`tidal.stages.blocks` reads them; this module plans and assembles). The order is the
block's: the records are those the loaded block would give at those positions, in that order.

A format reads a point through ``around(info, start, stop, row)``: the rows it reads so that its
verdict on ``row`` is the one reading the slice ``[start, stop)`` gives (a line alone; the strip
of 256 rows of a Parquet row group, within the slice or not). A format without it is read whole,
as before.

>>> planned = plan(slices, perm, offset=0, end=8, arounds=[parquet.around] * len(slices), infos=infos)
>>> pieces = [reader(s).read(a, z) for s, a, z in planned.runs]      # shard, first row, stop
>>> table = assemble(planned, [p.table for p in pieces], files, shuffled=True)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from tidal.tables import Table, concat, decoded, take

SLICED_ROWS = 256  # up to this many records, taken as slices (see _rows); more, by Arrow's take

Around = Callable[[dict, int, int, int], tuple[int, int]]


@dataclass(frozen=True)
class Planned:
    """What to read for positions ``[first, end)`` of a block, and where each record is then."""

    runs: list[tuple[int, int, int]]  # (shard, first row, stop) to read, slice by slice, in row order
    at: np.ndarray  # per position: its record's index in the runs' rows, read end to end
    rows: np.ndarray  # per position: its row among the block's slices (as Block.rows says)
    first: int
    end: int

    @property
    def read(self) -> int:
        """Rows the runs read."""
        return sum(z - a for _, a, z in self.runs)


def plan(
    slices: Sequence[tuple[int, int, int]],
    perm: np.ndarray | None,
    first: int,
    end: int,
    arounds: Sequence[Around],
    infos: Sequence[dict],
) -> Planned:
    """The runs of rows to read for positions ``first .. end`` of the block of ``slices`` (each
    ``(shard, start, stop)``) permuted by ``perm`` (None: in order); ``arounds[k]`` and
    ``infos[k]``: the format's ``around`` and the index's facts of slice ``k``'s shard."""
    rows = np.asarray(perm[first:end] if perm is not None else np.arange(first, end), dtype=np.int64)
    lengths = np.array([z - a for _, a, z in slices], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    which = np.searchsorted(starts, rows, side="right") - 1  # the slice of each position's row
    runs: list[tuple[int, int, int]] = []
    at = np.zeros(len(rows), dtype=np.int64)
    before = 0  # rows of the runs planned so far
    for k in np.unique(which).tolist():
        shard, a, z = slices[k]
        mine = np.flatnonzero(which == k)
        file_rows = a + rows[mine] - int(starts[k])
        spans = sorted({arounds[k](infos[k], a, z, int(r)) for r in file_rows.tolist()})
        merged: list[list[int]] = []
        for lo, hi in spans:  # spans of one format never overlap but in whole: merged where they touch
            if merged and lo <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], hi)
            else:
                merged.append([lo, hi])
        los = np.array([lo for lo, _ in merged], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum([hi - lo for lo, hi in merged])])
        j = np.searchsorted(los, file_rows, side="right") - 1
        at[mine] = before + offsets[j] + file_rows - los[j]
        before += int(offsets[-1])
        runs += [(shard, lo, hi) for lo, hi in merged]
    return Planned(runs, at, rows, first, end)


def assemble(planned: Planned, tables: list[Table], files: list[str], *, shuffled: bool) -> Table:
    """The records of the planned positions, in their order, from the runs' tables (every row of
    each kept): made as the loaded block makes its records (one table of the pieces, Python where
    the block is permuted), but taken first: each record comes with the strip of rows read for
    it, and making all of them Python cost a resumed worker more than its records (2-9 ms)."""
    table = concat(tables, files)
    if not isinstance(table, pa.Table):
        return take(table, planned.at)
    table = _rows(table, planned.at)
    return decoded(table) if shuffled else table


def _rows(table: pa.Table, at: np.ndarray) -> pa.Table:
    """Rows ``at`` of ``table`` as one-row slices, not Arrow's take: the first take in a process
    sets up Arrow's compute functions (~50 ms, here in a resumed worker before its first batch)."""
    if len(at) > SLICED_ROWS:
        return take(table, at)
    return pa.concat_tables([table.slice(int(i), 1) for i in at]) if len(at) else table.slice(0, 0)
