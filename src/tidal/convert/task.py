"""One task of a conversion: read a range of the source through the chain, write one output shard.

The same :func:`run_task` runs in this process, in a worker process and in a Ray task. It
reads source positions ``[start, stop)`` (the chain opened as a reader whose epoch has every
other position used up, the mechanism an elastic restore uses), writes them with the job's
writer under a temporary name, places the file under its final name in one step, and only
then writes the shard's entry in ``DST/.tidal-convert/done/``: a shard with an entry is
finished; any other is written again, whole, by the next run.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tidal.errors import RecordError
from tidal.stages import Context, Stage
from tidal.state import keys as k
from tidal.tables import Table, length
from tidal.world import World
from tidal.writers.output import WORK, Output

READ_BLOCK = 2048  # records read at once: memory per task is this many records plus one row group


@dataclass(frozen=True)
class Job:
    """What every task needs: picklable, sent once to each worker process or Ray worker."""

    stage: Stage  # the chain over the whole source: unshuffled, one epoch
    total: int  # source records
    offsets: tuple[int, ...]  # where each source shard starts in the source's positions
    paths: tuple[str, ...]  # each source shard's path, for messages
    to: str
    output: Output
    column: str  # tokens: the column of token ids
    dtype: str | None  # tokens: uint16 or uint32
    schema: bytes | None  # parquet: the output's schema, serialized
    ranges: tuple[tuple[int, int], ...]  # output shard k holds source positions ranges[k]

    noun = "conversion"  # what the engines call a run of these tasks in their messages

    def name(self, shard: int) -> str:
        return f"part-{shard:05d}.parquet" if self.to == "parquet" else f"shard-{shard:05d}.tokens"

    def doing(self, shard: int) -> str:
        return f"writing {self.name(shard)}"

    def run(self, shard: int) -> tuple[int, dict]:
        return run_task(self, shard)

    def locate(self, position: int) -> tuple[str, int]:
        """The source file and row of a source position, for messages."""
        i = int(np.searchsorted(self.offsets, position, side="right")) - 1
        i = max(0, min(i, len(self.paths) - 1))
        return self.paths[i], position - self.offsets[i]


def read_range(stage: Stage, total: int, start: int, stop: int) -> Iterator[tuple[Table, int]]:
    """The records of source positions ``[start, stop)`` through the chain, in order, each table
    with the source position after it."""
    done = [[0, start], [stop, total]]
    origin = {"": {k.EPOCH: 0, k.DONE: {"0": done}}}
    it = stage.open(Context(World(), 0, origin), None)
    try:
        while True:
            try:
                table = it.next(READ_BLOCK)
            except StopIteration:
                return
            yield table, start + it.used()[""][1]
    finally:
        it.close()


def run_task(job: Job, shard: int, on_records: Callable[[int], None] | None = None) -> tuple[int, dict]:
    """Write output shard ``shard``: read its source range through the chain, write, place the file,
    record its entry in the done directory. Returns ``(shard, entry)``; the same in every engine."""
    start, stop = job.ranges[shard]
    name = job.name(shard)
    staging = job.output.staging()
    tmp = staging / f".{name}.{os.getpid()}.tmp"
    writer = writer_for(job, tmp)
    pos = start
    exact = one_per_position(job.stage)
    try:
        for table, after in read_range(job.stage, job.total, start, stop):
            try:
                writer.write(table)
            except (ValueError, TypeError) as exc:  # a record the writer cannot take: name where it came from
                within = getattr(exc, "row", None)
                path, row = job.locate(pos + within if exact and within is not None else pos)
                where = "" if exact and within is not None else f" (one of the {length(table)} records from here)"
                raise RecordError(f"cannot write {name}: {exc}{where}", path=path, row=row) from None
            if on_records is not None:
                on_records(after - pos)
            pos = after
        finished = writer.finish()
    except BaseException:
        writer.abort()
        raise
    entry: dict[str, Any] = {"shard": shard, "range": [start, stop], "rows": 0, "bytes": 0}
    if finished is not None:
        file, facts = finished
        entry.update(facts)
        entry["name"] = name
        entry.update(job.output.place(file, name))
    job.output.write_text(f"{WORK}/done/{shard:05d}.json", json.dumps(entry))
    return shard, entry


def one_per_position(stage: Stage) -> bool:
    """Whether every source position yields one record (no filter, no bad records skipped)."""
    return stage.records_per_item() == 1


def writer_for(job: Job, file: Path) -> Any:
    if job.to == "parquet":
        import pyarrow as pa

        from tidal.writers.parquet import ParquetShardWriter

        assert job.schema is not None
        return ParquetShardWriter(file, pa.ipc.read_schema(pa.py_buffer(job.schema)))
    from tidal.writers.tokens import TokenShardWriter

    assert job.dtype is not None
    return TokenShardWriter(file, job.column, job.dtype)


def finished(job: Job) -> dict[int, dict]:
    """The shards an earlier run finished: an entry in the done directory and the file still there, at its size."""
    out = {}
    for name in job.output.names(f"{WORK}/done"):
        if not name.endswith(".json"):
            continue
        text = job.output.read_text(f"{WORK}/done/{name}")
        try:
            entry = json.loads(text or "")
            shard = int(entry["shard"])
        except (ValueError, KeyError, TypeError):
            continue
        if not 0 <= shard < len(job.ranges) or entry.get("range") != list(job.ranges[shard]):
            continue
        if entry.get("name"):
            found = job.output.stat(entry["name"])
            if found is None or found[0] != entry["bytes"]:
                continue
        out[shard] = entry
    return out
