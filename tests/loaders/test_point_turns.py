"""DataLoader workers read their first records by point reads in turn (tidal.stages.turns)."""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import make_shards

import tidal
from tidal.stages.blocks import BlockReader
from tidal.storage import Storage

pytest_plugins = ["s3_fixtures"]


def ids(batches: list[dict]) -> list[list[int]]:
    return [b["id"].tolist() for b in batches]


@pytest.mark.parametrize("where", ["local", "remote"])
def test_workers_read_their_first_records_by_point_reads_in_turn_in_the_loop_s_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest, where: str
) -> None:
    """Parquet, 3 workers: each reads its first batch's records by point reads once the worker
    before it in the loop's order has read its own (they have the cores to themselves), from
    worker 0, and after a resume from the worker the loop continues with; remote, the workers
    after the first once the first has (they wait on the network, not the cores)."""
    data = make_shards(tmp_path / "data", [300] * 6, kinds=("parquet",))
    storage = None
    if where == "remote":
        s3 = request.getfixturevalue("s3")
        data = s3.upload(data, request.getfixturevalue("bucket"), "turns")
        storage = Storage(options=s3.options(), cache_dir=str(tmp_path / "cache"))
    log = tmp_path / "points.log"
    real = BlockReader._read_points

    def read_points(self: BlockReader, *args: Any) -> Any:
        reader = tidal.World.current().worker
        with open(log, "a") as f:
            f.write(f"{reader} start {time.monotonic()}\n")
        try:
            return real(self, *args)
        finally:
            with open(log, "a") as f:
                f.write(f"{reader} end {time.monotonic()}\n")

    monkeypatch.setattr(BlockReader, "_read_points", read_points)  # (forked workers have it)
    monkeypatch.setenv("TIDAL_WARMUP_WORKERS", "2")  # 2 cores, as CI has: one worker's threads fill them
    monkeypatch.setenv("TIDAL_READ_THREADS", "2")
    ds = tidal.Dataset(data, storage=storage).shuffle(seed=5, block_size=600).batch(4)
    plain = ids(tidal.DataLoader(ds, num_workers=3, start_early=False))
    log.unlink()

    def in_turn(order: list[int]) -> None:
        spans: dict[int, list[float]] = {}
        for line in log.read_text().splitlines():
            reader, _, at = line.split()
            spans.setdefault(int(reader), []).append(float(at))
        assert sorted(spans) == sorted(order) and all(len(span) == 2 for span in spans.values()), spans
        pairs = itertools.pairwise(order) if where == "local" else [(order[0], later) for later in order[1:]]
        for before, after in pairs:
            assert spans[after][0] >= spans[before][1], f"reader {after} read while {before} did ({order})"
        log.unlink()

    loader = tidal.DataLoader(ds, num_workers=3, start_early=False)
    head = ids(list(itertools.islice(loader, 5)))  # the loop continues with worker 2
    in_turn([0, 1, 2])
    state = loader.state_dict()
    del loader
    resumed = tidal.DataLoader(ds, num_workers=3, start_early=False)
    resumed.load_state_dict(state)
    assert head + ids(list(resumed)) == plain
    in_turn([2, 0, 1])
