"""Mixing: proportions, schedules, counts, stop rules, exact resumption, partitioning."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from pathlib import Path

import pytest
from conftest import write_jsonl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tidal
from tidal.state.elastic import progress
from tidal.testing import assert_resumes_exactly
from tidal.world import World


def stream(root: Path, name: str, n: int, shards: int = 3) -> tidal.Dataset:
    root.mkdir(parents=True, exist_ok=True)
    for s in range(shards):
        recs = [{"src": name, "id": i} for i in range(s, n, shards)]
        write_jsonl(root / f"{name}-{s}.jsonl", recs)
    return tidal.Dataset(str(root / f"{name}-*.jsonl"))


@pytest.fixture
def streams(tmp_path: Path) -> dict[str, tidal.Dataset]:
    return {
        "web": stream(tmp_path, "web", 3000).shuffle(seed=1).repeat(),
        "code": stream(tmp_path, "code", 500).shuffle(seed=2).repeat(),
    }


def test_proportions_follow_the_weights(streams) -> None:
    """Tolerance: 4 standard deviations of a binomial over 20,000 draws (~0.013 at p=0.3)."""
    mixed = tidal.mix(streams, weights={"web": 0.7, "code": 0.3}, seed=0)
    n = 20_000
    share = sum(r["src"] == "code" for r in itertools.islice(mixed, n)) / n
    assert abs(share - 0.3) < 4 * (0.3 * 0.7 / n) ** 0.5


def test_a_schedule_moves_the_proportions(streams) -> None:
    schedule = tidal.Linear({"web": 1.0, "code": 0.0}, {"web": 0.0, "code": 1.0}, steps=8192)
    drawn = [r["src"] for r in itertools.islice(tidal.mix(streams, weights=schedule, seed=1), 12_288)]
    first, last = drawn[:1024], drawn[-2048:]
    assert first.count("code") == 0 and last.count("web") == 0
    middle = drawn[4096:5120].count("code") / 1024  # weights there: 0.5 to 0.625
    assert 0.45 < middle < 0.68
    piecewise = tidal.Piecewise(((0, {"web": 1, "code": 0}), (2048, {"web": 0, "code": 1})))
    drawn = [r["src"] for r in itertools.islice(tidal.mix(streams, weights=piecewise, seed=1), 3072)]
    assert set(drawn[:2048]) == {"web"} and set(drawn[2048:]) == {"code"}


def test_choose_and_repeat_give_exact_counts_per_mixture_epoch(tmp_path: Path) -> None:
    web, code = stream(tmp_path, "web", 300).shuffle(seed=1), stream(tmp_path, "code", 40).shuffle(seed=2)
    mixed = tidal.mix({"web": web, "code": code}, choose={"web": 100}, repeat={"code": 2.0}, seed=3, stop="never")
    first = [r["src"] for r in itertools.islice(mixed, 180)]
    assert Counter(first) == {"web": 100, "code": 80}
    code_ids = [r["id"] for r in itertools.islice(mixed, 180) if r["src"] == "code"]
    assert Counter(code_ids) == dict.fromkeys(range(40), 2)  # repeat=2: every record twice


def test_stop_rules(tmp_path: Path) -> None:
    a, b = stream(tmp_path, "a", 30), stream(tmp_path, "b", 300)
    first = list(tidal.mix({"a": a, "b": b}, seed=0, stop="first_exhausted"))
    assert sum(r["src"] == "a" for r in first) == 30 and sum(r["src"] == "b" for r in first) < 300
    every = list(tidal.mix({"a": a, "b": b}, seed=0, stop="all_exhausted"))
    got_b = Counter(r["id"] for r in every if r["src"] == "b")
    assert set(got_b) == set(range(300)) and max(got_b.values()) == 1  # b read once; a oversampled
    assert sum(r["src"] == "a" for r in every) > 30
    never = tidal.mix({"a": a, "b": b}, seed=0, stop="never")
    assert len(list(itertools.islice(never, 2000))) == 2000


def test_mixing_resumes_exactly_before_and_after_batching(streams) -> None:
    mixed = tidal.mix(streams, weights=[0.6, 0.4], seed=5)
    assert assert_resumes_exactly(mixed, limit=400, horizon=5, every=7) == 400
    assert assert_resumes_exactly(mixed.batch(16), limit=60, horizon=None, every=3) == 60
    sched = tidal.Cosine({"web": 0.9, "code": 0.1}, {"web": 0.2, "code": 0.8}, steps=3000)
    assert assert_resumes_exactly(tidal.mix(streams, weights=sched, seed=5), limit=300, every=11) == 300


def test_stats_count_records_and_tokens_per_stream(tmp_path: Path) -> None:
    from makers import word_tokenizer, write_docs

    docs = write_docs(tmp_path / "docs", [[1, 2, 3]] * 50, shards=2)
    tok = tidal.Dataset(docs).tokenize(word_tokenizer(), eos="<eos>")
    it = tidal.mix({"x": tok, "y": tok}, seed=0, stop="all_exhausted").iterator()
    list(it)
    stats = it.stats()
    assert stats["records_per_stream"]["x"] >= 50 and stats["records_per_stream"]["y"] >= 50
    assert stats["tokens_per_stream"]["x"] == 4 * stats["records_per_stream"]["x"]


def test_arguments_are_checked(streams) -> None:
    with pytest.raises(ValueError, match="unknown streams"):
        tidal.mix(streams, weights={"web": 1, "books": 1})
    with pytest.raises(ValueError, match="stop must be one of"):
        tidal.mix(streams, stop="sometimes")
    with pytest.raises(ValueError, match="on the streams before mix"):
        tidal.mix(streams).shuffle(seed=0)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    sizes=st.tuples(st.integers(1, 60), st.integers(1, 60)),
    weights=st.tuples(st.floats(0.1, 1), st.floats(0.1, 1)),
    topo1=st.tuples(st.integers(1, 4), st.integers(1, 3)),
    topo2=st.tuples(st.integers(1, 4), st.integers(1, 3)),
    stop_at=st.integers(0, 40),
)
def test_a_mixture_resumed_on_a_new_topology_reads_each_stream_once(
    tmp_path_factory, sizes, weights, topo1, topo2, stop_at
) -> None:
    """Streams read once each (no restarts: one epoch, stop when all are exhausted and never
    restarted) split over a first topology, then resumed on a second from the merged progress."""
    root = tmp_path_factory.mktemp("m")
    parts = {"a": stream(root, "a", sizes[0], shards=2), "b": stream(root, "b", sizes[1], shards=3)}
    ds = tidal.mix(
        {k: v.shuffle(seed=1) for k, v in parts.items()}, weights=list(weights), seed=2, stop="all_exhausted"
    )
    seen: list[tuple[str, int]] = []
    consumed = []
    n1, n2 = topo1[0] * topo1[1], topo2[0] * topo2[1]
    for reader in range(n1):
        it = ds.iterator(World(reader // topo1[1], topo1[0], reader % topo1[1], topo1[1]))
        for r in itertools.islice(it, stop_at):
            if it.used()[f"{r['src']}/"][0] == 0:
                seen.append((r["src"], r["id"]))
        consumed.append(it.used())
    sources = {k: {"records": p.total, "finite": True} for k, p in ds.sources().items()}
    origin = json.loads(json.dumps(progress(sources, consumed, None, 0)))
    for reader in range(n2):
        it = ds.iterator(World(reader // topo2[1], topo2[0], reader % topo2[1], topo2[1]), origin=origin)
        for r in it:  # a stream that ends is restarted (oversampled): keep only its first epoch
            if it.used()[f"{r['src']}/"][0] == 0:
                seen.append((r["src"], r["id"]))
    epoch0 = Counter(seen)
    for name, size in zip("ab", sizes, strict=True):
        got = {i for (s, i) in epoch0 if s == name}
        assert max((c for (s, _), c in epoch0.items() if s == name), default=1) == 1, f"{name}: a record twice"
        assert len(got) > size - n1 - n2, f"{name}: {size - len(got)} records lost"


def test_an_elastic_restore_continues_the_weight_schedule(streams) -> None:
    switch = tidal.Piecewise(((0, {"web": 1, "code": 0}), (2048, {"web": 0, "code": 1})))
    ds = tidal.mix(streams, weights=switch, seed=0).batch(64)
    loader = tidal.DataLoader(ds, num_workers=2)
    head = [s for b in itertools.islice(loader, 24) for s in b["src"]]  # 1536 draws, all before the switch
    assert set(head) == {"web"}
    resumed = tidal.DataLoader(ds, num_workers=1)
    resumed.load_state_dict(json.loads(json.dumps(loader.state_dict())))
    rest = [s for b in itertools.islice(resumed, 16) for s in b["src"]]  # draws 1536 .. 2560 overall
    assert rest[:400].count("code") == 0 and rest[-400:].count("web") == 0


def test_options_that_cannot_hold_are_errors_at_once(streams) -> None:
    for weights in ({"web": float("nan"), "code": 1}, {"web": float("inf"), "code": 1}, {"web": -1, "code": 2}):
        with pytest.raises(tidal.ArgumentError, match="weights must be finite, non-negative"):
            tidal.mix(streams, weights=weights)
    with pytest.raises(tidal.ArgumentError, match="choose for stream 'web' must be a whole number"):
        tidal.mix(streams, choose={"web": -5})
    with pytest.raises(tidal.ArgumentError, match="repeat for stream 'code' must be a non-negative number"):
        tidal.mix(streams, repeat={"code": float("nan")})
    with pytest.raises(tidal.ArgumentError, match="epoch_size must be a whole number"):
        tidal.mix(streams, weights=[1, 1], epoch_size=0)


def test_a_count_a_stream_that_does_not_repeat_cannot_reach_is_an_error_at_once(tmp_path: Path) -> None:
    web, code = stream(tmp_path, "web", 300), stream(tmp_path, "code", 40)
    with pytest.raises(tidal.ArgumentError, match=r"stream 'code' is asked for 80 records, but it holds 40"):
        tidal.mix({"web": web, "code": code}, repeat={"code": 2.0})  # first_exhausted would end the mixture early
    with pytest.raises(tidal.ArgumentError, match=r"stream 'web' is asked for 3,000 records"):
        tidal.mix({"web": web, "code": code}, choose={"web": 3000})
    assert tidal.mix({"web": web, "code": code.repeat()}, repeat={"code": 2.0}).num_records  # it repeats: fine
    assert tidal.mix({"web": web, "code": code}, repeat={"code": 2.0}, stop="never")  # read again past its end


def test_every_argument_error_is_a_tidal_error_and_still_a_value_error(streams) -> None:
    ds = streams["web"]
    for call in (lambda: ds.batch(0), lambda: ds.pack(0), lambda: ds.shuffle(seed=-1), lambda: tidal.mix([])):
        with pytest.raises(tidal.ArgumentError) as err:
            call()
        assert isinstance(err.value, tidal.TidalError) and isinstance(err.value, ValueError)
