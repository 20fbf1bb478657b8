"""tidal state verify: a run's states replayed; a clean run is exactly once, a tampered one is named."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from makers import word_tokenizer, write_records

import tidal
from tidal.cli import main
from tidal.verify import verify


def run_and_save(ds: tidal.Dataset, workers: int, every: int, passes: int = 1) -> list[dict]:
    """States of a real run, saved every ``every`` steps and after each pass."""
    loader = tidal.DataLoader(ds, num_workers=workers)
    states = []
    for _ in range(passes):
        for step, _batch in enumerate(loader, 1):
            if step % every == 0:
                states.append(json.loads(json.dumps(loader.state_dict())))
        states.append(json.loads(json.dumps(loader.state_dict())))
    return states


@pytest.fixture
def ds(tmp_path: Path) -> tidal.Dataset:
    return tidal.Dataset(write_records(tmp_path / "web")).shuffle(seed=4, block_size=32).batch(4)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_clean_run_is_exactly_once(ds: tidal.Dataset, workers: int) -> None:
    states = run_and_save(ds, workers, every=7, passes=2)
    report = verify(ds, states)
    assert report.ok, report.lines()
    assert report.batches == 2 * 30  # two passes of 120 records in batches of 4
    assert report.reads == 2 * 120
    assert report.lines()[-1].startswith("exactly once")


def test_a_loader_that_batched_the_dataset_itself_is_verified_on_it(tmp_path: Path) -> None:
    """States of DataLoader(ds, batch_size=4) verify on ds, as tidal.trace traces them."""
    unbatched = tidal.Dataset(write_records(tmp_path / "web")).shuffle(seed=4, block_size=32)
    loader = tidal.DataLoader(unbatched, batch_size=4, num_workers=2)
    states = []
    for step, _batch in enumerate(loader, 1):
        if step % 7 == 0:
            states.append(json.loads(json.dumps(loader.state_dict())))
    report = verify(unbatched, states)
    assert report.ok and report.reads == 4 * 28, report.lines()
    assert verify(unbatched, states, batch_size=4).ok


def test_a_packed_run_is_exactly_once(tmp_path: Path) -> None:
    ds = (
        tidal.Dataset(write_records(tmp_path / "web"))
        .shuffle(seed=1, block_size=16)
        .tokenize(word_tokenizer(), eos="<eos>")
        .pack(24)
        .batch(3)
    )
    states = run_and_save(ds, 2, every=5)
    report = verify(ds, states)
    assert report.ok, report.lines()
    assert report.reads > 100


def test_an_elastic_restart_between_states_is_replayed_as_it_ran(ds: tidal.Dataset) -> None:
    first = tidal.DataLoader(ds, num_workers=2)
    for _ in zip(range(5), first, strict=False):
        pass
    saved = json.loads(json.dumps(first.state_dict()))
    second = tidal.DataLoader(ds, num_workers=0)  # restarted on another topology
    second.load_state_dict(saved)
    later = []
    for step, _ in enumerate(second, 1):
        if step % 6 == 0:
            later.append(json.loads(json.dumps(second.state_dict())))
    report = verify(ds, [saved, *later])
    assert report.ok, report.lines()


def test_a_state_edited_to_skip_names_the_records_never_read(ds: tidal.Dataset) -> None:
    states = run_and_save(ds, 2, every=5)
    truth = verify(ds, states[:3])
    tampered = copy.deepcopy(states)
    tampered[1]["ranks"][0]["workers"] = copy.deepcopy(states[2]["ranks"][0]["workers"])  # 5 batches ahead
    tampered[1]["ranks"][0]["next_worker"] = states[2]["ranks"][0]["next_worker"]
    report = verify(ds, tampered[:3])
    assert not report.ok
    (gap,) = report.gaps
    assert gap["rank"] == 0 and gap["state"] == 1 and gap["batches"] == 5
    never = {(s["file"], s["row"]) for s in gap["records"]}
    assert len(never) == 20
    # they are the records of the batches between the true states[1] and states[2]
    between = tidal.trace(ds, states[1], steps=5)
    assert never == {(s["file"], s["row"]) for b in between for row in b for s in row}
    assert truth.ok
    assert any(line.startswith("never read: rank 0, 5 batch(es)") for line in report.lines())


def test_a_state_edited_to_repeat_names_the_records_read_twice(ds: tidal.Dataset) -> None:
    states = run_and_save(ds, 2, every=5)
    tampered = copy.deepcopy(states)
    tampered[2]["ranks"][0]["workers"] = copy.deepcopy(states[1]["ranks"][0]["workers"])  # 5 batches back
    tampered[2]["ranks"][0]["next_worker"] = states[1]["ranks"][0]["next_worker"]
    report = verify(ds, tampered[:4])
    assert not report.ok
    twice = {(d["file"], d["row"]) for d in report.duplicates}
    again = tidal.trace(ds, states[1], steps=5)
    assert twice == {(s["file"], s["row"]) for b in again for row in b for s in row}
    assert all(len(d["reads"]) == 2 and d["epoch"] == 0 for d in report.duplicates)
    assert any("states[2] does not follow" in b for b in report.breaks)


def test_batches_skipped_with_tidal_state_skip_are_reported_not_failed(ds: tidal.Dataset) -> None:
    states = run_and_save(ds, 2, every=5)
    skipped = tidal.state.skip(states[1], batches=3)
    loader = tidal.DataLoader(ds, num_workers=2)
    loader.load_state_dict(skipped)
    for _ in zip(range(4), loader, strict=False):
        pass
    after = json.loads(json.dumps(loader.state_dict()))
    report = verify(ds, [states[0], states[1], skipped, after])  # the skipped state at its place
    assert report.ok, report.lines()
    (skip,) = report.skipped
    assert skip["batches"] == 3 and skip["state"] == 2
    jumped = tidal.trace(ds, states[1], steps=3)
    assert skip["records"] == [seg for b in jumped for row in b for seg in row]
    assert report.batches == 5 + 5 + 4  # read: before states[1], before the skip, after it


def test_the_command_exits_non_zero_on_a_tampered_run(
    ds: tidal.Dataset, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "pipeline.json"
    config.write_text(json.dumps(ds.to_config()))
    states = run_and_save(ds, 2, every=5)
    paths = []
    for i, state in enumerate(states):
        path = tmp_path / f"state-{i}.json"
        path.write_text(json.dumps(state))
        paths.append(str(path))
    assert main(["state", "verify", *paths, "--config", str(config)]) == 0
    assert "exactly once" in capsys.readouterr().out
    states[1]["ranks"][0]["workers"] = states[2]["ranks"][0]["workers"]
    states[1]["ranks"][0]["next_worker"] = states[2]["ranks"][0]["next_worker"]
    Path(paths[1]).write_text(json.dumps(states[1]))
    assert main(["state", "verify", *reversed(paths), "--config", str(config)]) == 1  # any order
    out = capsys.readouterr().out
    assert f"never read: rank 0, 5 batch(es) before {paths[1]}" in out and "NOT exactly once" in out
    assert main(["trace", paths[0], "--config", str(config), "--steps", "3", "--skip", "1"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["step"] for line in lines] == [6, 7, 8]
    assert lines == [
        {"step": 5 + 1 + i, "pass": 0, "rank": 0, "worker": w, "rows": rows}
        for i, (w, rows) in enumerate(zip([0, 1, 0], tidal.trace(ds, states[0], steps=3, skip=1), strict=True))
    ]


def test_a_hostile_state_is_a_state_error(ds: tidal.Dataset, tmp_path: Path) -> None:
    states = run_and_save(ds, 0, every=5)
    bad = copy.deepcopy(states[1])
    bad["ranks"][0]["workers"][0]["position"]["epoch"] = "zero"
    with pytest.raises(tidal.StateError):
        verify(ds, [states[0], bad])
    with pytest.raises(tidal.StateError):
        verify(ds, [])
    with pytest.raises(tidal.StateError):
        verify(ds, [{**states[0], "ranks": [None]}])


def mixture(tmp_path: Path, packed: bool) -> tidal.Dataset:
    a = tidal.Dataset(write_records(tmp_path / "a")).shuffle(seed=1, block_size=32).repeat()
    b = tidal.Dataset(write_records(tmp_path / "b", offset=100)).shuffle(seed=2, block_size=32).repeat()
    mixed = tidal.mix({"a": a, "b": b}, weights={"a": 0.8, "b": 0.2}, seed=0, stop="never")
    return mixed.tokenize(word_tokenizer(), eos="<eos>").pack(24).batch(32) if packed else mixed.batch(8)


def run_setting_weights(ds: tidal.Dataset, calls: dict[int, dict], every: int = 10, steps: int = 30) -> list[dict]:
    """States of a run saved every ``every`` steps, that set weights after the steps of ``calls``."""
    loader = tidal.DataLoader(ds, num_workers=2)
    states = []
    for step, _batch in enumerate(loader, 1):
        if step in calls:
            loader.set_weights(calls[step])
        if step % every == 0:
            states.append(json.loads(json.dumps(loader.state_dict())))
        if step == steps:
            return states
    raise AssertionError("the run ended early")


@pytest.mark.parametrize("packed", [False, True], ids=["batched", "packed"])
def test_a_run_that_set_weights_is_replayed_with_them(tmp_path: Path, packed: bool) -> None:
    """Each state holds the set_weights calls since the state before: the replay makes them at their steps."""
    ds = mixture(tmp_path, packed)
    calls = {12: {"a": 0.2, "b": 0.8}, 13: {"a": 0.5, "b": 0.5}, 25: {"a": 0.0, "b": 1.0}}
    states = run_setting_weights(ds, calls)
    assert [s.get("weight_calls") for s in states] == [
        None,
        {"total": 2, "calls": [[0, 12, calls[12]], [0, 13, calls[13]]]},
        {"total": 3, "calls": [[0, 25, calls[25]]]},
    ]
    report = verify(ds, states)
    assert report.ok, report.lines()
    assert report.batches == 30


def test_a_stretch_whose_calls_no_state_holds_is_said_to_be_unverifiable(tmp_path: Path) -> None:
    ds = mixture(tmp_path, packed=False)
    states = run_setting_weights(ds, {12: {"a": 0.2, "b": 0.8}, 25: {"a": 0.0, "b": 1.0}})
    report = verify(ds, [states[0], states[2]])  # the call after step 12 is in states[1] alone
    assert not report.ok
    assert report.breaks == [
        "states[1] cannot be replayed from states[0]: set_weights() was called 2 times between them, and it holds "
        "the last 1 (the calls since the state_dict() before it, at most 256): give every state the run took"
    ]
