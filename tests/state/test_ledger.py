"""The ledger (tidal.state.ledger): what a loader's training loop consumed, and the state made
from it. Fed here with the reader states of real readers over a real dataset, batch by batch, as
the loaders feed it, and checked against what tidal.DataLoader saves."""

from __future__ import annotations

import copy
import itertools
import json
from pathlib import Path

import pytest
from conftest import make_shards

import tidal
from tidal.state import keys as k
from tidal.state import schema
from tidal.state.ledger import UNDO, Ledger
from tidal.world import World

ONE = World()  # one rank


@pytest.fixture
def ds(tmp_path: Path) -> tidal.Dataset:
    return tidal.Dataset(make_shards(tmp_path / "data", [40, 75, 13, 60, 52, 33])).shuffle(seed=3).batch(5)


def feed(ledger: Ledger, ds: tidal.Dataset, batches: int, ranks: World = ONE, tokens: int = 0) -> list[list[int]]:
    """Read ``batches`` batches round-robin over the ledger's readers, from where it stands, as
    a loader does; consume each (of ``tokens`` tokens: these batches have no input_ids). The
    batches' ids."""
    ledger.restore(ranks)
    first, origin, workers = ledger.first_epoch(), ledger.origin, ledger.workers
    its = [ds.iterator(ranks.with_worker(w, workers), state, first, origin) for w, state in enumerate(ledger.readers)]
    out = []
    w = ledger.next_worker
    for _ in range(batches):
        batch = next(its[w])
        ledger.consume(w, its[w].state(), tokens)
        out.append(batch["id"].tolist())
        w = (w + 1) % workers
    return out


def test_rank_state_types_name_the_keys() -> None:
    assert set(schema.RankState.__annotations__) == {k.NEXT_WORKER, k.WORKERS, k.COUNTS}
    assert set(schema.RankCounts.__annotations__) == {k.BATCHES, k.TOKENS}
    assert set(schema.fresh_rank(3)) == set(schema.RankState.__required_keys__)


def test_snapshot_is_the_state_dataloader_saves(ds: tidal.Dataset) -> None:
    loader = tidal.DataLoader(ds, num_workers=2)
    expected = [b["id"].tolist() for b in itertools.islice(loader, 7)]
    ledger = Ledger(ds, 2)
    assert feed(ledger, ds, 7) == expected
    assert json.dumps(ledger.snapshot()) == json.dumps(loader.state_dict())
    rank = ledger.snapshot()[k.RANKS][0]
    assert rank[k.NEXT_WORKER] == 1 and rank[k.COUNTS] == {k.BATCHES: 7, k.TOKENS: 0}


def test_rewind_steps_back_over_the_last_records(ds: tidal.Dataset) -> None:
    ledger, shorter = Ledger(ds, 2), Ledger(ds, 2)
    feed(ledger, ds, 10, tokens=5)
    feed(shorter, ds, 7, tokens=5)
    assert ledger.snapshot(rewind=3) == shorter.snapshot()
    assert ledger.rewound(0) == ledger.local and ledger.rewound(0) is not ledger.local
    assert ledger.snapshot()[k.RANKS][0][k.COUNTS][k.BATCHES] == 10  # rewinding changed nothing held
    assert ledger.rewound(10) == schema.fresh_rank(2)


def test_undo_holds_the_last_batches_only(tmp_path: Path) -> None:
    ds = tidal.Dataset(make_shards(tmp_path / "data", [400])).batch(1)
    ledger = Ledger(ds, 1)
    feed(ledger, ds, UNDO + 5)
    assert ledger.rewound(UNDO + 5)[k.COUNTS][k.BATCHES] == 5  # the first 5 cannot be undone


def test_restore_same_topology_continues_exactly(ds: tidal.Dataset) -> None:
    full = feed(Ledger(ds, 2), ds, 12)
    ledger = Ledger(ds, 2)
    feed(ledger, ds, 5)
    state = json.loads(json.dumps(ledger.snapshot()))
    again = Ledger(ds, 2)
    again.load(state)
    assert again.snapshot() is state  # pending: saved again as loaded
    assert feed(again, ds, 7) == full[5:]
    assert again.pending is None and again.snapshot()[k.RANKS][0][k.COUNTS][k.BATCHES] == 12
    assert again.rewound(7)[k.COUNTS][k.BATCHES] == 5  # restoring cleared the undo of before


def test_restore_other_topology_starts_from_progress(ds: tidal.Dataset) -> None:
    ledger = Ledger(ds, 2)
    first = feed(ledger, ds, 6)
    wider = Ledger(ds, 3)
    wider.load(ledger.snapshot())
    rest = feed(wider, ds, 10)
    wider.restore(World())
    assert wider.origin == ledger.snapshot()[k.PROGRESS]
    seen = [i for b in first + rest for i in b]
    assert len(seen) == len(set(seen))  # no record twice
    assert wider.snapshot()[k.RANKS][0][k.COUNTS][k.BATCHES] == 16


def test_pass_ended_starts_the_next_epochs(ds: tidal.Dataset) -> None:
    ledger = Ledger(ds, 2)
    feed(ledger, ds, 3)
    ledger.pass_ended()
    assert (ledger.pass_, ledger.origin, ledger.local) == (1, None, schema.fresh_rank(2))
    assert ledger.first_epoch() == ds.epochs_per_pass()
    assert ledger.rewound(3) == schema.fresh_rank(2)


def test_snapshot_gathers_every_rank(ds: tidal.Dataset) -> None:
    ranks = World(1, 2)
    ledger = Ledger(ds, 2, ranks=lambda: ranks)
    feed(ledger, ds, 4, ranks)
    alone = ledger.snapshot()  # no gather: this rank's alone, in its slot
    assert alone[k.RANKS][0] is None and alone[k.RANKS][1] == ledger.local and alone[k.PROGRESS] is None
    other = Ledger(ds, 2, ranks=lambda: World(0, 2))
    feed(other, ds, 4, World(0, 2))
    seen: list = []

    def gather(mine: list) -> list:  # the rank state and the set_weights calls of each rank
        seen.append(mine[0])
        return [[other.local, other.calls.mine(other.weights)], mine]

    both = ledger.snapshot(gather)
    assert seen == [ledger.local] and both[k.TOPOLOGY] == [2, 2] and both[k.PROGRESS] is not None
    schema.check_same_step(both[k.RANKS])

    feed(other, ds, 1, World(0, 2))
    with pytest.raises(tidal.StateError, match=r"different numbers of batches on different ranks \(\{0: 5, 1: 4\}\)"):
        ledger.snapshot(gather)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda s: s.update({k.DATASET: "0123456789abcdef"}), r"different dataset"),
        (lambda s: s[k.RANKS][0][k.WORKERS][1].update({k.DATASET: "x"}), r"different dataset"),
        (
            lambda s: s[k.RANKS][0][k.WORKERS][1].update({k.WITHIN: 10**6}),
            r"state\['ranks'\]\[0\]\['workers'\]\[1\]\['within'\]: 1000000 items is past the chunk",
        ),
        (lambda s: s[k.RANKS][0].update({k.NEXT_WORKER: 2}), r"state\['ranks'\]\[0\]\['next_worker'\]"),
        (lambda s: s.update({k.PASS: -1}), r"state\['pass'\]"),
    ],
)
def test_load_refuses_a_hostile_state_and_keeps_what_it_had(ds: tidal.Dataset, edit, message) -> None:
    ledger = Ledger(ds, 2)
    feed(ledger, ds, 5)
    state = ledger.snapshot()
    bad = copy.deepcopy(state)
    edit(bad)
    with pytest.raises(tidal.StateError, match=message):
        ledger.load(bad)
    assert ledger.pending is None and ledger.snapshot() == state


def test_jax_loader_checks_positions_at_load(ds: tidal.Dataset) -> None:
    pytest.importorskip("jax")
    import tidal.jax

    loader = tidal.jax.Loader(ds, num_workers=2, prefetch=0)
    for _ in itertools.islice(loader, 5):
        pass
    state = loader.state_dict()
    loader.close()
    state[k.RANKS][0][k.WORKERS][1][k.WITHIN] = 10**6
    with pytest.raises(tidal.StateError, match=r"\['workers'\]\[1\]\['within'\]"):
        tidal.jax.Loader(ds, num_workers=2).load_state_dict(state)
