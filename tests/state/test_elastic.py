"""Elastic restores: stop on one topology, resume on another, every record once per epoch."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from pathlib import Path

import pytest
from conftest import make_shards
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tidal
from tidal.state.elastic import progress
from tidal.world import World


def sources(ds: tidal.Dataset) -> dict:
    return {k: {"records": p.total, "finite": p.epochs is not None} for k, p in ds.sources().items()}


def ids_of(item) -> list[int]:
    return item["id"].tolist() if hasattr(item["id"], "tolist") else [item["id"]]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    sizes=st.lists(st.integers(0, 40), min_size=1, max_size=6),
    topo1=st.tuples(st.integers(1, 4), st.integers(1, 3)),
    topo2=st.tuples(st.integers(1, 4), st.integers(1, 3)),
    seed=st.none() | st.integers(0, 50),
    batch=st.none() | st.integers(1, 4),
    data=st.data(),
)
def test_any_stop_resumes_on_any_topology_with_every_record_once(
    tmp_path_factory, sizes, topo1, topo2, seed, batch, data
):
    if sum(sizes) == 0:
        sizes = [*sizes, 3]
    ds = tidal.Dataset(make_shards(tmp_path_factory.mktemp("d") / "data", sizes))
    if seed is not None:
        ds = ds.shuffle(seed, block_size=7, shards_per_block=2)
    if batch is not None:
        ds = ds.batch(batch, drop_last=False)
    n1 = topo1[0] * topo1[1]
    stops = data.draw(st.lists(st.integers(0, 60), min_size=n1, max_size=n1))
    seen: list[int] = []
    consumed = []
    for reader in range(n1):
        it = ds.iterator(World(reader // topo1[1], topo1[0], reader % topo1[1], topo1[1]))
        for item in itertools.islice(it, stops[reader]):
            seen += ids_of(item)
        consumed.append(it.used())
    origin = progress(sources(ds), consumed, None, 0)
    n2 = topo2[0] * topo2[1]
    for reader in range(n2):
        it = ds.iterator(World(reader // topo2[1], topo2[0], reader % topo2[1], topo2[1]), origin=origin)
        for item in it:
            seen += ids_of(item)
    counts = Counter(seen)
    assert max(counts.values(), default=1) == 1, "a record was read twice"
    missing = sum(sizes) - len(counts)
    assert 0 <= missing < n2, f"{missing} records never read (the new topology may leave fewer than {n2})"


@pytest.mark.parametrize("topo1,topo2", [((1, 2), (1, 3)), ((1, 3), (1, 0)), ((1, 0), (1, 2))])
def test_the_loader_resumes_with_another_worker_count(tmp_path: Path, topo1, topo2) -> None:
    root = make_shards(tmp_path / "data", [40, 75, 13, 60, 52, 33, 90, 17])
    ds = tidal.Dataset(root).shuffle(seed=1, block_size=32).batch(6, drop_last=False)
    loader = tidal.DataLoader(ds, num_workers=topo1[1])
    head = [i for b in itertools.islice(loader, 17) for i in b["id"].tolist()]
    state = json.loads(json.dumps(loader.state_dict()))
    assert state["topology"] == [1, max(1, topo1[1])] and state["progress"][""]["done"]
    resumed = tidal.DataLoader(ds, num_workers=topo2[1])
    resumed.load_state_dict(state)
    rest = [i for b in resumed for i in b["id"].tolist()]
    counts = Counter(head + rest)
    assert max(counts.values()) == 1 and len(counts) > 380 - max(1, topo2[1])


def test_ranks_saved_apart_merge_and_resume_on_more_ranks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = make_shards(tmp_path / "data", [40, 75, 13, 60, 52, 33, 90, 17])
    ds = tidal.Dataset(root).shuffle(seed=2, block_size=32).repeat(2).batch(4)
    seen, states = [], []
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        loader = tidal.DataLoader(ds, num_workers=1)
        seen += [i for b in itertools.islice(loader, 30 + 7 * rank) for i in b["id"].tolist()]
        states.append(json.loads(json.dumps(loader.state_dict())))
    with pytest.raises(tidal.StateError, match="lacks ranks"):
        monkeypatch.setenv("RANK", "0")
        monkeypatch.setenv("WORLD_SIZE", "3")
        again = tidal.DataLoader(ds, num_workers=1)
        again.load_state_dict(states[0])
        next(iter(again))
    merged = tidal.state.merge(states)
    for rank in range(3):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "3")
        loader = tidal.DataLoader(ds, num_workers=2)
        loader.load_state_dict(merged)
        seen += [i for b in loader for i in b["id"].tolist()]
    counts = Counter(seen)
    assert set(counts.values()) <= {1, 2}  # two epochs: each record at most twice
    assert sum(counts.values()) > 2 * 380 - 2 * 6 * 4  # at most the documented remainders missing


@pytest.mark.parametrize("strategy", ["concat", "best_fit"])
def test_packed_streams_resume_elastically_at_document_granularity(tmp_path: Path, strategy: str) -> None:
    from makers import word_tokenizer, write_docs

    docs = [[i] + [900 + (i * 7 + j) % 90 for j in range(3 + i % 25)] for i in range(400)]  # first token: its id
    ds = (
        tidal.Dataset(write_docs(tmp_path / "data", docs, shards=5))
        .shuffle(seed=4, block_size=50)
        .tokenize(word_tokenizer(), eos="<eos>")
        .pack(24, strategy, buffer_size=4)
        .batch(2)
    )
    starts: list[int] = []
    loader = tidal.DataLoader(ds, num_workers=2)
    for b in itertools.islice(loader, 23):
        starts += [t for t in b["input_ids"].flatten().tolist() if t < 900]
    state = json.loads(json.dumps(loader.state_dict()))
    resumed = tidal.DataLoader(ds, num_workers=3)
    resumed.load_state_dict(state)
    for b in resumed:
        starts += [t for t in b["input_ids"].flatten().tolist() if t < 900]
    counts = Counter(starts)
    if strategy == "concat":
        assert max(counts.values()) == 1, "a document was packed twice"
    else:  # the buffer in progress is packed again: its documents may repeat, never more than twice
        assert max(counts.values()) <= 2
    assert len(counts) > 400 - 20  # at most a few documents per reader at the ends
