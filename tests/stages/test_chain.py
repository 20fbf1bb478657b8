"""A chain is data: it pickles, shows itself, and runs the same in fork, spawn and forkserver workers."""

from __future__ import annotations

import functools
import itertools
import json
import pickle
from pathlib import Path

import pytest
import torch
from conftest import make_shards
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from makers import word_tokenizer

import tidal
from tidal.testing import same


def add_length(record: dict) -> dict:
    return {**record, "n": len(record["text"])}


def id_not_divisible(record: dict, by: int) -> bool:
    return record["id"] % by != 0


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_shards(tmp_path_factory.mktemp("chain") / "data", [40, 75, 13, 60, 52, 33, 17])


def build(data: Path, steps: list[tuple[str, int]]) -> tidal.Dataset:
    """A dataset from a list of (method, argument), as a user would chain it."""
    ds = tidal.Dataset(data)
    for name, arg in steps:
        if name == "shuffle":
            ds = ds.shuffle(seed=arg, block_size=16, shards_per_block=2)
        elif name == "repeat":
            ds = ds.repeat(arg or None)
        elif name == "map":
            ds = ds.map(add_length)
        elif name == "filter":
            ds = ds.filter(functools.partial(id_not_divisible, by=arg + 2))
        elif name == "mix":
            other = tidal.Dataset(data).shuffle(seed=arg + 7, block_size=16).repeat()
            if ("map", 0) in [(n, 0) for n, _ in steps]:
                other = other.map(add_length)  # records of both streams have the same fields
            ds = tidal.mix({"a": ds, "b": other}, weights={"a": 0.6, "b": 0.4}, seed=arg, stop="first_exhausted")
    return ds


steps_st = st.lists(
    st.tuples(st.sampled_from(["shuffle", "repeat", "map", "filter", "mix"]), st.integers(0, 3)), max_size=5
).filter(
    lambda s: (
        [n for n, _ in s].count("mix") <= 1
        and all(
            n not in ("shuffle", "repeat")
            for n, _ in s[next((i for i, (n, _) in enumerate(s) if n == "mix"), len(s)) :]
        )
    )
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=steps_st, batch=st.integers(1, 9), stop=st.integers(0, 30))
def test_a_pickled_chain_yields_the_same_batches_and_resumes_the_same(data, steps, batch, stop) -> None:
    ds = build(data, steps).batch(batch)
    copy = pickle.loads(pickle.dumps(ds))
    assert repr(copy) == repr(ds) and copy.fingerprint() == ds.fingerprint()
    want = list(itertools.islice(ds, 60))
    assert same(list(itertools.islice(copy, 60)), want)
    it = ds.iterator()
    list(itertools.islice(it, stop))
    state = json.loads(json.dumps(it.state()))
    resumed = pickle.loads(pickle.dumps(ds)).iterator(state=state)
    assert same(list(itertools.islice(resumed, 20)), want[stop : stop + 20])


def test_tokenized_and_packed_chains_pickle(tmp_path: Path) -> None:
    root = tmp_path / "docs"
    root.mkdir()
    (root / "a.jsonl").write_text(
        "".join(json.dumps({"text": " ".join(map(str, range(i, i + 9)))}) + "\n" for i in range(50))
    )
    ds = tidal.Dataset(root).shuffle(seed=3).repeat().tokenize(word_tokenizer(), eos="<eos>").pack(16).batch(2)
    copy = pickle.loads(pickle.dumps(ds))
    assert same(list(itertools.islice(copy, 10)), list(itertools.islice(ds, 10)))


def test_repr_shows_the_pipeline(data: Path) -> None:
    ds = tidal.Dataset(data).shuffle(seed=1).repeat().map(add_length).batch(8)
    assert repr(ds) == (
        "Dataset(7 shards, 290 records).shuffle(seed=1, block_size=16384, shards_per_block=8, block_bytes=134217728)"
        ".repeat(None).map(add_length).batch(8, drop_last=True)"
    )
    mixed = tidal.mix({"web": tidal.Dataset(data), "code": tidal.Dataset(data).repeat()}, seed=2)
    assert repr(mixed).startswith("mix({'web': Dataset(7 shards, 290 records), 'code': Dataset(7 shards")


def test_a_dataset_with_a_pending_resume_pickles_without_its_iterator(data: Path) -> None:
    ds = tidal.Dataset(data).shuffle(seed=1).batch(4)
    it = iter(ds)
    next(it)
    state = ds.state_dict()
    ds.load_state_dict(state)
    copy = pickle.loads(pickle.dumps(ds))
    assert same(next(iter(copy)), next(iter(ds)))


def test_the_loader_dataset_yields_plain_batches_to_other_loaders(data: Path) -> None:
    """Wrappers such as Accelerate rebuild a DataLoader around ``loader.dataset``: it must yield
    what the tidal loader yields, never an internal type."""
    loader = tidal.DataLoader(tidal.Dataset(data).shuffle(seed=2).batch(4), num_workers=2)
    mine = list(loader)
    theirs = list(torch.utils.data.DataLoader(loader.dataset, batch_size=None, num_workers=2))
    assert all(type(b) is dict and isinstance(b["id"], torch.Tensor) for b in theirs)
    assert sorted(i for b in theirs for i in b["id"].tolist()) == sorted(i for b in mine for i in b["id"].tolist())


def test_a_function_that_does_not_pickle_is_named_before_workers_spawn(data: Path) -> None:
    ds = tidal.Dataset(data).map(lambda r: r).batch(4)
    loader = tidal.DataLoader(ds, num_workers=2, multiprocessing_context="spawn")
    with pytest.raises(tidal.ArgumentError, match=r"map\(.*<lambda>\).*'spawn'.*define it at the top level"):
        next(iter(loader))
    ds = tidal.Dataset(data, errors=lambda e: None).batch(4)  # an errors= policy travels with the dataset too
    loader = tidal.DataLoader(ds, num_workers=2, multiprocessing_context="spawn")
    with pytest.raises(tidal.ArgumentError, match=r"errors='.*<lambda>'.*'spawn'.*define it at the top level"):
        next(iter(loader))


@pytest.mark.slow
@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_spawned_workers_yield_and_resume_as_forked_ones(data: Path, context: str) -> None:
    ds = tidal.Dataset(data).shuffle(seed=1, block_size=32).repeat(2).map(add_length).batch(6)
    full = [b["id"].tolist() for b in tidal.DataLoader(ds, num_workers=2)]
    loader = tidal.DataLoader(ds, num_workers=2, multiprocessing_context=context)
    head = [b["id"].tolist() for b in itertools.islice(loader, 17)]
    state = json.loads(json.dumps(loader.state_dict()))
    resumed = tidal.DataLoader(ds, num_workers=2, multiprocessing_context=context)
    resumed.load_state_dict(state)
    assert head + [b["id"].tolist() for b in resumed] == full
