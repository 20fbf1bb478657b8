"""tidal.DataLoader: batches as tensors, exact state with workers running ahead."""

from __future__ import annotations

import functools
import itertools
import json
import multiprocessing
import os
import pickle
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import make_shards

import tidal
from tidal.testing import same


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return make_shards(tmp_path / "data", [40, 75, 13, 60, 52, 33, 90, 17])


def ids(batches: list[dict]) -> list[list[int]]:
    return [b["id"].tolist() for b in batches]


@pytest.mark.parametrize("workers", [0, 1, 2, 3])
def test_state_restores_batch_for_batch_with_workers_running_ahead(data: Path, workers: int) -> None:
    ds = tidal.Dataset(data).shuffle(seed=1, block_size=32).repeat(2).batch(6)
    full = list(tidal.DataLoader(ds, num_workers=workers))
    for stop in (1, 7, len(full) // 2, len(full) - 1):
        loader = tidal.DataLoader(ds, num_workers=workers)
        consumed = list(itertools.islice(loader, stop))
        state = json.loads(json.dumps(loader.state_dict()))
        resumed = tidal.DataLoader(ds, num_workers=workers)
        resumed.load_state_dict(state)
        rest = list(resumed)
        assert ids(consumed + rest) == ids(full), f"resumed after {stop} of {len(full)}"
        assert all(same(a["text"], b["text"]) for a, b in zip(rest, full[stop:], strict=True))


def test_batches_are_tensors_and_lists(data: Path) -> None:
    batch = next(iter(tidal.DataLoader(tidal.Dataset(data).batch(4), num_workers=2)))
    assert isinstance(batch["id"], torch.Tensor) and batch["id"].dtype == torch.int64
    assert batch["id"].shape == (4,) and isinstance(batch["text"], list) and len(batch["text"]) == 4


def test_every_record_once_across_workers_and_the_last_partial_batch(data: Path) -> None:
    ds = tidal.Dataset(data).shuffle(seed=2)
    got = [i for b in tidal.DataLoader(ds, num_workers=3, batch_size=8) for i in b["id"].tolist()]
    # 380 records over 3 workers: 126 each, the last 2 positions are the documented remainder
    assert len(got) == len(set(got)) == 3 * (380 // 3)


def test_unbatched_records_pass_through_workers(data: Path) -> None:
    records = list(tidal.DataLoader(tidal.Dataset(data), num_workers=2))
    assert sorted(r["id"] for r in records) == list(range(380))


def test_state_is_small_and_json(data: Path) -> None:
    loader = tidal.DataLoader(tidal.Dataset(data).shuffle(seed=0).repeat().batch(4), num_workers=2)
    for _ in itertools.islice(loader, 500):
        pass
    text = json.dumps(loader.state_dict())
    assert len(text) < 2000


def test_each_pass_over_the_loader_is_the_next_epoch(data: Path) -> None:
    source = tidal.Dataset(data).shuffle(seed=4)
    loader = tidal.DataLoader(source.batch(10), num_workers=2)
    first, second = ids(list(loader)), ids(list(loader))
    assert first != second and sorted(i for b in first for i in b) == sorted(i for b in second for i in b)
    # 190 records per worker: 19 whole batches each, so the epochs do not share a batch
    two_epochs = ids(list(tidal.DataLoader(source.repeat(2).batch(10), num_workers=2)))
    assert first + second == two_epochs


def test_persistent_workers_follow_the_state(data: Path) -> None:
    ds = tidal.Dataset(data).shuffle(seed=5).repeat(2).batch(5)
    full = ids(list(tidal.DataLoader(ds, num_workers=2)))
    loader = tidal.DataLoader(ds, num_workers=2, persistent_workers=True)
    head = ids(list(itertools.islice(loader, 11)))
    rest = ids(list(loader))  # a new iter() continues where the loop stopped
    assert head + rest == full


def test_a_state_for_other_data_is_refused(data: Path) -> None:
    ds = tidal.Dataset(data).shuffle(seed=5).batch(5)
    loader = tidal.DataLoader(ds, num_workers=2)
    next(iter(loader))
    state = loader.state_dict()
    with pytest.raises(tidal.StateError, match="different dataset"):
        tidal.DataLoader(tidal.Dataset(data).shuffle(seed=6).batch(5), num_workers=2).load_state_dict(state)


def test_arguments_that_would_reorder_or_rebatch_are_refused(data: Path) -> None:
    ds = tidal.Dataset(data).batch(4)
    with pytest.raises(ValueError, match="already batched"):
        tidal.DataLoader(ds, batch_size=4)
    with pytest.raises(ValueError, match="shuffle= does not apply"):
        tidal.DataLoader(tidal.Dataset(data), shuffle=True)


def test_a_bad_record_in_a_worker_raises_naming_file_and_line(tmp_path: Path) -> None:
    make_shards(tmp_path / "data", [20, 20])
    with (tmp_path / "data" / "part-000.jsonl").open("a") as f:
        f.write('{"id": 99, "text": \n')
    loader = tidal.DataLoader(tidal.Dataset(tmp_path / "data").batch(4), num_workers=2)
    with pytest.raises(tidal.RecordError, match=r"part-000.jsonl, line 21: malformed JSON"):
        list(loader)


def test_prefetch_to_device_changes_no_batch_and_no_state(data: Path) -> None:
    ds = tidal.Dataset(data).shuffle(seed=3, block_size=32).repeat(2).batch(6)
    plain = list(tidal.DataLoader(ds, num_workers=2))
    ahead = list(tidal.DataLoader(ds, num_workers=2, device="cpu", prefetch_to_device=3))
    assert len(ahead) == len(plain) and all(same(a, b) for a, b in zip(ahead, plain, strict=True))
    loader = tidal.DataLoader(ds, num_workers=2, device="cpu", prefetch_to_device=3)
    head = list(itertools.islice(loader, 7))  # the thread has made batches 8.. already: not consumed
    resumed = tidal.DataLoader(ds, num_workers=2, device="cpu", prefetch_to_device=3)
    resumed.load_state_dict(json.loads(json.dumps(loader.state_dict())))
    assert ids(head + list(resumed)) == ids(plain)


def slowly(record: dict) -> dict:
    time.sleep(0.02)  # the read-ahead thread spends its time waiting on the workers
    return record


def test_a_loop_that_breaks_off_stops_the_read_ahead_thread_and_the_workers(data: Path) -> None:
    ds = tidal.Dataset(data).map(slowly).batch(2)
    before = set(multiprocessing.active_children())
    for _ in range(3):
        loader = tidal.DataLoader(ds, num_workers=2, device="cpu", prefetch_to_device=2)
        it = iter(loader)
        assert len(list(itertools.islice(it, 2))) == 2
        it.close()  # what dropping it does; stopped the workers first, the thread waited on them for ever
        assert set(multiprocessing.active_children()) <= before


def logged_by_worker(record: dict, log: str) -> dict:
    """Appends the DataLoader worker that reads ``record`` and its process to the file ``log``,
    a line a record."""
    with open(log, "a") as f:
        f.write(f"{tidal.World.current().worker} {os.getpid()}\n")
    time.sleep(0.003)
    return record


def _warmed_in_order(log: Path, order: list[int], batch: int, pids: set[int] | None = None) -> None:
    """Each worker of ``order`` read its first record only once the one before had read a batch
    (of the workers ``pids`` only, where given)."""
    lines = [line.split() for line in log.read_text().splitlines()]
    seen = [int(w) for w, pid in lines if pids is None or int(pid) in pids]
    for before, after in itertools.pairwise(order):
        first = seen.index(after)
        assert seen[:first].count(before) >= batch, (order, seen[: first + 1])


@pytest.mark.parametrize("context", ["fork", "spawn", "forkserver"])
def test_workers_beyond_the_cores_warm_up_in_the_order_the_loop_asks_for_them(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, context: str
) -> None:
    """With one worker warming up at a time (``TIDAL_WARMUP_WORKERS=1``), worker k reads nothing
    until worker k-1 has made its first batch, from the worker the loop asks first, after a
    resume too; the batches are those of workers started all at once."""
    log = tmp_path / "workers.log"
    ds = tidal.Dataset(data).shuffle(seed=2, block_size=40).map(functools.partial(logged_by_worker, log=str(log)))
    ds = ds.batch(4)
    plain = ids(tidal.DataLoader(ds, num_workers=4))
    monkeypatch.setenv("TIDAL_WARMUP_WORKERS", "1")
    log.unlink()
    loader = tidal.DataLoader(ds, num_workers=4, multiprocessing_context=context)
    it = iter(loader)
    head = ids(list(itertools.islice(it, 3)))
    state = loader.state_dict()
    assert head + ids(list(it)) == plain
    _warmed_in_order(log, [0, 1, 2, 3], 4)
    pickle.dumps(loader)  # the gate is the pass's, not the loader's: it still pickles (as its workers receive it)
    if context != "fork":  # the gate crossed to spawned workers; the resumed order is the same with fork
        return
    resumed = tidal.DataLoader(ds, num_workers=4, multiprocessing_context=context)
    built = {p.pid for p in multiprocessing.active_children()}
    resumed.load_state_dict(state)  # the workers started as it was built are killed: those from the state go on
    workers = {p.pid for p in multiprocessing.active_children()} - built  # (the killed ones are reaped in a thread)
    assert len(workers) >= 4  # started as the state was given, before iter()
    assert head + ids(list(resumed)) == plain
    _warmed_in_order(log, [3, 0, 1, 2], 4, pids=workers)


def test_a_worker_waiting_for_its_turn_to_warm_up_opens_its_reader_when_it_comes(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Worker k makes its reader (the dataset's iterator) only once worker k-1 has made its first
    batch: not while the training process forks the rest and the first workers read."""
    log = tmp_path / "workers.log"
    ds = tidal.Dataset(data).shuffle(seed=2, block_size=40).map(functools.partial(logged_by_worker, log=str(log)))
    ds = ds.batch(4)
    plain = ids(tidal.DataLoader(ds, num_workers=4))
    log.unlink()
    real = tidal.Dataset.iterator

    def iterator(self: tidal.Dataset, *args: Any, **kwargs: Any) -> Any:
        with open(log, "a") as f:
            f.write(f"open {os.getpid()}\n")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(tidal.Dataset, "iterator", iterator)  # (forked workers have it)
    monkeypatch.setenv("TIDAL_WARMUP_WORKERS", "1")
    assert ids(tidal.DataLoader(ds, num_workers=4, multiprocessing_context="fork")) == plain
    lines = [line.split() for line in log.read_text().splitlines()]
    worker_of = {pid: int(w) for w, pid in lines if w != "open"}
    read_before: dict[int, int] = {}  # per worker: the records of the worker before it read before it opened
    for i, (what, pid) in enumerate(lines):
        if what == "open" and worker_of[pid] > 0:
            before = str(worker_of[pid] - 1)
            read_before[worker_of[pid]] = sum(1 for w, _ in lines[:i] if w == before)
    assert sorted(read_before) == [1, 2, 3]
    assert all(n >= 4 for n in read_before.values()), read_before


def held_but_for(record: dict, reader: int, released: str) -> dict:
    """``record``, once the file ``released`` exists, but in ``reader`` (a DataLoader worker's reader)."""
    deadline = time.monotonic() + 120
    while tidal.World.current().worker != reader and not os.path.exists(released) and time.monotonic() < deadline:
        time.sleep(0.01)
    return record


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_a_resumed_loader_s_first_batch_waits_on_no_other_worker(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, context: str
) -> None:
    """Resumed where the loop continues with worker 3 of 4, its first batch comes while workers 0,
    1 and 2 are held (torch asks its workers from its worker 0, which runs reader 3 then), from
    workers started all at once too; the reader tidal.World.current() names in each is the
    state's: the batches are those of a run never stopped."""
    released = tmp_path / "released"
    released.touch()
    hold = functools.partial(held_but_for, reader=3, released=str(released))
    ds = tidal.Dataset(data).shuffle(seed=4, block_size=40).map(hold).batch(4)
    plain = ids(tidal.DataLoader(ds, num_workers=4))
    loader = tidal.DataLoader(ds, num_workers=4)
    head = ids(list(itertools.islice(loader, 7)))  # the loop continues with worker 3
    state = loader.state_dict()
    del loader
    for warm in ("1", "4"):
        monkeypatch.setenv("TIDAL_WARMUP_WORKERS", warm)
        released.unlink()
        timer = threading.Timer(60, released.touch)  # held for good, the first batch would come after it
        timer.start()
        try:
            resumed = tidal.DataLoader(ds, num_workers=4, multiprocessing_context=context)
            resumed.load_state_dict(state)
            it = iter(resumed)
            first = ids([next(it)])
            assert not released.exists(), f"the first batch waited for the held workers (warm-up {warm})"
        finally:
            timer.cancel()
        released.touch()
        assert head + first + ids(list(it)) == plain, f"warm-up {warm}"


FORKSERVER = """
import sys
from multiprocessing import forkserver
import tidal
loader = tidal.DataLoader(tidal.Dataset(sys.argv[1]).batch(4), num_workers=2, multiprocessing_context="forkserver")
assert len(next(iter(loader))["id"]) == 4
server = forkserver._forkserver._forkserver_pid
maps = open(f"/proc/{server}/maps").read()
print("libtorch" in maps, "mtrand" in maps)  # numpy.random's extension: what every reader imports on first use
"""


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads the forkserver's memory map in /proc")
def test_a_forkserver_forks_workers_with_torch_already_imported(data: Path) -> None:
    """The forkserver (Python 3.14's default start method) imports torch before it forks the
    workers: they start from it, not by importing it each at once, as spawned ones do."""
    out = subprocess.run([sys.executable, "-c", FORKSERVER, str(data)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "True True", out.stdout


FORKED = """
import sys
import tidal

def modules(record):
    return {"id": id(sys.modules.get("numpy.random")), "pack": id(sys.modules.get("tidal.stages.pack"))}

if __name__ == "__main__":
    assert "numpy.random" not in sys.modules and "tidal.stages.pack" not in sys.modules
    loader = tidal.DataLoader(tidal.Dataset(sys.argv[1]).map(modules).batch(4), num_workers=2)
    batches = list(loader)[2:]  # each worker's batches after its first: its metrics have looked for pack()
    got = {(i, p) for b in batches for i, p in zip(b["id"].tolist(), b["pack"].tolist())}
    print(got == {(id(sys.modules["numpy.random"]), id(sys.modules["tidal.stages.pack"]))})
"""


def test_forked_workers_find_what_every_reader_imports_imported_before_the_fork(data: Path) -> None:
    """numpy.random (the shuffle's generator) and tidal.stages.pack (the loader's metrics look for
    pack()) are imported once in the training process before it forks the workers, not once in
    each worker (85 ms of CPU time with numpy.ma)."""
    out = subprocess.run([sys.executable, "-c", FORKED, str(data)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "True", out.stdout


KILLED = """
import multiprocessing, os, signal, sys
import tidal
if __name__ == "__main__":
    ds = tidal.Dataset(sys.argv[1]).batch(4)
    if sys.argv[2] == "jax":  # tidal.jax.Loader's spawned reader processes
        import tidal.jax
        loader = tidal.jax.Loader(ds, num_workers=2, worker_type="process")
    else:
        loader = tidal.DataLoader(ds, num_workers=2, multiprocessing_context=sys.argv[2])
    it = iter(loader)
    next(it)
    print(" ".join(str(p.pid) for p in multiprocessing.active_children()), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("context", ["fork", "spawn", "forkserver", "jax"])
def test_workers_exit_when_the_training_process_is_killed(data: Path, tmp_path: Path, context: str) -> None:
    """A training process killed (SIGKILL: the OOM killer) leaves no worker behind. A forkserver's
    workers, whose parent is the server, ran for ever before, each holding its memory."""
    from tidal.transport.orphans import alive

    script = tmp_path / "killed.py"
    script.write_text(KILLED)
    printed, errors = tmp_path / "out.txt", tmp_path / "err.txt"
    with printed.open("w") as out, errors.open("w") as err:  # not pipes: a worker left behind holds them open
        code = subprocess.run([sys.executable, str(script), str(data), context], stdout=out, stderr=err, timeout=300)
    assert code.returncode == -9, errors.read_text()[-3000:]
    pids = [int(p) for p in printed.read_text().split()]
    assert len(pids) == 2
    deadline = time.monotonic() + 30
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [p for p in pids if alive(p)]
    for p in left:
        os.kill(p, 9)
    assert not left, f"workers {left} outlived their training process ({context})"


PACKED = """
import numpy as np
from tidal.formats.tokens import TokenWriter

rng = np.random.default_rng(0)
with TokenWriter({tokens!r}) as w:
    for _ in range(3000):
        w.write(rng.integers(0, 60_000, int(rng.integers(50, 2000))))
ds = tidal.Dataset({tokens!r}).shuffle(seed=1).repeat().pack(1024).batch(8)
"""


@pytest.mark.parametrize("batches", ["records", "packed"])
def test_a_loop_left_unfinished_at_exit_prints_nothing(data: Path, tmp_path: Path, batches: str) -> None:
    """The loop's generator is closed while Python shuts down, after module globals are gone;
    packed batches also trim the buffers their bundles were copied into (tidal.transport.recycle),
    which ran after ``sys`` was None."""
    if batches == "records":
        dataset, steps = f"ds = tidal.Dataset({str(data)!r}).repeat().batch(4)\n", 1
    else:
        dataset, steps = PACKED.format(tokens=str(tmp_path / "tok")), 300
    script = (
        "import tidal, sys\n"
        + dataset
        + "it = iter(tidal.DataLoader(ds, num_workers=2))\n"
        + f"for _ in range({steps}):\n    next(it)\n"
        + "print('read', flush=True)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout == "read\n", done.stderr
    assert done.stderr == ""


def test_a_same_topology_restore_after_an_elastic_one_continues_exactly(data: Path) -> None:
    """2 workers -> 3 (elastic) -> 3 (exact): the second restore keeps the first one's origin."""
    ds = tidal.Dataset(data).shuffle(seed=7, block_size=32).repeat(2).batch(4)
    first = tidal.DataLoader(ds, num_workers=2)
    head = ids(list(itertools.islice(first, 9)))
    elastic = tidal.DataLoader(ds, num_workers=3)
    elastic.load_state_dict(json.loads(json.dumps(first.state_dict())))
    middle = ids(list(itertools.islice(elastic, 7)))
    saved = json.loads(json.dumps(elastic.state_dict()))
    straight = ids(list(elastic))  # the 3-worker loader, uninterrupted
    again = tidal.DataLoader(ds, num_workers=3)
    again.load_state_dict(saved)
    assert ids(list(again)) == straight
    seen = [i for b in head + middle + straight for i in b]
    assert max(Counter(seen).values()) <= 2  # two epochs: nothing read more than once per epoch


def test_stats_count_what_the_loop_consumed_and_log_a_line(data: Path, caplog: pytest.LogCaptureFixture) -> None:
    import logging
    import time

    loader = tidal.DataLoader(tidal.Dataset(data).shuffle(seed=1).repeat().batch(4), num_workers=2, log_every=0.05)
    with caplog.at_level(logging.INFO, logger="tidal"):
        for _ in itertools.islice(loader, 40):
            time.sleep(0.005)  # a training step
    stats = loader.stats()
    assert stats["batches"] == 40 and stats["seconds"] > 0.2
    assert 0 <= stats["wait_share"] < 1 and stats["wait_s"] <= stats["seconds"]
    assert stats["rows_read"] >= 160 and stats["skipped"] == 0
    assert any(r.getMessage().startswith("tidal: ") and "batches/s" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_a_tidal_error_in_a_worker_is_raised_as_itself_its_message_first(tmp_path: Path, context: str) -> None:
    (tmp_path / "bad.jsonl").write_text('{"id": 1}\n{"id": 2}\nnot json\n{"id": 4}\n')
    loader = tidal.DataLoader(
        tidal.Dataset(tmp_path / "bad.jsonl").batch(1), num_workers=2, multiprocessing_context=context
    )
    with pytest.raises(tidal.RecordError) as err:
        list(loader)
    assert str(err.value).startswith(f"{tmp_path / 'bad.jsonl'}, line 3: malformed JSON record")
    assert "Caught" not in str(err.value) and "Traceback" not in str(err.value)
    assert err.value.__notes__ == ["(raised in DataLoader worker 1)"]  # line 3 is in worker 1's half
