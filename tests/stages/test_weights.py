"""Live mixture weights: ``loader.set_weights`` from the next batch, kept in the state, replayed exactly."""

from __future__ import annotations

import copy
import functools
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import write_jsonl

import tidal
from tidal.world import World

pytest.importorskip("torch")

WEB_ONLY = {"web": 1.0, "code": 0.0}
CODE_ONLY = {"web": 0.0, "code": 1.0}
CHANGES = {4: {"web": 0.1, "code": 0.9}, 9: {"web": 0.5, "code": 0.5}, 10: {"web": 0.3, "code": 0.7}}


def stream(root: Path, name: str, n: int, shards: int = 3) -> tidal.Dataset:
    root.mkdir(parents=True, exist_ok=True)
    for s in range(shards):
        recs = [
            {"src": name, "id": i, "text": " ".join(str((i * 7 + j) % 1000) for j in range(3 + i % 11))}
            for i in range(s, n, shards)
        ]
        write_jsonl(root / f"{name}-{s}.jsonl", recs)
    return tidal.Dataset(str(root / f"{name}-*.jsonl"))


@pytest.fixture
def streams(tmp_path: Path) -> dict[str, tidal.Dataset]:
    return {
        "web": stream(tmp_path, "web", 3000).shuffle(seed=1).repeat(),
        "code": stream(tmp_path, "code", 500).shuffle(seed=2).repeat(),
    }


def mixed(streams: dict[str, tidal.Dataset], batch: int = 8) -> tidal.Dataset:
    return tidal.mix(streams, weights={"web": 0.9, "code": 0.1}, seed=0).batch(batch)


def rows(batch: dict) -> list[str]:
    """A batch as the records it holds (``web17``), or as its token ids for packed rows."""
    if "src" in batch:
        return [f"{s}{int(i)}" for s, i in zip(batch["src"], batch["id"], strict=True)]
    return [str(r) for r in batch["input_ids"].tolist()]


def run(loader: Any, steps: int, changes: dict[int, dict], first: int = 0) -> list[list[str]]:
    """``steps`` batches; after the batch of step ``s`` (counted from ``first``), ``set_weights(changes[s])``."""
    out: list[list[str]] = []
    it: Iterator[dict] = iter(loader)
    while len(out) < steps:
        out.append(rows(next(it)))
        step = first + len(out)
        if step in changes:
            loader.set_weights(changes[step])
    return out


def resumed(make: Any, cut: int, steps: int, changes: dict[int, dict]) -> list[list[str]]:
    """The batches of a run stopped after ``cut`` batches, its state saved as JSON, and resumed by a new loader."""
    first = make()
    before = run(first, cut, changes)
    state = json.loads(json.dumps(first.state_dict()))
    again = make()
    again.load_state_dict(state)
    return before + run(again, steps - cut, changes, first=cut)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resumed_run_gives_the_batches_of_an_uninterrupted_one(streams, workers) -> None:
    ds = mixed(streams)

    def make() -> tidal.DataLoader:
        return tidal.DataLoader(ds, num_workers=workers)

    steps = 16
    full = run(make(), steps, CHANGES)
    for cut in (2, 4, 7, 10, 11):
        assert resumed(make, cut, steps, CHANGES) == full, f"resumed after {cut} batches"
    assert full != run(make(), steps, {}), "the weights changed nothing"


def test_spawned_workers_resume_and_restart_under_new_weights(streams) -> None:
    """The order does not depend on how workers start: a run forked up to a change, resumed in
    spawned workers that restart at the next change, gives the batches of one forked run."""
    ds = mixed(streams)
    changes = {3: CHANGES[4], 7: CHANGES[9]}
    full = run(tidal.DataLoader(ds, num_workers=2, multiprocessing_context="fork"), 10, changes)
    first = tidal.DataLoader(ds, num_workers=2, multiprocessing_context="fork")
    before = run(first, 5, changes)
    spawned = tidal.DataLoader(ds, num_workers=2, multiprocessing_context="spawn")
    spawned.load_state_dict(json.loads(json.dumps(first.state_dict())))
    assert before + run(spawned, 5, changes, first=5) == full


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_read_ahead_under_the_old_weights_are_not_served(streams, workers) -> None:
    loader = tidal.DataLoader(mixed(streams), num_workers=workers, prefetch_factor=4 if workers else None)
    run(loader, 3, {})
    loader.set_weights(CODE_ONLY)
    assert all(r.startswith("code") for b in run(loader, 3, {}) for r in b)
    loader.set_weights(WEB_ONLY)
    assert all(r.startswith("web") for b in run(loader, 10, {}) for r in b)


def test_prefetch_to_device_is_restarted_too(streams) -> None:
    loader = tidal.DataLoader(mixed(streams), num_workers=2, device="cpu", prefetch_to_device=3)
    run(loader, 5, {5: CODE_ONLY})
    assert all(r.startswith("code") for b in run(loader, 8, {}) for r in b)


def test_the_achieved_mixture_converges_to_the_new_weights(streams) -> None:
    """Tolerance: 4 standard deviations of a binomial over 4,800 draws (~0.023 at p=0.2)."""
    loader = tidal.DataLoader(mixed(streams, batch=16), num_workers=2)
    run(loader, 10, {10: {"web": 0.2, "code": 0.8}})
    drawn = [r for b in run(loader, 300, {}) for r in b]
    share = sum(r.startswith("code") for r in drawn) / len(drawn)
    assert abs(share - 0.8) < 4 * (0.2 * 0.8 / len(drawn)) ** 0.5
    assert loader.state_dict()["weights"] == {"web": 0.2, "code": 0.8}


@pytest.mark.parametrize("strategy", ["concat", "best_fit"])
@pytest.mark.parametrize("workers", [0, 2])
def test_packed_rows_resume_exactly_across_changes(streams, strategy, workers) -> None:
    """Packing buffers documents drawn before the change: they are drawn again the same, the rest anew."""
    from makers import word_tokenizer

    mix = tidal.mix(streams, weights={"web": 0.9, "code": 0.1}, seed=0)
    ds = mix.tokenize(word_tokenizer(), eos="<eos>").pack(24, strategy, buffer_size=4).batch(4)

    def make() -> tidal.DataLoader:
        return tidal.DataLoader(ds, num_workers=workers)

    steps = 14
    full = run(make(), steps, CHANGES)
    for cut in (3, 4, 5, 9, 10, 12):
        assert resumed(make, cut, steps, CHANGES) == full, f"resumed after {cut} batches"


def tokenized(tmp_path: Path) -> dict[str, tidal.Dataset]:
    """Two streams whose tokens tell them apart: web's below 500, code's from 600."""
    from makers import write_docs

    rng = np.random.default_rng(0)
    web = write_docs(tmp_path / "web", [rng.integers(0, 500, rng.integers(2, 30)).tolist() for _ in range(400)])
    code = write_docs(tmp_path / "code", [rng.integers(600, 700, rng.integers(2, 30)).tolist() for _ in range(400)])
    return {"web": tidal.Dataset(web).shuffle(seed=1).repeat(), "code": tidal.Dataset(code).shuffle(seed=2).repeat()}


def test_packed_rows_draw_anew_from_the_next_document(tmp_path: Path) -> None:
    """concat packing: the document in progress goes on, every later one is drawn under the new
    weights, though the packer had read 256 documents ahead under the old ones."""
    from makers import EOS, word_tokenizer

    mix = tidal.mix(tokenized(tmp_path), weights={"web": 0.9, "code": 0.1}, seed=0)
    loader = tidal.DataLoader(mix.tokenize(word_tokenizer(), eos="<eos>").pack(24).batch(4))
    it = iter(loader)
    for _ in range(5):
        next(it)
    loader.set_weights(CODE_ONLY)
    after = [t for _ in range(10) for row in next(it)["input_ids"].tolist() for t in row]
    first = after.index(EOS)  # the end of the document in progress
    assert all(t < 500 for t in after[:first]) and all(t >= 600 for t in after[first + 1 :] if t != EOS)
    m = loader.metrics()
    assert m["weight/code"] == 1.0 and m["records/code"] + m["records/web"] >= 5 * 4


def test_best_fit_rows_come_from_its_buffer_until_used_up_and_metrics_say_so(tmp_path: Path) -> None:
    """best_fit plans its rows over its whole buffer: the rows cut from it keep the old weights, and
    weight/<stream> says so until the rows of the next buffer come."""
    from makers import EOS, word_tokenizer

    mix = tidal.mix(tokenized(tmp_path), weights={"web": 0.9, "code": 0.1}, seed=0)
    loader = tidal.DataLoader(mix.tokenize(word_tokenizer(), eos="<eos>").pack(24, "best_fit", buffer_size=8).batch(2))
    it = iter(loader)
    for _ in range(3):
        next(it)
    loader.set_weights(CODE_ONLY)
    webs = []
    while loader.metrics()["weight/code"] != 1.0:  # the buffer began before the call: a few hundred documents
        assert loader.metrics()["weight/code"] == pytest.approx(0.1)
        webs.append(any(t < 500 for row in next(it)["input_ids"].tolist() for t in row))
    assert len(webs) > 1 and all(webs[:-1])  # drawn with 0.9 / 0.1, as metrics() said
    assert all(t >= 600 for _ in range(5) for row in next(it)["input_ids"].tolist() for t in row if t != EOS)


def test_continuous_rows_resume_exactly_across_changes(streams) -> None:
    ds = tidal.mix(streams, weights={"web": 0.9, "code": 0.1}, seed=0).batch(4, continuous=True)

    def make() -> tidal.DataLoader:
        return tidal.DataLoader(ds, num_workers=2)

    full = run(make(), 14, CHANGES)
    for cut in (4, 6, 10):
        assert resumed(make, cut, 14, CHANGES) == full


def test_an_elastic_restore_goes_on_with_the_weights_in_force(streams) -> None:
    ds = mixed(streams)
    loader = tidal.DataLoader(ds, num_workers=2)
    seen = run(loader, 7, {5: CODE_ONLY})
    state = json.loads(json.dumps(loader.state_dict()))
    for workers in (0, 3):
        other = tidal.DataLoader(ds, num_workers=workers)
        other.load_state_dict(state)
        after = run(other, 12, {})
        assert all(r.startswith("code") for b in after for r in b)
        assert other.state_dict()["weights"] == CODE_ONLY
        assert not {r for b in seen for r in b} & {r for b in after for r in b}  # code has 500 records


def test_set_weights_before_iterating_and_over_a_loaded_state(streams) -> None:
    ds = mixed(streams)
    loader = tidal.DataLoader(ds, num_workers=2)
    loader.set_weights(CODE_ONLY)
    assert all(r.startswith("code") for b in run(loader, 4, {}) for r in b)
    state = loader.state_dict()
    other = tidal.DataLoader(ds)
    other.load_state_dict(state)
    other.set_weights(WEB_ONLY)  # applies over the loaded state, from its next batch
    assert other.state_dict()["weights"] == WEB_ONLY and state["weights"] == CODE_ONLY
    assert all(r.startswith("web") for b in run(other, 4, {}) for r in b)


def test_a_reader_replays_its_batches_from_a_state_alone(streams) -> None:
    """What ``tidal.trace`` relies on: a reader state (with the changes it carries) and the
    weights in force replay the batches the loader gives next, without the loader."""
    ds = mixed(streams)
    loader = tidal.DataLoader(ds, num_workers=2)
    run(loader, 9, CHANGES)
    state = loader.state_dict()
    coming = run(loader, 6, {})
    for w in (0, 1):
        reader = state["ranks"][0]["workers"][w]
        it = ds.iterator(World(0, 1, w, 2), reader, weights=state.get("weights"))
        mine = [rows(next(it)) for _ in range(3)]
        first = (w - state["ranks"][0]["next_worker"]) % 2  # batches go round robin from the next worker
        assert mine == coming[first::2]


def test_the_state_stays_small_however_often_weights_change(streams, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader keeps the changes its position needs; the state, the calls since the state before
    (for tidal state verify), at most calls.KEPT of them (here 10)."""
    from makers import word_tokenizer

    from tidal.state import calls

    monkeypatch.setattr(calls, "KEPT", 10)
    mix = tidal.mix(streams, weights={"web": 0.9, "code": 0.1}, seed=0)
    loader = tidal.DataLoader(mix.tokenize(word_tokenizer(), eos="<eos>").pack(24, "best_fit", buffer_size=4).batch(2))
    every_step = {s: {"web": 1 + s % 3, "code": 1 + s % 5} for s in range(1, 100)}
    run(loader, 30, every_step)
    loader.state_dict()
    run(loader, 6, every_step, first=30)
    state = loader.state_dict()
    (reader,) = state["ranks"][0]["workers"]
    assert 1 <= len(reader["weights"][0]) <= 3  # the changes since its packing buffer began
    made = state["weight_calls"]
    assert made["total"] == 36 and [c[1] for c in made["calls"]] == list(range(31, 37))
    assert len(json.dumps(state)) < 1_500
    run(loader, 24, every_step, first=36)  # 24 calls since the last state: the last 10 are kept
    state = loader.state_dict()
    made = state["weight_calls"]
    assert made["total"] == 60 and [c[1] for c in made["calls"]] == list(range(51, 61))


def test_a_chain_with_a_mixture_inside_a_stream_of_another(streams) -> None:
    inner = tidal.mix(streams, weights={"web": 0.5, "code": 0.5}, seed=4)
    outer = tidal.mix({"both": inner, "web2": streams["web"]}, weights={"both": 0.5, "web2": 0.5}, seed=5).batch(8)
    loader = tidal.DataLoader(outer, num_workers=0)
    with pytest.raises(tidal.ArgumentError, match="no stream named 'web'"):
        loader.set_weights({"web": 1.0})  # the top mixture's streams
    loader.set_weights({"both": 1.0})
    assert run(loader, 2, {})


def test_bad_weights_are_argument_errors(streams, tmp_path: Path) -> None:
    loader = tidal.DataLoader(mixed(streams))
    cases = [
        ({"web": 1, "news": 1}, "no stream named 'news'"),
        ({"web": -0.5, "code": 1}, "weight of 'web' must be a finite, non-negative number"),
        ({"web": float("nan")}, "finite, non-negative"),
        ({"web": True}, "finite, non-negative"),
        ({"web": 0, "code": 0}, "all zero"),
        ({}, "all zero"),
        ([0.5, 0.5], "dict of stream name to weight"),
    ]
    for weights, message in cases:
        with pytest.raises(tidal.ArgumentError, match=message):
            loader.set_weights(weights)
    plain = tidal.DataLoader(stream(tmp_path / "plain", "web", 30).batch(4))
    with pytest.raises(tidal.ArgumentError, match="no mixture"):
        plain.set_weights({"web": 1})
    counted = tidal.mix(streams, choose={"web": 10, "code": 5}, seed=0, stop="never").batch(4)
    with pytest.raises(tidal.ArgumentError, match="exact counts"):
        tidal.DataLoader(counted).set_weights({"web": 1})
    assert "weights" not in loader.state_dict()  # nothing was set


def test_ranks_that_disagree_are_told_at_the_next_state_dict(streams) -> None:
    """set_weights is no collective: each rank records its calls, and the state_dict() every rank
    calls at the same step gathers and compares them (here two ledgers and a gather of both)."""
    from tidal.state.ledger import Ledger

    ds = mixed(streams)
    ledgers = [Ledger(ds, 1, ranks=lambda r=r: World(r, 2)) for r in range(2)]

    def snapshot() -> list[Any]:
        """Each rank's state_dict(): a state, or the error it raised."""
        mine = [[ledger.local, ledger.calls.mine(ledger.weights)] for ledger in ledgers]
        out: list[Any] = []
        for ledger in ledgers:
            try:
                out.append(ledger.snapshot(lambda _: mine))
            except tidal.ArgumentError as exc:
                out.append(exc)
        return out

    def call(rank: int, batches: int, weights: dict) -> None:
        ledgers[rank].local["counts"]["batches"] = batches
        ledgers[rank].set_weights(weights)

    call(0, 3, CODE_ONLY), call(1, 3, CODE_ONLY)
    for ledger in ledgers:
        ledger.local["counts"]["batches"] = 5
    agreed = snapshot()
    assert agreed[0] == agreed[1] and agreed[0]["weight_calls"] == {"total": 1, "calls": [[0, 3, CODE_ONLY]]}
    call(0, 6, WEB_ONLY), call(1, 7, WEB_ONLY)  # rank 1 a batch later
    for ledger in ledgers:
        ledger.local["counts"]["batches"] = 9
    told = snapshot()
    assert all(isinstance(e, tidal.ArgumentError) for e in told) and str(told[0]) == str(told[1])
    assert "rank 0: {web: 1, code: 0} after batch 6" in str(told[0])
    assert "rank 1: {web: 1, code: 0} after batch 7" in str(told[0])
    assert snapshot()[0]["weight_calls"] == {"total": 2, "calls": []}  # told once: the weights in force agree
    call(0, 9, {"web": 1.0, "code": 1.0}), call(1, 9, {"web": 1.0, "code": 2.0})
    told = snapshot()
    assert "rank 0: {web: 1, code: 1} after batch 9 (in force: {web: 1, code: 1})" in str(told[0])
    assert "rank 1: {web: 1, code: 2} after batch 9 (in force: {web: 1, code: 2})" in str(told[1])
    told = snapshot()  # said again while the weights in force differ
    said = "rank 0: no call (in force: {web: 1, code: 1}) | rank 1: no call (in force: {web: 1, code: 2})"
    assert said in str(told[0])
    call(0, 9, {"web": 1.0, "code": 1.0}), call(1, 9, {"web": 1.0, "code": 1.0})
    assert isinstance(snapshot()[0], dict)


def test_hostile_weights_in_a_state_name_their_key(streams, tmp_path: Path) -> None:
    ds = mixed(streams)
    loader = tidal.DataLoader(ds, num_workers=2)
    run(loader, 6, {3: CODE_ONLY})
    good = json.loads(json.dumps(loader.state_dict()))
    reader = "state['ranks'][0]['workers'][0]['weights']"

    def bad(change: Any, message: str) -> None:
        state = copy.deepcopy(good)
        change(state)
        with pytest.raises(tidal.StateError, match=message):
            tidal.DataLoader(ds, num_workers=2).load_state_dict(state)

    bad(lambda s: s.update(weights={"news": 1.0}), r"state\['weights'\]\['news'\]: no stream")
    bad(lambda s: s.update(weights={"web": -1.0}), r"state\['weights'\]\['web'\]: expected a finite")
    bad(lambda s: s.update(weights={"web": 0}), r"state\['weights'\]: the weights are all zero")
    bad(lambda s: s.update(weights=[1, 2]), r"state\['weights'\]: expected an object")
    w0 = good["ranks"][0]["workers"][0]
    assert w0["weights"] == [[[w0["weights"][0][0][0], CODE_ONLY]]]
    bad(lambda s: s["ranks"][0]["workers"][0].update(weights="x"), re.escape(reader) + ": expected a list")
    bad(lambda s: s["ranks"][0]["workers"][0].update(weights=[[[1, {"news": 1}]]]), "no stream named 'news'")
    bad(lambda s: s["ranks"][0]["workers"][0].update(weights=[[[-1, CODE_ONLY]]]), re.escape(reader + "[0][0][0]"))
    bad(lambda s: s["ranks"][0]["workers"][0].update(weights=[[[5, CODE_ONLY], [5, WEB_ONLY]]]), "not a draw after")
    bad(lambda s: s["ranks"][0]["workers"][0].update(weights=[[], []]), "2 rows of changes")
    assert good["weight_calls"] == {"total": 1, "calls": [[0, 3, CODE_ONLY]]}
    calls = "state['weight_calls']"
    bad(lambda s: s.update(weight_calls={"total": 0, "calls": [[0, 3, CODE_ONLY]]}), re.escape(calls) + ".* more than")
    bad(lambda s: s["weight_calls"]["calls"][0].__setitem__(1, -3), re.escape(calls + "['calls'][0][1]"))
    bad(lambda s: s["weight_calls"]["calls"][0].__setitem__(2, {"web": -1}), re.escape(calls + "['calls'][0][2]"))
    bad(lambda s: s["weight_calls"].update(when=1), re.escape(calls + "['when']") + ": not a key")
    plain = tidal.DataLoader(stream(tmp_path / "plain", "web", 300).batch(4), num_workers=2)
    run(plain, 3, {})
    state = plain.state_dict()
    state["ranks"][0]["workers"][0]["weights"] = [[[0, {"web": 1.0}]]]
    with pytest.raises(tidal.StateError, match=r"without tidal\.mix"):
        tidal.DataLoader(stream(tmp_path / "plain", "web", 300).batch(4), num_workers=2).load_state_dict(state)
    state = plain.state_dict()
    state["weights"] = {"web": 1.0}
    with pytest.raises(tidal.StateError, match="no mixture"):
        tidal.DataLoader(stream(tmp_path / "plain", "web", 300).batch(4), num_workers=2).load_state_dict(state)


def test_state_show_names_the_weights_in_force(streams, tmp_path: Path, capsys) -> None:
    from tidal.cli import main

    loader = tidal.DataLoader(mixed(streams), num_workers=2)
    run(loader, 4, {2: {"web": 0.25, "code": 0.75}})
    assert "weights (set_weights): web 0.25, code 0.75, from the next batch" in tidal.state.show(loader.state_dict())
    fresh = tidal.DataLoader(mixed(streams))
    run(fresh, 2, {})
    assert "weights: the mixture's own" in tidal.state.show(fresh.state_dict())
    path = tmp_path / "state.json"
    path.write_text(json.dumps(loader.state_dict()))
    assert main(["state", "show", str(path)]) == 0
    assert "web 0.25, code 0.75" in capsys.readouterr().out


def test_state_show_of_a_packed_mixture_says_where_its_draws_are_counted(streams) -> None:
    """A packing stage's position holds the mixture's draws where its buffer began: 0 for a while."""
    from makers import word_tokenizer

    mix = tidal.mix(streams, weights={"web": 0.9, "code": 0.1}, seed=0)
    loader = tidal.DataLoader(mix.tokenize(word_tokenizer(), eos="<eos>").pack(24).batch(4), num_workers=2)
    run(loader, 3, {})
    shown = tidal.state.show(loader.state_dict())
    read = re.search(r"mixture: 0 records drawn over all readers before the documents in their packing buffers, "
                     r"which a restore draws again \((\d+) records read from the streams in all\)", shown)  # fmt: skip
    assert read and int(read.group(1)) >= 2 * 256, shown
    assert "mixture: 12 records drawn over all readers\n" in tidal.state.show(run_state(mixed(streams, 4), 3))


def run_state(ds: tidal.Dataset, steps: int) -> dict:
    loader = tidal.DataLoader(ds, num_workers=2)
    run(loader, steps, {})
    return loader.state_dict()


@pytest.mark.parametrize(("workers", "prefetch"), [(0, 0), (2, 3)])
def test_the_jax_loader_sets_weights_and_resumes_exactly(streams, workers, prefetch) -> None:
    pytest.importorskip("jax")
    import tidal.jax

    ds = mixed(streams)

    def make() -> tidal.jax.Loader:
        return tidal.jax.Loader(ds, num_workers=workers, prefetch=prefetch)

    full = run(make(), 14, CHANGES)
    assert full == run(tidal.DataLoader(ds, num_workers=workers or 1), 14, CHANGES)  # the torch loader's batches
    for cut in (4, 7, 10):
        assert resumed(make, cut, 14, CHANGES) == full, f"resumed after {cut} batches"
    loader = make()
    run(loader, 3, {3: CODE_ONLY})
    assert all(r.startswith("code") for b in run(loader, 6, {}) for r in b)  # nothing read ahead is served
    with pytest.raises(tidal.ArgumentError, match="no stream named 'news'"):
        loader.set_weights({"news": 1.0})


@pytest.mark.slow
def test_ranks_that_set_weights_at_other_steps_are_told_not_hung(tmp_path: Path) -> None:
    """Under torchrun, each step an all_reduce: rank 1 setting weights a step after rank 0 (or other
    weights) hangs no rank; the next state_dict() raises on both, naming the ranks and their calls."""
    import procs

    stream(tmp_path / "web", "web", 600), stream(tmp_path / "code", "code", 300)
    out = tmp_path / "out"
    out.mkdir()
    script = Path(__file__).parents[1] / "distributed" / "run_weights.py"
    args = [str(tmp_path / "web" / "web-*.jsonl"), str(tmp_path / "code" / "code-*.jsonl"), str(out), "0"]
    procs.torchrun(script, *args, nproc=2, env=procs.child_env(tmp_path / "cache"), timeout=150)  # killed, not hung
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    for r in ranks:
        assert all(src == "code" for b in r["after"] for src in b)  # from the next batch, on every rank
        assert r["agreed"]["weights"] == CODE_ONLY and all(r["agreed"]["ranks"])
        steps, weights, again = r["errors"]
        assert "rank 0: {web: 1, code: 1} after batch 6" in steps and "rank 1: {web: 1, code: 1} after batch 7" in steps
        assert "rank 0: {web: 1, code: 1} after batch 9" in weights
        assert "rank 1: {web: 1, code: 2} after batch 9" in weights
        assert "rank 0: no call (in force: {web: 1, code: 1})" in again and "(in force: {web: 1, code: 2})" in again
        assert r["last"]["weights"] == {"web": 1.0, "code": 1.0}
    assert ranks[0]["agreed"] == ranks[1]["agreed"] and ranks[0]["last"] == ranks[1]["last"]
    assert ranks[0]["errors"] == ranks[1]["errors"]


@pytest.mark.parametrize("workers", [0, 2])
def test_metrics_report_the_weights_set_on_the_loader(streams: dict[str, tidal.Dataset], workers: int) -> None:
    loader = tidal.DataLoader(mixed(streams), num_workers=workers)
    it = iter(loader)
    next(it)
    assert loader.metrics()["weight/web"] == pytest.approx(0.9)
    loader.set_weights({"web": 1, "code": 3})
    for _ in range(3):
        next(it)
    got = loader.metrics()
    assert (got["weight/web"], got["weight/code"]) == (pytest.approx(0.25), pytest.approx(0.75))


def _report(path: Path, error: Exception) -> None:
    """An errors= function whose calls outlive the worker processes: a line each, in ``path``."""
    with open(path, "a") as f:
        f.write(f"{Path(getattr(error, 'path', '')).name} {getattr(error, 'row', None)}\n")


def bad_stream(root: Path, name: str, n: int, report: Path) -> tidal.Dataset:
    """``n`` records in 2 files, every 7th line not JSON: bad records all through the files."""
    root.mkdir(parents=True, exist_ok=True)
    for s in range(2):
        lines = [
            "{not json" if i % 7 == 3 else json.dumps({"src": name, "id": i, "text": f"{name} {i}"})
            for i in range(s, n, 2)
        ]
        (root / f"{name}-{s}.jsonl").write_text("\n".join(lines) + "\n")
    errors = functools.partial(_report, report)
    return tidal.Dataset(str(root / f"{name}-*.jsonl"), errors=errors).shuffle(seed=3, block_size=16)


@pytest.mark.parametrize("loader", ["torch0", "torch2", "jax0", "jax2"])
def test_set_weights_reports_no_bad_record_twice(tmp_path: Path, loader: str) -> None:
    """set_weights restarts the readers at the last batch received, behind where they had read ahead
    (and reported the bad records they met): those go to the errors function once, count once in
    metrics()['skipped'], and the streams' counters still add up."""
    report = tmp_path / "reported.txt"
    streams = {name: bad_stream(tmp_path / name, name, n, report) for name, n in (("web", 300), ("code", 200))}
    ds = tidal.mix(streams, weights={"web": 0.5, "code": 0.5}, seed=0).batch(4)
    workers = int(loader[-1])
    if loader.startswith("jax"):
        jax_loader = pytest.importorskip("tidal.jax")
        made: Any = jax_loader.Loader(ds, num_workers=workers)
    else:
        made = tidal.DataLoader(ds, num_workers=workers)
    changes = {3: {"web": 0.9, "code": 0.1}, 8: {"web": 0.2, "code": 0.8}}
    for step, _ in enumerate(made):
        if step in changes:
            made.set_weights(changes[step])
    lines = report.read_text().splitlines() if report.exists() else []
    assert lines, "no bad record was read"
    twice = sorted({line for line in lines if lines.count(line) > 1})
    assert not twice, f"reported more than once: {twice}"
    metrics = made.metrics()
    assert metrics["skipped"] == len(lines)
    assert metrics["records"] == metrics["records/web"] + metrics["records/code"]


@pytest.mark.parametrize("set_weights", [False, True], ids=["as_drawn", "set_weights"])
@pytest.mark.parametrize("loader", ["torch0", "torch2", "jax0", "jax2"])
def test_a_reopened_stream_reports_its_bad_records_once_a_read(tmp_path: Path, loader: str, set_weights: bool) -> None:
    """stop="all_exhausted" reopens a stream that ended (its next epoch) while the others go on: its
    bad records are met again, and reach the errors function once each time they are read (as often
    as the records beside them are yielded), set_weights restarts or not; metrics()['skipped']
    counts every call, the reopened readers' too.

    Bad records are reported as they are read, ahead of the loop: the readers a restart replaces
    may have met epochs of "a" their successors never reach, where the new weights draw "a" less
    (reported, not served: docs/mixing.md#live-weights). So the weights here only ever draw "a"
    more, and the successors read past every epoch the replaced readers met."""
    rows: list[int | None] = [None, 1, 2, None, 3, 4, 5, 6, None, 7, 8, 9]  # None: not JSON
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "a.jsonl").write_text(
        "".join("{not json\n" if i is None else json.dumps({"id": i}) + "\n" for i in rows)
    )
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "b.jsonl").write_text("".join(json.dumps({"id": i}) + "\n" for i in range(100, 260)))
    report = tmp_path / "reported.txt"
    errors = functools.partial(_report, report)
    streams = {name: tidal.Dataset(str(tmp_path / name), errors=errors) for name in "ab"}
    ds = tidal.mix(streams, weights={"a": 1.0, "b": 1.0}, seed=3, stop="all_exhausted").batch(2)
    workers = int(loader[-1])
    if loader.startswith("jax"):
        jax_loader = pytest.importorskip("tidal.jax")
        made: Any = jax_loader.Loader(ds, num_workers=workers)
    else:
        made = tidal.DataLoader(ds, num_workers=workers)
    changes = {3: {"a": 1.0, "b": 0.5}, 20: {"a": 1.0, "b": 0.25}} if set_weights else {}
    yielded: dict[int, int] = {}
    for step, batch in enumerate(made):
        if step in changes:
            made.set_weights(changes[step])
        for i in np.asarray(batch["id"]).tolist():
            yielded[i] = yielded.get(i, 0) + 1
    lines = report.read_text().splitlines() if report.exists() else []
    assert yielded[1] > 2, "stream a was not reopened"
    for r, i in enumerate(rows):
        if i is None:
            after = next(j for j in rows[r + 1 :] if j is not None)
            before = next((j for j in reversed(rows[:r]) if j is not None), after)
            calls = lines.count(f"a.jsonl {r}")
            assert yielded[after] <= calls <= max(yielded[before], yielded[after]), (r, calls, yielded)
    metrics = made.metrics()
    assert metrics["skipped"] == len(lines)
    assert metrics["records"] == metrics["records/a"] + metrics["records/b"]
