"""What the code above a chain asks of it, answered by each stage (no isinstance from outside)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import make_shards

import tidal


def ident(rec: dict) -> dict:
    return rec


def keep(rec: dict) -> bool:
    return rec["id"] % 2 == 0


def report(error: Exception) -> None:
    """An errors= function: returning skips the record."""


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_shards(tmp_path_factory.mktemp("facts") / "data", [10, 20])


def test_records_per_batch_and_uneven_ends_per_chain(data: Path) -> None:
    ds = tidal.Dataset(data)
    skip = tidal.Dataset(data, errors="skip")
    mixed = tidal.mix([ds, ds], weights=[1, 1], seed=0)
    cases = [  # (chain, records per item, may end unevenly)
        (ds, 1, False),
        (ds.map(ident).batch(4), 4, False),
        (ds.batch(4, continuous=True), 4, False),
        (ds.filter(keep).batch(4), None, True),
        (ds.repeat().filter(keep).batch(4), None, False),  # a pass that never ends cannot end unevenly
        (skip.batch(4), None, True),
        (ds.pack(8, column="id"), None, True),
        (mixed.batch(2), None, True),
        (tidal.mix([ds.repeat(), ds.repeat()], weights=[1, 1], stop="never").batch(2), None, False),
    ]
    for chain, per_item, uneven in cases:
        assert chain.records_per_batch() == per_item, repr(chain)
        assert chain.may_end_unevenly() == uneven, repr(chain)


def test_functions_tokenizers_and_batches_are_the_stages_to_say(data: Path) -> None:
    ds = tidal.Dataset(data, errors=report).map(ident).filter(keep)
    assert [what for s in tidal.stages.walk(ds.stage) for what, _ in s.functions()] == [
        "filter(keep)",
        "map(ident)",
        "errors='report'",
    ]
    assert ds.batched is False and ds.batch(3).batched is True
    assert all(s.tokenizer_used() is None for s in tidal.stages.walk(ds.stage))
    assert tidal.Dataset(data).pack(8, column="id").stage.shifts_labels()
    assert not tidal.Dataset(data).pack(8, column="id", shift_labels=False).stage.shifts_labels()
