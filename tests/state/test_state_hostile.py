"""A malformed or hostile state is a StateError that names the key, never an error from inside."""

from __future__ import annotations

import copy
import itertools
import json
import multiprocessing
from pathlib import Path
from typing import Any

import pytest
from conftest import make_shards

import tidal

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_shards(tmp_path_factory.mktemp("hostile") / "data", [40, 75, 13, 60, 52, 33, 17])


def dataset(data: Path) -> tidal.Dataset:
    return tidal.Dataset(data).shuffle(seed=1, block_size=32).repeat(2).batch(6)


@pytest.fixture(scope="module")
def saved(data: Path) -> dict:
    loader = tidal.DataLoader(dataset(data), num_workers=2)
    list(itertools.islice(loader, 5))
    return json.loads(json.dumps(loader.state_dict()))


def changed(state: dict, path: list[Any], value: Any) -> dict:
    out = copy.deepcopy(state)
    at = out
    for key in path[:-1]:
        at = at[key]
    at[path[-1]] = value
    return out


W0 = ["ranks", 0, "workers", 0]
HOSTILE = [
    (["ranks"], None, r"state\['ranks'\]: expected a list, found None"),
    (["ranks"], [], r"state\['ranks'\]: expected 1 entries"),
    (["topology"], [1, 0], r"state\['topology'\]\[1\]: expected a positive integer"),
    (["topology"], "1x2", r"state\['topology'\]: expected a list"),
    (["pass"], -1, r"state\['pass'\]: -1 is out of range"),
    (["pass"], "0", r"state\['pass'\]: expected an integer"),
    (["version"], 2, r"state\['version'\] is 2"),
    (["dataset"], "0123456789abcdef", r"different dataset"),
    (["sources", "", "records"], 10**6, r"state\['sources'\]: .* does not describe this dataset"),
    (["ranks", 0, "next_worker"], 7, r"state\['ranks'\]\[0\]\['next_worker'\]: 7 is out of range"),
    (["ranks", 0, "next_worker"], True, r"\['next_worker'\]: expected an integer"),
    (["ranks", 0, "workers"], [None], r"state\['ranks'\]\[0\]\['workers'\]: expected 2 entries"),
    (["ranks", 0, "counts", "batches"], None, r"\['counts'\]\['batches'\]: expected an integer"),
    ([*W0, "reader"], [0, 1, 1, 2], r"\['workers'\]\[0\]\['reader'\]: \[0, 1, 1, 2\] is not reader"),
    ([*W0, "position"], None, r"\['workers'\]\[0\]\['position'\]: expected an object"),
    ([*W0, "counts"], {}, r"\['workers'\]\[0\]\['counts'\]\['items'\] is missing"),
    ([*W0, "used", ""], [0], r"\['used'\]\[''\]: expected 2 entries"),
    ([*W0, "used", ""], [0, -4], r"\['used'\]\[''\]\[1\]: expected a non-negative integer"),
    (["progress", "", "done", "0"], [[5, 2]], r"\['progress'\]\[''\]\['done'\]\['0'\]\[0\]\[1\]: 2 is out of range"),
    (["progress", "", "done", "0"], [[0, 10**9]], r"\['done'\]\['0'\]\[0\]\[1\]: 1000000000 is out of range"),
    (["progress", "", "done"], {"x": []}, r"an epoch is a number"),
    (["progress", "nope/"], {"epoch": 0, "done": {}}, r"state\['progress'\]\['nope/'\]: the dataset has no source"),
    (["origin"], [], r"state\['origin'\]: expected an object"),
    (["sources", "", "epochs"], 0, r"state\['sources'\]\[''\]\['epochs'\]: 0 does not fit"),
    (["records_per_batch"], 0, r"state\['records_per_batch'\]: 0 is out of range"),
    (["epoch"], 5, r"state\['epoch'\]: not a key of this part of a state \(its keys: version, dataset"),
    (["ranks", 0, "offset"], 3, r"state\['ranks'\]\[0\]\['offset'\]: not a key"),
    ([*W0, "epoch"], 5, r"\['workers'\]\[0\]\['epoch'\]: not a key .*its keys: dataset, reader, position"),
    ([*W0, "counts", "batches"], 1, r"\['workers'\]\[0\]\['counts'\]\['batches'\]: not a key"),
]


@pytest.mark.parametrize(("path", "value", "message"), HOSTILE, ids=[m for _, _, m in HOSTILE])
def test_a_hostile_loader_state_names_its_key(data: Path, saved: dict, path: list, value: Any, message: str) -> None:
    loader = tidal.DataLoader(dataset(data), num_workers=2)
    with pytest.raises(tidal.StateError, match=message):
        loader.load_state_dict(changed(saved, path, value))
        next(iter(loader))


POSITIONS = [
    ([*W0, "position", "offset"], "x", r"\['workers'\]\[0\]\['position'\]\['offset'\]: expected an integer"),
    ([*W0, "position", "offset"], 10**6, r"\['position'\]\['offset'\]: 1000000 is out of range"),
    ([*W0, "position", "epoch"], 9, r"\['position'\]\['epoch'\]: epoch 9 is past the last epoch"),
    ([*W0, "position", "first_epoch"], None, r"\['position'\]\['first_epoch'\]: expected an integer"),
    ([*W0, "position"], {}, r"\['position'\]\['first_epoch'\] is missing"),
    ([*W0, "within"], 10**6, r"\['workers'\]\[0\]\['within'\]: 1000000 items is past"),
]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize(("path", "value", "message"), POSITIONS, ids=[m for _, _, m in POSITIONS])
def test_a_hostile_position_names_its_key_when_the_state_is_loaded(
    data: Path, path: list, value: Any, message: str, workers: int
) -> None:
    """Each reader is opened where the state puts it by load_state_dict itself (nothing is read):
    a position no reader takes is an error there, not at the first batch inside a worker."""
    loader = tidal.DataLoader(dataset(data), num_workers=workers)
    list(itertools.islice(loader, 5))
    state = changed(json.loads(json.dumps(loader.state_dict())), path, value)
    if workers == 0:
        state = changed(state, ["ranks", 0, "workers", 0, "within"], state["ranks"][0]["workers"][0]["within"])
    resumed = tidal.DataLoader(dataset(data), num_workers=workers)
    with pytest.raises(tidal.StateError, match=message):
        resumed.load_state_dict(state)


def fail_at_40(record: dict) -> dict:
    """Raises a tidal error for the record of id 40 (in whichever worker reads it)."""
    if record["id"] == 40:
        raise tidal.RecordError("a record the test refuses", path="test", row=40)
    return record


def test_the_workers_of_a_loader_that_raised_are_stopped_with_the_error(data: Path) -> None:
    before = set(multiprocessing.active_children())
    loader = tidal.DataLoader(tidal.Dataset(data).map(fail_at_40).batch(6), num_workers=2)
    it = iter(loader)  # its workers were started when it was built (start_early)
    assert set(multiprocessing.active_children()) > before  # its workers run
    with pytest.raises(tidal.RecordError, match="test, row 40: a record the test refuses"):
        list(it)
    assert set(multiprocessing.active_children()) <= before  # not left to a garbage collection


def test_a_hostile_mixture_position_names_the_stream(data: Path) -> None:
    a, b = tidal.Dataset(data).repeat(), tidal.Dataset(data).shuffle(seed=2).repeat()
    ds = tidal.mix({"a": a, "b": b}, seed=0, stop="never").batch(4)
    it = ds.iterator()
    list(itertools.islice(it, 3))
    state = it.state()
    bad = changed(state, ["position", "ended"], ["c"])
    with pytest.raises(tidal.StateError, match=r"state\['position'\]\['ended'\]: no stream named 'c'"):
        ds.iterator(state=bad)
    bad = changed(state, ["position", "streams", "b", "offset"], -1)
    with pytest.raises(
        tidal.StateError, match=r"state\['position'\]\['streams'\]\['b'\]\['offset'\]: -1 is out of range"
    ):
        ds.iterator(state=bad)


@pytest.mark.parametrize("bad", [None, [], "state", {"version": 3}, {"version": 3, "ranks": None}])
def test_state_tools_refuse_what_is_not_a_state(bad: Any) -> None:
    for tool in (tidal.state.show, lambda s: tidal.state.skip(s, 3), lambda s: tidal.state.merge([s])):
        with pytest.raises(tidal.StateError):
            tool(bad)
