"""Reading and editing saved states: tidal state show / skip, in Python and on the command line."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from conftest import make_shards

import tidal
from tidal.state import show, skip


@pytest.fixture
def ds(tmp_path: Path) -> tidal.Dataset:
    return tidal.Dataset(make_shards(tmp_path / "data", [40, 75, 13, 60, 52, 33, 90, 17])).shuffle(seed=3).batch(5)


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tidal.cli", "state", *args], capture_output=True, text=True)


def test_show_names_epoch_position_and_counts(ds: tidal.Dataset, tmp_path: Path) -> None:
    loader = tidal.DataLoader(ds, num_workers=2)
    for _ in itertools.islice(loader, 12):
        pass
    path = tmp_path / "state.json"
    path.write_text(json.dumps(loader.state_dict()))
    text = show(json.loads(path.read_text()))
    assert "1 rank(s) x 2 worker(s)" in text and "12 batches" in text and "in epoch 0" in text
    assert "records used up in epochs in progress: 60" in text
    out = cli("show", str(path))
    assert out.returncode == 0 and out.stdout.strip() == text


def test_skip_continues_later_and_never_yields_the_skipped_batches(ds: tidal.Dataset, tmp_path: Path) -> None:
    full = [b["id"].tolist() for b in tidal.DataLoader(ds, num_workers=2)]
    loader = tidal.DataLoader(ds, num_workers=2)
    head = [b["id"].tolist() for b in itertools.islice(loader, 10)]
    path = tmp_path / "state.json"
    path.write_text(json.dumps(loader.state_dict()))
    out = cli("skip", str(path), "--batches", "8")
    assert out.returncode == 0, out.stderr
    skipped_state = json.loads((tmp_path / "state.skip8.json").read_text())
    assert skipped_state == skip(json.loads(path.read_text()), 8)
    resumed = tidal.DataLoader(ds, num_workers=2)
    resumed.load_state_dict(skipped_state)
    rest = [b["id"].tolist() for b in resumed]
    skipped = {i for b in full[10:18] for i in b}
    seen = Counter(i for b in head + rest for i in b)
    assert max(seen.values()) == 1 and not skipped & set(seen)
    assert len(seen) >= 380 - 40 - 10  # all but the skipped 8 batches and the remainders


@pytest.mark.parametrize(
    ("workers", "cases"),
    [(0, [(0, 3), (11, 40)]), (2, [(1, 7), (11, 1), (10, 75), (-10, 5)]), (3, [(0, 3), (5, 10_000)])],
)
def test_skip_of_plain_batches_continues_at_exactly_the_later_batch(
    tmp_path: Path, workers: int, cases: list[tuple[int, int]]
) -> None:
    data = make_shards(tmp_path / "data", [40, 75, 13, 60, 52, 33, 90, 17])
    ds = tidal.Dataset(data).shuffle(seed=3, block_size=32).repeat(3).batch(5)
    full = [b["id"].tolist() for b in tidal.DataLoader(ds, num_workers=workers)]
    for done, skipped in [(d % len(full), s) for d, s in cases]:
        loader = tidal.DataLoader(ds, num_workers=workers)
        list(itertools.islice(loader, done))
        state = skip(json.loads(json.dumps(loader.state_dict())), skipped)
        resumed = tidal.DataLoader(ds, num_workers=workers)
        resumed.load_state_dict(json.loads(json.dumps(state)))
        rest = [b["id"].tolist() for b in resumed]
        assert rest == full[done + skipped :], f"after {done} batches, skipping {skipped}"


def test_cli_errors_are_one_clear_line(tmp_path: Path) -> None:
    (tmp_path / "x.json").write_text('{"not": "a state"}')
    out = cli("show", str(tmp_path / "x.json"))
    assert out.returncode == 2 and "not a tidal loader state" in out.stderr and "Traceback" not in out.stderr
    out = cli("show", str(tmp_path / "missing.json"))
    assert out.returncode == 2 and "missing.json" in out.stderr


def keep_even(rec: dict) -> bool:
    return rec["id"] % 2 == 0


def test_a_skip_it_cannot_make_exactly_is_refused_unless_approximate(tmp_path: Path) -> None:
    data = make_shards(tmp_path / "data", [40, 75, 13, 60])
    for ds in (
        tidal.Dataset(data).shuffle(seed=3).filter(keep_even).batch(4),
        tidal.Dataset(data, errors="skip").shuffle(seed=3).batch(4),
        tidal.mix([tidal.Dataset(data), tidal.Dataset(data)], weights=[1, 1], seed=0).batch(4),
    ):
        loader = tidal.DataLoader(ds, num_workers=2)
        list(itertools.islice(loader, 3))
        state = json.loads(json.dumps(loader.state_dict()))
        with pytest.raises(tidal.StateError, match=r"varying number of source records.*run the loader on"):
            skip(state, 5)
        moved = skip(state, 5, approximate=True)
        assert "skipped by `tidal state skip`: 5 batches" in show(moved)
        tidal.DataLoader(ds, num_workers=2).load_state_dict(moved)
    path = tmp_path / "s.json"
    path.write_text(json.dumps(state))
    out = cli("skip", str(path), "--batches", "5")
    assert out.returncode == 2 and "--approximate" in out.stderr
    out = cli("skip", str(path), "--batches", "5", "--approximate")
    assert out.returncode == 0, out.stderr


def test_a_skip_of_tokenized_batches_is_exact(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"record": 0, "<eos>": 1}, unk_token="<eos>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    ds = tidal.Dataset(make_shards(tmp_path / "data", [40, 75, 13])).shuffle(seed=1).tokenize(tok, eos="<eos>").batch(3)
    full = [b["id"] for b in tidal.DataLoader(ds, num_workers=2)]
    loader = tidal.DataLoader(ds, num_workers=2)
    list(itertools.islice(loader, 4))
    resumed = tidal.DataLoader(ds, num_workers=2)
    resumed.load_state_dict(skip(json.loads(json.dumps(loader.state_dict())), 6))
    assert [b["id"].tolist() for b in resumed] == [b.tolist() for b in full[10:]]


# -- merge: the states ranks saved each for itself ---------------------------------------------------


def per_rank_states(ds: tidal.Dataset, monkeypatch: pytest.MonkeyPatch, steps: tuple[int, int]) -> list[dict]:
    """What two ranks without torch.distributed (RANK/WORLD_SIZE only) save, each after its own steps."""
    states = []
    for rank, n in enumerate(steps):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        loader = tidal.DataLoader(ds, num_workers=1)
        for _ in itertools.islice(loader, n):
            pass
        states.append(json.loads(json.dumps(loader.state_dict())))
    return states


def test_merge_on_the_command_line_makes_one_state_that_restores(
    ds: tidal.Dataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    states = per_rank_states(ds, monkeypatch, (4, 4))
    paths = []
    for rank, state in enumerate(states):
        assert state["progress"] is None and state["ranks"][1 - rank] is None  # each covers itself
        paths.append(tmp_path / f"state-rank{rank}.json")
        paths[-1].write_text(json.dumps(state))
    out = cli("merge", str(paths[1]), str(paths[0]), "-o", str(tmp_path / "merged.json"))
    assert out.returncode == 0, out.stderr
    assert (
        out.stdout.strip() == f"wrote {tmp_path / 'merged.json'}: the state of 2 rank(s) x 1 worker(s) from 2 file(s)"
    )
    merged = json.loads((tmp_path / "merged.json").read_text())
    assert merged == tidal.state.merge(states)
    assert merged["ranks"] == [states[0]["ranks"][0], states[1]["ranks"][1]] and merged["progress"] is not None
    assert "records used up in epochs in progress: 40" in cli("show", str(tmp_path / "merged.json")).stdout
    assert tidal.state.merge([merged, merged]) == merged  # whole states (torch.distributed's): they agree


def test_merge_names_the_files_that_do_not_fit(
    ds: tidal.Dataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    early, late = per_rank_states(ds, monkeypatch, (2, 2)), per_rank_states(ds, monkeypatch, (5, 5))
    names = ["a.json", "b.json"]
    with pytest.raises(tidal.StateError, match=r"^a\.json and b\.json both hold rank 0, at other positions"):
        tidal.state.merge([early[0], late[0]], names=names)
    with pytest.raises(tidal.StateError, match=r"^no state holds rank 1 of the 2 it was saved on"):
        tidal.state.merge([early[0]])
    other = tidal.Dataset(ds.sources()[""].shards.paths[:3]).batch(5)
    foreign = per_rank_states(other, monkeypatch, (1, 1))[1]
    with pytest.raises(tidal.StateError, match=r"^b\.json: its 'dataset' differs from a\.json's"):
        tidal.state.merge([early[0], foreign], names=names)
    (tmp_path / "a.json").write_text(json.dumps(early[0]))
    out = cli("merge", str(tmp_path / "a.json"), str(tmp_path / "gone.json"), "-o", str(tmp_path / "m.json"))
    assert out.returncode == 2 and out.stderr == f"tidal state: {tmp_path / 'gone.json'}: no such state file\n"
    assert not (tmp_path / "m.json").exists()


def test_merge_refuses_ranks_that_set_weights_at_other_steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a process group no collective can compare the ranks' set_weights() calls: merging
    their states is where a disagreement shows."""
    web = tidal.Dataset(make_shards(tmp_path / "web", [40, 75])).repeat()
    code = tidal.Dataset(make_shards(tmp_path / "code", [13, 60])).repeat()
    mixed = tidal.mix({"web": web, "code": code}, weights={"web": 0.7, "code": 0.3}, seed=0).batch(4)
    states = []
    for rank, change_at in enumerate((2, 3)):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        loader = tidal.DataLoader(mixed, num_workers=0)
        for step, _ in enumerate(itertools.islice(loader, 5)):
            if step == change_at:
                loader.set_weights({"web": 0.5, "code": 0.5})
        states.append(json.loads(json.dumps(loader.state_dict())))
    assert states[0]["weights"] == states[1]["weights"]  # the same weights in force, set at other steps
    with pytest.raises(tidal.StateError, match=r"^b\.json: its 'weight_calls' differ from a\.json's"):
        tidal.state.merge(states, names=["a.json", "b.json"])


def test_every_command_that_takes_a_state_or_config_names_a_missing_one(ds: tidal.Dataset, tmp_path: Path) -> None:
    gone, config = tmp_path / "gone.json", tmp_path / "pipeline.json"
    config.write_text(json.dumps(ds.to_config()))
    for args in (
        ["show", str(gone)],
        ["skip", str(gone), "--batches", "1"],
        ["verify", str(gone), "--config", str(config)],
    ):
        out = cli(*args)
        assert out.returncode == 2 and out.stderr == f"tidal state: {gone}: no such state file\n", args
    state = tmp_path / "state.json"
    loader = tidal.DataLoader(ds, num_workers=0)
    for _ in itertools.islice(loader, 2):
        pass
    state.write_text(json.dumps(loader.state_dict()))
    missing = tmp_path / "missing.yaml"
    out = cli("verify", str(state), "--config", str(missing))
    assert out.returncode == 2 and out.stderr == f"tidal state: {missing}: no such config file\n"
    for argv in (["trace", str(gone), "--config", str(config), "--steps", "1"],
                 ["trace", str(state), "--config", str(missing), "--steps", "1"]):  # fmt: skip
        out = subprocess.run([sys.executable, "-m", "tidal.cli", *argv], capture_output=True, text=True)
        assert out.returncode == 2 and out.stderr.startswith("tidal trace: ") and "no such" in out.stderr, out
        assert str(gone if "gone" in argv[1] else missing) in out.stderr


def test_verify_counts_what_drop_last_left_out_apart_from_never_read(tmp_path: Path) -> None:
    """380 records over 2 workers in batches of 7: each worker's share of 190 ends in a partial
    batch of 1 that drop_last drops. Not an error, and not "never read": said as such."""
    ds = tidal.Dataset(make_shards(tmp_path / "data", [40, 75, 13, 60, 52, 33, 90, 17])).shuffle(seed=3).batch(7)
    loader = tidal.DataLoader(ds, num_workers=2)
    paths = []
    for step, _ in enumerate(loader, 1):
        if step % 20 == 0:
            paths.append(tmp_path / f"state-{step}.json")
            paths[-1].write_text(json.dumps(loader.state_dict()))
    paths.append(tmp_path / "state-end.json")
    paths[-1].write_text(json.dumps(loader.state_dict()))  # after the pass: epoch 0 finished
    config = tmp_path / "pipeline.json"
    config.write_text(json.dumps(ds.to_config()))
    out = cli("verify", *map(str, paths), "--config", str(config))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[-2].startswith("in no batch (epoch 0, finished): 2 of its 380 records (drop_last's partial last")
    assert lines[-1].startswith("exactly once: 54 batches replayed, 378 records or document pieces read")
    assert "0 never read, 0 break(s); 2 in no batch of a finished epoch, by design" in lines[-1]
    report = json.loads(cli("verify", *map(str, paths), "--config", str(config), "--json").stdout)
    assert report["left_out"] == [{"source": "", "epoch": 0, "records": 2, "of": 380}]
    before_end = cli("verify", *map(str, paths[:-1]), "--config", str(config))  # epoch 0 not finished
    assert before_end.returncode == 0 and "in no batch" not in before_end.stdout
    from_state = cli("verify", *map(str, paths[1:]), "--config", str(config), "--from-state", "--json")
    assert json.loads(from_state.stdout)["left_out"] == []  # epoch 0 was under way at the first state
