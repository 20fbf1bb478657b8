"""Continuous batch rows: each row a stream of its own, continued from one batch to the next."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from conftest import make_shards
from makers import word_tokenizer, write_docs

import tidal
from tidal.state.elastic import progress
from tidal.testing import assert_resumes_exactly, same
from tidal.world import World

SIZES = [40, 75, 13, 60, 52, 33, 90, 17]  # 380 records


def sources(ds: tidal.Dataset) -> dict:
    return {k: {"records": p.total, "finite": p.epochs is not None} for k, p in ds.sources().items()}


def rows_of(batches: list[dict]) -> list[list[int]]:
    """Each row's ids over the batches, row by row."""
    return [list(col) for col in zip(*(b["id"].tolist() for b in batches), strict=True)]


@pytest.mark.parametrize("ranks,workers", [(1, 1), (2, 1), (1, 2), (2, 2)])
def test_every_row_continues_its_own_share_and_rows_never_overlap(tmp_path: Path, ranks: int, workers: int) -> None:
    base = tidal.Dataset(make_shards(tmp_path / "data", SIZES)).shuffle(seed=3, block_size=32).repeat(3)
    n = 4
    ds = base.batch(n, continuous=True)
    lanes = n // workers
    seen: Counter[int] = Counter()
    steps = set()
    for rank in range(ranks):
        for worker in range(workers):
            batches = list(ds.iterator(World(rank, ranks, worker, workers)))
            steps.add(len(batches))
            assert all(len(b["id"]) == lanes for b in batches)  # each worker streams its part of the rows
            for lane, row in enumerate(rows_of(batches)):
                # row i of step t + 1 is the record after row i of step t in that row's own stream
                stream = [r["id"] for r in base.iterator(World(rank, ranks, worker, workers, lane, lanes))]
                assert row == stream
                seen.update(row)
    assert len(steps) == 1, "every reader yields as many batches"
    readers = ranks * n
    assert max(seen.values()) <= 3, "a record was read twice in one epoch"
    assert sum(3 - seen[i] for i in range(380)) < 3 * readers  # at most the remainder of each epoch


def test_packed_rows_carry_tokens_from_one_step_to_the_next(tmp_path: Path) -> None:
    docs = [[i % 900] + [(i * 7 + j) % 900 for j in range(5 + i % 40)] for i in range(300)]
    tokens = tidal.Dataset(write_docs(tmp_path / "data", docs)).shuffle(seed=1, block_size=20).repeat(2)
    tokens = tokens.tokenize(word_tokenizer(), eos="<eos>")
    ds = tokens.pack(16).batch(3, continuous=True)
    it = ds.iterator()
    batches = list(it)
    assert len(batches) > 100
    for before, after in itertools.pairwise(batches):
        # the label of the last position of row i is the first token of row i at the next step
        np.testing.assert_array_equal(before["labels"][:, -1], after["input_ids"][:, 0])
    for lane in range(3):
        row = np.concatenate([b["input_ids"][lane] for b in batches])
        stream = np.concatenate([r["input_ids"] for r in tokens.iterator(World(0, 1, 0, 1, lane, 3))])
        np.testing.assert_array_equal(row, stream[: len(row)])  # the row is its own token stream, in order
    stats = it.stats()
    assert stats["rows"] == 3 and 0 < stats["rows_refilled"] < 3 * len(batches)  # only where a document began
    plain = tidal.Dataset(write_docs(tmp_path / "plain", docs)).batch(3, continuous=True).iterator()
    assert len(list(plain)) == 100 and plain.stats()["rows_refilled"] == 300  # a record per row per step


@pytest.mark.parametrize("packed", [False, True])
def test_resumes_exactly_after_every_batch(tmp_path: Path, packed: bool) -> None:
    if packed:
        docs = [[i] + [(i * 3 + j) % 900 for j in range(2 + i % 30)] for i in range(120)]
        ds = tidal.Dataset(write_docs(tmp_path / "data", docs)).shuffle(seed=2, block_size=16).repeat(2)
        ds = ds.tokenize(word_tokenizer(), eos="<eos>").pack(8).batch(4, continuous=True)
    else:
        ds = tidal.Dataset(make_shards(tmp_path / "data", SIZES)).shuffle(seed=2, block_size=32).repeat(2)
        ds = ds.batch(4, continuous=True)
    assert assert_resumes_exactly(ds, every=7, horizon=5) > 50
    assert assert_resumes_exactly(ds, World(1, 2, 1, 2), every=11, horizon=4) > 20


@pytest.mark.parametrize("workers", [0, 2])
def test_the_loader_resumes_batch_for_batch_and_keeps_rows_continuous(tmp_path: Path, workers: int) -> None:
    docs = [[i % 900] + [(i * 5 + j) % 900 for j in range(3 + i % 20)] for i in range(200)]
    ds = (
        tidal.Dataset(write_docs(tmp_path / "data", docs))
        .shuffle(seed=5, block_size=25)
        .repeat()
        .tokenize(word_tokenizer(), eos="<eos>")
        .pack(12)
        .batch(4, continuous=True)
    )
    loader = tidal.DataLoader(ds, num_workers=workers)
    whole = list(itertools.islice(loader, 30))
    assert all(b["input_ids"].shape == (4, 12) for b in whole)
    for before, after in itertools.pairwise(whole):  # rows continue through the loader, whatever the workers
        assert before["labels"][:, -1].tolist() == after["input_ids"][:, 0].tolist()
    loader = tidal.DataLoader(ds, num_workers=workers)
    head = list(itertools.islice(loader, 11))
    state = json.loads(json.dumps(loader.state_dict()))
    assert state["ranks"][0]["counts"]["batches"] == 11
    resumed = tidal.DataLoader(ds, num_workers=workers)
    resumed.load_state_dict(state)
    rest = list(itertools.islice(resumed, 19))
    for k, (got, want) in enumerate(zip(head + rest, whole, strict=True)):
        assert same(got, want), f"batch {k} differs after the resume"


def test_a_state_of_two_readers_restores_on_three_with_every_record_once(tmp_path: Path) -> None:
    ds = tidal.Dataset(make_shards(tmp_path / "data", SIZES)).shuffle(seed=4, block_size=32).batch(2, continuous=True)
    seen: list[int] = []
    used = []
    for reader, stop in enumerate([17, 29]):
        it = ds.iterator(World(reader, 2))
        for batch in itertools.islice(it, stop):
            seen += batch["id"].tolist()
        used.append(it.used())
    assert len(used[0][""]) == 4  # [epoch, offset] of each of the reader's two rows
    origin = progress(sources(ds), used, None, 0)
    for reader in range(3):
        for batch in ds.iterator(World(reader, 3), origin=origin):
            seen += batch["id"].tolist()
    counts = Counter(seen)
    assert max(counts.values()) == 1, "a record was read twice"
    assert 380 - len(counts) < 3 * 2  # the new readers' remainder: fewer than one record per row


def test_the_loader_restores_on_another_worker_count(tmp_path: Path) -> None:
    ds = tidal.Dataset(make_shards(tmp_path / "data", SIZES)).shuffle(seed=6, block_size=32).batch(6, continuous=True)
    loader = tidal.DataLoader(ds, num_workers=2)
    head = [i for b in itertools.islice(loader, 13) for i in b["id"].tolist()]
    state = json.loads(json.dumps(loader.state_dict()))
    assert "continuous rows" in tidal.state.show(state)
    resumed = tidal.DataLoader(ds, num_workers=3)
    resumed.load_state_dict(state)
    rest = [i for b in resumed for i in b["id"].tolist()]
    counts = Counter(head + rest)
    assert max(counts.values()) == 1 and 380 - len(counts) < 6


def test_skip_moves_every_row_on(tmp_path: Path) -> None:
    ds = tidal.Dataset(make_shards(tmp_path / "data", SIZES)).shuffle(seed=7, block_size=32).batch(4, continuous=True)
    loader = tidal.DataLoader(ds, num_workers=2)
    whole = [b["id"].tolist() for b in loader]
    loader = tidal.DataLoader(ds, num_workers=2)
    head = [b["id"].tolist() for b in itertools.islice(loader, 5)]
    skipped = tidal.state.skip(json.loads(json.dumps(loader.state_dict())), batches=10)
    resumed = tidal.DataLoader(ds, num_workers=2)
    resumed.load_state_dict(skipped)
    rest = [b["id"].tolist() for b in resumed]
    assert rest == whole[15:]  # every row moved on by 10 records: exactly the batches 10 steps later
    ids = [i for b in head + rest for i in b]
    assert len(ids) == len(set(ids)) == (len(whole) - 10) * 4
    assert "records used up in epochs in progress: 60" in tidal.state.show(skipped)  # 15 batches x 4 rows


def test_misuse_is_a_clear_error(tmp_path: Path) -> None:
    ds = tidal.Dataset(make_shards(tmp_path / "data", SIZES))
    with pytest.raises(ValueError, match="drop_last"):
        ds.batch(4, drop_last=False, continuous=True)
    with pytest.raises(tidal.TidalError, match="cannot be shared evenly by 3 workers"):
        tidal.DataLoader(ds.batch(4, continuous=True), num_workers=3)
    with pytest.raises(ValueError, match="before batch"):
        ds.batch(4, continuous=True).batch(2)
    cont = ds.batch(4, continuous=True)
    it = cont.iterator()
    next(it)
    state = json.loads(json.dumps(it.state()))
    state["position"]["rows"].pop()
    with pytest.raises(tidal.StateError, match=r"state\['position'\]\['rows'\]: 3 rows saved"):
        cont.iterator(state=state)
    assert repr(cont).endswith(".batch(4, continuous=True)") and cont.batched
    assert cont.fingerprint() != ds.batch(4).fingerprint()


def test_the_jax_loader_puts_its_workers_rows_side_by_side(tmp_path: Path) -> None:
    pytest.importorskip("jax")
    import tidal.jax

    ds = tidal.Dataset(make_shards(tmp_path / "data", SIZES)).shuffle(seed=8, block_size=32).repeat()
    ds = ds.batch(4, continuous=True)
    whole = [b["id"].tolist() for b in itertools.islice(ds, 12)]  # one reader streaming all four rows
    with tidal.jax.Loader(ds, num_workers=2) as loader:
        head = [np.asarray(b["id"]).tolist() for b in itertools.islice(loader, 5)]
        state = json.loads(json.dumps(loader.state_dict()))
    with tidal.jax.Loader(ds, num_workers=2) as resumed:
        resumed.load_state_dict(state)
        rest = [np.asarray(b["id"]).tolist() for b in itertools.islice(resumed, 7)]
    assert head + rest == whole  # the same row streams, whatever the worker count


def test_a_mixture_in_every_row_resumes_exactly_and_counts_every_rows_draws(tmp_path: Path) -> None:
    web = tidal.Dataset(make_shards(tmp_path / "web", [40, 30])).shuffle(seed=1, block_size=16).repeat()
    code = tidal.Dataset(make_shards(tmp_path / "code", [25, 25])).repeat()
    mixed = tidal.mix({"web": web, "code": code}, weights={"web": 2.0, "code": 1.0}, seed=3, stop="never")
    ds = mixed.batch(4, continuous=True)
    assert_resumes_exactly(ds, every=9, horizon=4, limit=60)
    loader = tidal.DataLoader(ds, num_workers=2)
    list(itertools.islice(loader, 7))
    state = json.loads(json.dumps(loader.state_dict()))
    assert state["progress"]["@mix"] == {"draws": 7 * 4}  # one draw per row per step
    resumed = tidal.DataLoader(ds, num_workers=1)
    resumed.load_state_dict(state)
    assert next(iter(resumed))["id"].shape == (4,)
