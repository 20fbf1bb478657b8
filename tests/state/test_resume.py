"""Every stage restores exactly, after every item, across epoch boundaries too."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from conftest import make_shards

import tidal
from tidal.testing import assert_resumes_exactly, same
from tidal.world import World

PIPELINES = {
    "plain": lambda ds: ds,
    "shuffled": lambda ds: ds.shuffle(seed=5, block_size=16, shards_per_block=3),
    "two epochs": lambda ds: ds.shuffle(seed=1, block_size=10).repeat(2),
    "map": lambda ds: ds.shuffle(seed=2, block_size=12).map(lambda r: {**r, "double": 2 * r["id"]}),
    "filter": lambda ds: ds.shuffle(seed=3, block_size=12).repeat(2).filter(lambda r: r["id"] % 3 != 0),
    "batch": lambda ds: ds.shuffle(seed=4, block_size=20).repeat(2).batch(7, drop_last=False),
    "filter+batch": lambda ds: ds.shuffle(seed=6).repeat(3).filter(lambda r: r["id"] % 2 == 0).batch(5),
}


@pytest.mark.parametrize("name", PIPELINES)
def test_resume_after_every_step_is_identical(shards: Path, name: str) -> None:
    ds = PIPELINES[name](tidal.Dataset(shards))
    assert assert_resumes_exactly(ds, horizon=None if name == "batch" else 6) > 10


@pytest.mark.parametrize("world", [World(0, 2, 1, 3), World(1, 2, 2, 3), World(0, 1, 0, 4)])
def test_resume_is_exact_for_every_reader_of_a_topology(shards: Path, world: World) -> None:
    ds = tidal.Dataset(shards).shuffle(seed=9, block_size=8).repeat(2).batch(3, drop_last=False)
    assert assert_resumes_exactly(ds, world, horizon=None) > 0


def test_resume_of_an_infinite_stream_crosses_many_epochs(shards: Path) -> None:
    ds = tidal.Dataset(shards).shuffle(seed=11, block_size=25).repeat().batch(16)
    assert assert_resumes_exactly(ds, every=3, limit=60) == 60  # 960 records: over 7 epochs


def test_resume_with_skipped_bad_records(tmp_path: Path) -> None:
    lines = [json.dumps({"id": i}) if i % 7 else "{broken" for i in range(60)]
    (tmp_path / "a.jsonl").write_text("\n".join(lines))
    ds = tidal.Dataset(tmp_path, errors="skip").shuffle(seed=0, block_size=9).repeat(2)
    assert assert_resumes_exactly(ds, horizon=None) == 2 * 51


def test_state_is_small_and_does_not_grow_with_position(shards: Path) -> None:
    ds = tidal.Dataset(shards).shuffle(seed=0).repeat().batch(4)
    it = ds.iterator(World())
    sizes = []
    for _ in range(5):
        for _ in itertools.islice(it, 200):
            pass
        sizes.append(len(json.dumps(it.state())))
    assert max(sizes) < 300 and max(sizes) - min(sizes) <= 8


def test_a_resume_reads_at_most_one_block_before_the_first_item(tmp_path: Path) -> None:
    root = make_shards(tmp_path / "data", [500] * 20, kinds=("jsonl", "parquet"))
    ds = tidal.Dataset(root).shuffle(seed=3, block_size=400, shards_per_block=4)
    for fraction in (0.1, 0.9):
        it = ds.iterator(World())
        for _ in itertools.islice(it, int(fraction * ds.num_records)):
            pass
        resumed = ds.iterator(World(), state=it.state())
        next(resumed)
        assert resumed.stats()["rows_read"] <= 400 + 4, resumed.stats()


def test_a_state_from_another_dataset_or_reader_is_refused(shards: Path) -> None:
    ds = tidal.Dataset(shards).shuffle(seed=1)
    it = ds.iterator(World(0, 2, 0, 1))
    next(it)
    state = it.state()
    with pytest.raises(tidal.StateError, match="different dataset"):
        tidal.Dataset(shards).shuffle(seed=2).iterator(World(0, 2, 0, 1), state=state)
    with pytest.raises(tidal.StateError, match="saved by reader"):
        ds.iterator(World(1, 2, 0, 1), state=state)


def test_dataset_speaks_the_stateful_protocol(shards: Path) -> None:
    ds = tidal.Dataset(shards).shuffle(seed=8).batch(4)
    reference = list(ds)
    it = iter(ds)
    for _ in range(5):
        next(it)
    state = json.loads(json.dumps(ds.state_dict()))
    fresh = tidal.Dataset(shards).shuffle(seed=8).batch(4)
    fresh.load_state_dict(state)
    rest = list(fresh)
    assert len(rest) == len(reference) - 5 and all(same(a, b) for a, b in zip(rest, reference[5:], strict=True))
    assert len(list(fresh)) == len(reference)  # the restore applies to one iteration only
