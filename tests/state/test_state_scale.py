"""A loader state at 1,024 ranks x 8 workers (8,192 readers): under a kilobyte per reader.

No process is started per rank: a state saved after ``n`` batches per rank is made the way
``tidal state skip`` moves one, from the start by whole batches, which is exact for plain
batches (``test_state.py`` resumes from such states batch for batch); one reader of it is
checked against a real iterator at that topology. The corpus is a sparse flat token file:
16,777,216 rows of 4,096 token ids, 128 GiB, of which nothing is written.
"""

from __future__ import annotations

import json

import pytest

import tidal
from tidal.state import keys as k
from tidal.state import schema, skip
from tidal.world import World

RANKS, WORKERS = 1024, 8
LIMIT = 1024  # bytes of JSON per reader


@pytest.fixture(scope="module")
def ds(tmp_path_factory: pytest.TempPathFactory) -> tidal.Dataset:
    root = tmp_path_factory.mktemp("corpus")
    with open(root / "train.bin", "wb") as f:
        f.truncate(1 << 37)
    return tidal.Dataset(root).shuffle(seed=0, block_size=1024).batch(8)


def saved(ds: tidal.Dataset, ranks: int, workers: int, batches: int, origin: dict | None = None) -> dict:
    """``DataLoader.state_dict()`` of a run on ``ranks`` x ``workers`` after ``batches`` batches per
    rank (restored from ``origin``, the progress of a state saved on another topology)."""
    start = schema.make(
        ds.fingerprint(),
        schema.sources_of(ds.sources()),
        0,
        0,
        [ranks, workers],
        [schema.fresh_rank(workers) for _ in range(ranks)],
        origin,
        ds.records_per_batch(),
    )
    return json.loads(json.dumps(skip(start, batches)))


def test_the_state_of_8192_readers_stays_under_a_kilobyte_each(ds: tidal.Dataset) -> None:
    state = saved(ds, RANKS, WORKERS, 1001)
    assert ds.num_records == 1 << 24
    # every reader is part-way into its share: the progress holds an interval per reader
    assert len(state[k.PROGRESS][""][k.DONE]["0"]) == RANKS * WORKERS
    # ... and is where a real reader of that topology is after its batches (125 of rank 517's 1,001)
    it = ds.iterator(World(517, RANKS, 3, WORKERS))
    for _ in range(125):
        next(it)
    assert state[k.RANKS][517][k.WORKERS][3] == json.loads(json.dumps(it.state()))
    it.close()
    size = len(json.dumps(state))
    assert size / (RANKS * WORKERS) < LIMIT, f"{size:,} bytes for {RANKS * WORKERS} readers"


def test_a_state_restored_on_another_topology_stays_under_a_kilobyte_per_reader(ds: tidal.Dataset) -> None:
    """After an elastic restore the state also carries the origin it was restored from: the
    8,192 intervals the old readers left, beside the new readers' own."""
    before = saved(ds, RANKS, WORKERS, 1001)
    origin = schema.restore(schema.check(before, ds.fingerprint(), schema.sources_of(ds.sources())), 0, RANKS, 7)
    state = saved(ds, RANKS, 7, 37, origin.origin)
    assert len(state[k.ORIGIN][""][k.DONE]["0"]) == RANKS * WORKERS
    assert len(state[k.PROGRESS][""][k.DONE]["0"]) > RANKS * WORKERS
    schema.check(state, ds.fingerprint(), schema.sources_of(ds.sources()))
    size = len(json.dumps(state))
    assert size / (RANKS * 7) < LIMIT, f"{size:,} bytes for {RANKS * 7} readers"
