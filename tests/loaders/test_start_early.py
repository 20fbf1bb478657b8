"""Loaders start reading when built and when given a state, not at the first ``next()``
(``start_early``): the batches are those of a loader started when iterated, whatever happens
between (a state loaded, weights set, the ranks set), and a loader dropped unused leaves nothing.

Reading is seen from a log every record read appends to, never from how long anything took.
"""

from __future__ import annotations

import functools
import gc
import itertools
import json
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import procs
import pytest
import torch
from conftest import make_shards

import tidal

PATIENCE_S = 120.0  # how long a test waits for reading it expects (a loaded machine's spawned workers)


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return make_shards(tmp_path / "data", [40, 75, 13, 60, 52, 33, 90, 17])


def logged(record: dict, log: str) -> dict:
    """Appends the id of ``record`` to the file ``log`` as it is read, a line a record."""
    with open(log, "a") as f:
        f.write(f"{record['id']}\n")
    return record


def read(log: Path) -> list[int]:
    return [int(line) for line in log.read_text().split()] if log.exists() else []


def wait_until_read(log: Path, wanted: set[int] | None = None) -> None:
    """Until the log holds ``wanted`` (or any record); fails if nothing comes in PATIENCE_S."""
    deadline = time.monotonic() + PATIENCE_S
    while not (set(read(log)) >= wanted if wanted is not None else read(log)):
        assert time.monotonic() < deadline, f"nothing read before next(): {read(log)[:20]}"
        time.sleep(0.05)


def ids(batches: object) -> list[list[int]]:
    return [b["id"].tolist() for b in batches]  # type: ignore[attr-defined]


def chain(data: Path, log: Path) -> tidal.Dataset:
    return tidal.Dataset(data).shuffle(seed=1, block_size=32).map(functools.partial(logged, log=str(log))).batch(6)


@pytest.mark.parametrize(("workers", "context"), [(0, None), (2, "fork"), (2, "spawn")])
def test_a_loader_reads_its_first_batches_once_built_and_they_are_the_batches(
    data: Path, tmp_path: Path, workers: int, context: str | None
) -> None:
    log = tmp_path / "read.log"
    ds = chain(data, log)
    plain = ids(tidal.DataLoader(ds, num_workers=workers, start_early=False))
    log.unlink()
    loader = tidal.DataLoader(ds, num_workers=workers, multiprocessing_context=context)
    wait_until_read(log)  # no next() yet
    gc.collect()  # (what iter() takes lives on: spawned workers opened its semaphores as they started)
    assert ids(loader) == plain


def test_spawned_workers_started_early_and_taken_at_once_read_their_batches(data: Path, tmp_path: Path) -> None:
    """iter() right after the build: the spawned workers, still starting, open what the start
    made for them (its events) after the loader took it."""
    ds = chain(data, tmp_path / "read.log")
    plain = ids(tidal.DataLoader(ds, num_workers=2, start_early=False))
    assert ids(tidal.DataLoader(ds, num_workers=2, multiprocessing_context="spawn")) == plain


@pytest.mark.parametrize("workers", [0, 2])
def test_a_loaded_state_is_read_from_at_once_and_nothing_read_before_it_is_served(
    data: Path, tmp_path: Path, workers: int
) -> None:
    """The workers started at build read from the start; load_state_dict stops them and starts
    others from the state, whose first batch is read before next(): the batches are the resumed ones."""
    log = tmp_path / "read.log"
    ds = chain(data, log)
    full = ids(tidal.DataLoader(ds, num_workers=workers, start_early=False))
    stop = len(full) * 3 // 4
    first = tidal.DataLoader(ds, num_workers=workers, start_early=False)
    head = ids(itertools.islice(first, stop))
    state = json.loads(json.dumps(first.state_dict()))
    log.unlink()
    resumed = tidal.DataLoader(ds, num_workers=workers)
    resumed.load_state_dict(state)
    wait_until_read(log, set(full[stop]))  # the first batch after the state, before next()
    assert head + ids(resumed) == full


def test_without_start_early_nothing_is_read_before_iteration(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "read.log"
    ds = chain(data, log)
    monkeypatch.setenv("TIDAL_START_EARLY", "0")
    off = tidal.DataLoader(ds, num_workers=2)
    monkeypatch.delenv("TIDAL_START_EARLY")
    also_off = tidal.DataLoader(ds, num_workers=2, start_early=False)
    time.sleep(1.0)  # time enough to have started (nothing can make it read)
    assert read(log) == []
    assert ids(off) == ids(also_off)
    with pytest.raises(tidal.ArgumentError, match="start_early"):
        tidal.DataLoader(ds, start_early="yes")  # type: ignore[arg-type]


def test_ranks_set_after_the_build_are_the_ranks_read_as(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Built as one process (its first batches on their way), iterated as rank 1 of 2: the batches
    are rank 1's, as if a process group had been initialized between the two."""
    log = tmp_path / "read.log"
    ds = chain(data, log)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    rank1 = ids(tidal.DataLoader(ds, num_workers=2, start_early=False))
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    log.unlink()
    loader = tidal.DataLoader(ds, num_workers=2)
    wait_until_read(log)  # read as rank 0 of 1
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert ids(loader) == rank1


def test_a_launched_process_without_its_rank_waits_for_iteration(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """LOCAL_RANK without RANK/WORLD_SIZE: one of several processes whose rank comes with the
    process group, so nothing is read as a guess."""
    log = tmp_path / "read.log"
    monkeypatch.setenv("LOCAL_RANK", "0")
    loader = tidal.DataLoader(chain(data, log), num_workers=2)
    time.sleep(1.0)
    assert read(log) == []
    assert len(ids(loader)) > 0


def mixture(data: Path, log: Path) -> tidal.Dataset:
    a = tidal.Dataset(data).shuffle(seed=1).repeat()
    b = tidal.Dataset(data).shuffle(seed=2).map(plus_1000).repeat()
    mixed = tidal.mix({"a": a, "b": b}, weights={"a": 0.5, "b": 0.5}, seed=3)
    return mixed.map(functools.partial(logged, log=str(log))).batch(5)


def plus_1000(record: dict) -> dict:
    return {**record, "id": record["id"] + 1000}


@pytest.mark.parametrize("loaded", [False, True])
def test_weights_set_before_the_first_batch_are_the_weights_read_under(
    data: Path, tmp_path: Path, loaded: bool
) -> None:
    log = tmp_path / "read.log"
    ds = mixture(data, log)
    state = None
    if loaded:
        first = tidal.DataLoader(ds, num_workers=2, start_early=False)
        list(itertools.islice(first, 5))
        state = first.state_dict()

    def batches(start_early: bool) -> list[list[int]]:
        loader = tidal.DataLoader(ds, num_workers=2, start_early=start_early)
        if state is not None:
            loader.load_state_dict(state)
        if start_early:
            wait_until_read(log)  # read under the old weights
        loader.set_weights({"a": 0.0, "b": 1.0})
        return ids(itertools.islice(loader, 12))

    late = batches(start_early=False)
    assert all(i >= 1000 for batch in late for i in batch)
    assert batches(start_early=True) == late


def test_persistent_workers_started_early_read_every_pass(data: Path, tmp_path: Path) -> None:
    log = tmp_path / "read.log"
    ds = chain(data, log)
    plain = tidal.DataLoader(ds, num_workers=2, persistent_workers=True, start_early=False)
    want = [ids(plain), ids(plain)]
    loader = tidal.DataLoader(ds, num_workers=2, persistent_workers=True)
    assert [ids(loader), ids(loader)] == want


def test_torch_draws_the_same_random_numbers_with_or_without_an_early_start(data: Path, tmp_path: Path) -> None:
    """A torch iterator draws its workers' seed from torch's generator as it is made: made at
    build, it must not move the draws of a model built after the loader."""
    ds = chain(data, tmp_path / "read.log")

    def draws(start_early: bool) -> list[float]:
        torch.manual_seed(0)
        loader = tidal.DataLoader(ds, num_workers=2, start_early=start_early)
        model = torch.rand(2).tolist()  # the model, built between the loader and its iteration
        next(iter(loader))
        return model + torch.rand(2).tolist()

    assert draws(start_early=True) == draws(start_early=False)


def test_a_loader_dropped_unused_stops_its_workers_and_frees_its_shared_memory(data: Path, tmp_path: Path) -> None:
    log = tmp_path / "read.log"
    before = set(multiprocessing.active_children())
    loader = tidal.DataLoader(chain(data, log), num_workers=2)
    wait_until_read(log)
    started = set(multiprocessing.active_children()) - before
    assert len(started) == 2
    del loader
    gc.collect()
    assert not any(p.is_alive() for p in started)
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"psm_tidal_{os.getpid()}_")]


def test_workers_stopped_by_a_state_end_and_free_their_shared_memory_behind_the_new_ones(
    data: Path, tmp_path: Path
) -> None:
    """load_state_dict kills the pass started at build and starts its own without waiting for the
    system to free what the killed workers held: they are reaped, and their shared memory released,
    in a thread; the resumed batches are the state's."""
    from tidal.transport import rings

    log = tmp_path / "read.log"
    ds = chain(data, log)
    full = ids(tidal.DataLoader(ds, num_workers=2, start_early=False))
    first = tidal.DataLoader(ds, num_workers=2, start_early=False)
    head = ids(itertools.islice(first, 3))
    state = first.state_dict()
    del first
    gc.collect()
    before, mapped = set(multiprocessing.active_children()), set(rings._mapped)
    loader = tidal.DataLoader(ds, num_workers=2)
    wait_until_read(log)
    killed = set(multiprocessing.active_children()) - before
    segments = set(rings._mapped) - mapped
    assert len(killed) == 2 and len(segments) == 2
    loader.load_state_dict(state)
    deadline = time.monotonic() + PATIENCE_S
    while any(p.is_alive() for p in killed) or segments & set(rings._mapped):
        assert time.monotonic() < deadline, "the killed workers or their shared memory are still there"
        time.sleep(0.01)
    assert all(p.exitcode is not None for p in killed)
    assert len(set(rings._mapped) - mapped) == 2  # the resumed pass's own
    assert head + ids(loader) == full


EXITS = """
import os, signal, sys, time
import tidal
loader = tidal.DataLoader(tidal.Dataset(sys.argv[1]).shuffle(seed=1).repeat().batch(5), num_workers=2)
time.sleep(1.0)  # the workers are reading; no next(), ever
print(" ".join(str(p.pid) for p in __import__("multiprocessing").active_children()), flush=True)
if sys.argv[2] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.slow
@pytest.mark.parametrize("how", ["exit", "kill"])
def test_a_loader_never_iterated_leaves_nothing_at_exit(data: Path, tmp_path: Path, how: str) -> None:
    """Its process exits (or is killed) with the workers reading: no worker, no segment of shared
    memory is left, and nothing is printed."""
    script = tmp_path / "exits.py"
    script.write_text(EXITS)
    printed, errors = tmp_path / "out.txt", tmp_path / "err.txt"
    with printed.open("w") as out, errors.open("w") as err:  # not pipes: a worker left behind holds them open
        proc = subprocess.Popen([sys.executable, str(script), str(data), how], stdout=out, stderr=err)
        code = proc.wait(timeout=300)
    assert code == (0 if how == "exit" else -9), errors.read_text()[-3000:]
    pids = [int(p) for p in printed.read_text().split()]
    assert len(pids) == 2
    mine = f"psm_tidal_{proc.pid}_"
    deadline = time.monotonic() + 30  # killed: the workers see their training process gone within seconds
    while time.monotonic() < deadline and (
        any(procs.alive(p) for p in pids) or any(n.startswith(mine) for n in os.listdir("/dev/shm"))
    ):
        time.sleep(0.2)
    assert not [p for p in pids if procs.alive(p)]
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(mine)]
    if how == "exit":
        assert errors.read_text() == ""


def test_a_loader_without_workers_leaves_the_start_method_to_the_script(data: Path) -> None:
    """Built (and so started early) and read, a loader with no workers has not fixed the default
    start method: the script may still set it, as it could before."""
    script = (
        "import multiprocessing, sys, tidal\n"
        "loader = tidal.DataLoader(tidal.Dataset(sys.argv[1]).batch(4), num_workers=0)\n"
        "next(iter(loader))\n"
        "multiprocessing.set_start_method('spawn')\n"
        "print(multiprocessing.get_start_method())\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(data)], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout) == (0, "spawn\n"), done.stderr[-3000:]


GROUP = """
import json, sys
import torch.distributed as dist
import tidal
data, out, rank, init = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
loader = tidal.DataLoader(tidal.Dataset(data).shuffle(seed=5, block_size=32).batch(4), num_workers=2)
dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)  # after the build
got = [b["id"].tolist() for b in loader]
json.dump(got, open(out, "w"))
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_a_process_group_initialized_after_the_build_sets_the_ranks(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Processes started without RANK/WORLD_SIZE (as torch.multiprocessing.spawn starts them) build
    their loader as one process each, then join a process group: each reads its rank's share."""
    script = tmp_path / "group.py"
    script.write_text(GROUP)
    env = {k: v for k, v in procs.child_env(tmp_path / "cache").items() if k not in ("RANK", "WORLD_SIZE")}
    init = f"file://{tmp_path / 'rendezvous'}"
    commands = [
        procs.Command(
            f"rank {r}", [sys.executable, str(script), str(data), str(tmp_path / f"{r}.json"), str(r), init], env
        )
        for r in (0, 1)
    ]
    procs.run(commands, timeout=300)
    got = [json.loads((tmp_path / f"{r}.json").read_text()) for r in (0, 1)]
    ds = tidal.Dataset(data).shuffle(seed=5, block_size=32).batch(4)
    monkeypatch.setenv("WORLD_SIZE", "2")
    for r in (0, 1):
        monkeypatch.setenv("RANK", str(r))
        assert got[r] == ids(tidal.DataLoader(ds, num_workers=2, start_early=False))


@pytest.mark.parametrize("workers", [0, 2])
def test_the_jax_loader_reads_once_built_and_once_given_a_state(data: Path, tmp_path: Path, workers: int) -> None:
    jax = pytest.importorskip("jax")
    import tidal.jax

    jax.devices()  # JAX's backends run: the processes can be asked for without starting them
    log = tmp_path / "read.log"
    ds = chain(data, log)
    full = ids(tidal.jax.Loader(ds, num_workers=workers, start_early=False))
    log.unlink()
    loader = tidal.jax.Loader(ds, num_workers=workers)
    wait_until_read(log)
    stop = len(full) * 3 // 4
    head = ids(itertools.islice(loader, stop))
    state = loader.state_dict()
    assert head == full[:stop]
    resumed = tidal.jax.Loader(ds, num_workers=workers)
    resumed.load_state_dict(state)
    wait_until_read(log, set(full[stop]))
    assert ids(resumed) == full[stop:]


def test_a_jax_loader_dropped_unused_stops_its_readers(data: Path, tmp_path: Path) -> None:
    jax = pytest.importorskip("jax")
    import threading

    import tidal.jax

    jax.devices()
    log = tmp_path / "read.log"
    loader = tidal.jax.Loader(chain(data, log), num_workers=2)
    wait_until_read(log)
    del loader
    gc.collect()
    deadline = time.monotonic() + PATIENCE_S  # threads end after the bundle they are making
    while any(t.name.startswith(("tidal-reader", "tidal-jax")) for t in threading.enumerate()):
        assert time.monotonic() < deadline, [t.name for t in threading.enumerate()]
        time.sleep(0.05)


def reported(error: tidal.TidalError, log: str) -> None:
    """An ``errors=`` function: notes where each bad record is, and skips it."""
    with open(log, "a") as f:
        f.write(f"{Path(error.path).name}:{error.row}\n")  # type: ignore[attr-defined]


def messy(root: Path) -> Path:
    """4 JSON lines files of 30 records, every 7th line of each not JSON."""
    root.mkdir()
    for f in range(4):
        lines = [f'{{"id": {f * 100 + i}}}' if i % 7 != 3 else "not json" for i in range(30)]
        (root / f"part-{f}.jsonl").write_text("\n".join(lines) + "\n")
    return root


@pytest.mark.parametrize("how", ["workers0", "fork", "jax"])
def test_bad_data_is_reported_as_by_a_loader_started_when_iterated(tmp_path: Path, how: str) -> None:
    """A loader started at build and given a state reports (to its errors= function) the bad
    records from the state on, not those its first start met at the beginning of the epoch."""
    log = tmp_path / "errors.log"
    ds = tidal.Dataset(messy(tmp_path / "data"), errors=functools.partial(reported, log=str(log)))
    ds = ds.shuffle(seed=1, block_size=16).batch(2)
    if how == "jax":
        pytest.importorskip("jax").devices()
        jax_loader = pytest.importorskip("tidal.jax")

    def make(start_early: bool) -> Any:
        if how == "jax":
            return jax_loader.Loader(ds, num_workers=2, start_early=start_early)
        return tidal.DataLoader(ds, num_workers=0 if how == "workers0" else 2, start_early=start_early)

    first = make(start_early=False)
    it = iter(first)
    list(itertools.islice(it, 20))
    state = first.state_dict()
    it.close()  # type: ignore[attr-defined]  # its readers read ahead, reporting what they meet: stopped (JAX's
    # threads would go on after the bundle they are making if only dropped, into the log read below)

    def reports(start_early: bool) -> list[str]:
        log.unlink()
        loader = make(start_early)
        if start_early:
            time.sleep(1.0)  # the start at build meets the bad records of the epoch's first blocks
        loader.load_state_dict(state)
        list(loader)
        return sorted(log.read_text().split())

    assert reports(start_early=True) == reports(start_early=False)


def test_a_loader_started_early_pickles_and_copies_as_one_that_did_not(data: Path, tmp_path: Path) -> None:
    """Frameworks copy loaders (deepcopy, pickle): the copy starts its own workers when iterated."""
    import copy
    import pickle

    ds = chain(data, tmp_path / "read.log")
    plain = ids(tidal.DataLoader(ds, num_workers=2, start_early=False))
    loader = tidal.DataLoader(ds, num_workers=2)
    assert ids(pickle.loads(pickle.dumps(loader))) == ids(copy.deepcopy(loader)) == ids(loader) == plain
    jax = pytest.importorskip("jax")
    jax_loader = pytest.importorskip("tidal.jax")
    jax.devices()
    started = jax_loader.Loader(ds, num_workers=2)
    assert ids(pickle.loads(pickle.dumps(started))) == ids(started) == plain
    assert ids(pickle.loads(pickle.dumps(started))) == ids(started)  # iterated too: both read the next epoch
