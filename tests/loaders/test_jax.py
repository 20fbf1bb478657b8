"""tidal.jax.Loader: global jax.Array batches with the guarantees tidal.DataLoader gives.

In this process (one JAX process, CPU): batches are global arrays, identical with and without
background readers (threads or spawned processes) and device prefetch, and the state restores
batch for batch whatever has been read ahead; the state is tidal.DataLoader's (``tidal state``
tools work on it); no torch is needed. Across real processes (``tests/distributed/run_jax.py``,
two JAX processes on CPU joined by ``jax.distributed.initialize``, two devices each): every global
batch is assembled from the processes' distinct slices, the epoch is read exactly once bar the
documented remainder, a restore continues exactly, a restore on one process of a state saved by
two loses and repeats nothing, and a pass that ends unevenly ends on the same step everywhere.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from conftest import make_shards

jax = pytest.importorskip("jax")

import tidal  # noqa: E402
import tidal.jax  # noqa: E402
from tidal.world import World  # noqa: E402

SCRIPT = Path(__file__).parents[1] / "distributed" / "run_jax.py"
TIMEOUT = 90
SIZES = [37, 23, 51, 9, 30, 13]  # 163 records: 4 readers of 40 (10 batches of 4 each), 3 positions left over
SHUFFLE = {"seed": 7, "block_size": 32, "shards_per_block": 2}
BATCH = 4
STEPS = 7  # batches before the save, per process


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return make_shards(tmp_path / "data", [40, 75, 13, 60, 52, 33, 90, 17])


def ids(batches: list[dict]) -> list[list[int]]:
    return [np.asarray(b["id"]).tolist() for b in batches]


# -- one process ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("workers", "prefetch"), [(0, 0), (2, 0), (2, 3), (3, 1)])
def test_state_restores_batch_for_batch_whatever_was_read_ahead(data: Path, workers: int, prefetch: int) -> None:
    ds = tidal.Dataset(data).shuffle(seed=1, block_size=32).repeat(2).batch(6)
    full = list(tidal.jax.Loader(ds, num_workers=workers, prefetch=prefetch))
    plain = list(tidal.jax.Loader(ds, num_workers=workers, prefetch=0))
    assert ids(full) == ids(plain) and [b["text"] for b in full] == [b["text"] for b in plain]  # prefetch: same batches
    for stop in (1, 7, len(full) - 1):
        loader = tidal.jax.Loader(ds, num_workers=workers, prefetch=prefetch)
        head = list(itertools.islice(loader, stop))
        state = json.loads(json.dumps(loader.state_dict()))
        resumed = tidal.jax.Loader(ds, num_workers=workers, prefetch=prefetch)
        resumed.load_state_dict(state)
        assert ids(head + list(resumed)) == ids(full), f"resumed after {stop} of {len(full)}"


def test_batches_are_global_arrays_text_stays_a_list(data: Path) -> None:
    ds = tidal.Dataset(data).batch(4)
    with tidal.jax.Loader(ds) as loader:
        batch = next(iter(loader))
    assert isinstance(batch["id"], jax.Array) and batch["id"].shape == (4,) and batch["id"].dtype == np.int32
    assert batch["id"].sharding.is_equivalent_to(tidal.jax.data_sharding(), 1)
    assert batch["text"] == [f"record {i} of shard 0" for i in range(4)]


def test_token_ids_arrive_as_int32_and_the_sharding_is_used(data: Path) -> None:
    def tokens(record: dict) -> dict:
        return {"input_ids": np.full(5, record["id"], np.uint16)}

    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("batch",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("batch", None))
    batch = next(iter(tidal.jax.Loader(tidal.Dataset(data).map(tokens), sharding, batch_size=3)))
    assert batch["input_ids"].dtype == np.int32 and batch["input_ids"].shape == (3, 5)
    assert batch["input_ids"].sharding == sharding


def test_each_pass_reads_the_next_epoch_and_a_new_iter_continues(data: Path) -> None:
    source = tidal.Dataset(data).shuffle(seed=4)
    loader = tidal.jax.Loader(source.batch(10), num_workers=2)
    first = ids(list(loader))
    head = ids(list(itertools.islice(loader, 5)))
    rest = ids(list(loader))  # a new iter() goes on from the last batch consumed
    assert first + head + rest == ids(list(tidal.jax.Loader(source.repeat(2).batch(10), num_workers=2)))


@pytest.mark.slow
def test_spawned_reader_processes_give_the_same_batches_and_state(data: Path) -> None:
    ds = tidal.Dataset(data).shuffle(seed=2, block_size=32).repeat(2).batch(5)
    full = ids(list(tidal.jax.Loader(ds, num_workers=2)))
    loader = tidal.jax.Loader(ds, num_workers=2, worker_type="process")
    head = ids(list(itertools.islice(loader, 9)))
    state = loader.state_dict()
    loader.close()
    resumed = tidal.jax.Loader(ds, num_workers=2, worker_type="process", prefetch=0)
    resumed.load_state_dict(state)
    assert head + ids(list(resumed)) == full


def test_the_state_is_the_torch_loaders_and_tidal_state_tools_work_on_it(data: Path) -> None:
    pytest.importorskip("torch")
    ds = tidal.Dataset(data).shuffle(seed=3, block_size=32).repeat(2).batch(6)
    full = ids(list(tidal.jax.Loader(ds, num_workers=2)))
    torch_loader = tidal.DataLoader(ds, num_workers=2)
    head = [b["id"].tolist() for b in itertools.islice(torch_loader, 5)]
    state = torch_loader.state_dict()
    assert head == full[:5]
    jax_loader = tidal.jax.Loader(ds, num_workers=2)
    jax_loader.load_state_dict(state)  # a torch loader's state restores here, and back
    assert ids(list(itertools.islice(jax_loader, 5))) == full[5:10]
    state = jax_loader.state_dict()
    assert "consumed: 10 batches" in tidal.state.show(state)
    skipped = tidal.jax.Loader(ds, num_workers=2)
    skipped.load_state_dict(tidal.state.skip(state, batches=7))
    assert ids(list(skipped)) == full[17:]


def test_a_bad_record_in_a_reader_raises_in_the_loop(tmp_path: Path) -> None:
    make_shards(tmp_path / "data", [20, 20])
    with (tmp_path / "data" / "part-000.jsonl").open("a") as f:
        f.write('{"id": 99, "text": \n')
    loader = tidal.jax.Loader(tidal.Dataset(tmp_path / "data").batch(4), num_workers=2)
    with pytest.raises(tidal.RecordError, match=r"part-000.jsonl, line 21: malformed JSON"):
        list(loader)


def test_what_cannot_make_global_arrays_is_refused(data: Path) -> None:
    with pytest.raises(ValueError, match=r"end the dataset with .batch\(n\)"):
        tidal.jax.Loader(tidal.Dataset(data))
    uneven = tidal.jax.Loader(tidal.Dataset(data).batch(7, drop_last=False), num_workers=0)
    with pytest.raises(tidal.TidalError, match=r"column 'id': a batch of shape \(2,\) where 7 rows"):
        list(uneven)  # 380 records: the last batch has 2


def test_a_function_that_does_not_pickle_is_named_before_reader_processes_start(data: Path) -> None:
    loader = tidal.jax.Loader(tidal.Dataset(data).map(lambda r: r).batch(4), worker_type="process")
    with pytest.raises(tidal.ArgumentError, match=r"<lambda>\): tidal.jax.Loader workers started with 'spawn'"):
        iter(loader)


def test_the_rank_comes_from_jax_only_once_it_runs_as_several_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []

    def fake_jax(initialized: bool) -> SimpleNamespace:
        def count() -> int:
            asked.append("process_count")
            return 4

        distributed = SimpleNamespace(is_initialized=lambda: initialized)
        return SimpleNamespace(distributed=distributed, process_count=count, process_index=lambda: 3)

    monkeypatch.setitem(sys.modules, "jax._src.xla_bridge", SimpleNamespace(backends_are_initialized=lambda: False))
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setitem(sys.modules, "jax", fake_jax(initialized=False))
    assert World.ranks() == World(1, 2) and asked == []  # not started: JAX is not even asked
    monkeypatch.setitem(sys.modules, "jax", fake_jax(initialized=True))
    assert World.ranks() == World(3, 4)
    monkeypatch.delitem(sys.modules, "jax")
    assert World.ranks() == World(1, 2)


def test_import_does_not_pull_in_torch(data: Path) -> None:
    code = (
        "import sys, tidal, tidal.jax\n"
        f"print(len(list(tidal.jax.Loader(tidal.Dataset({str(data)!r}).batch(8)))))\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=TIMEOUT)
    count, torch_modules = out.stdout.split("\n")[:2]
    assert int(count) > 0 and torch_modules == "[]"


def test_the_loader_works_with_torch_unimportable(data: Path) -> None:
    code = (
        "import itertools, json, sys\n"
        "sys.modules['torch'] = None\n"  # any import of torch now fails
        "import tidal, tidal.jax\n"
        f"ds = tidal.Dataset({str(data)!r}).shuffle(seed=0).repeat().batch(8)\n"
        "loader = tidal.jax.Loader(ds, num_workers=2)\n"
        "head = [b['id'].tolist() for b in itertools.islice(loader, 3)]\n"
        "state = json.loads(json.dumps(loader.state_dict()))\n"
        "resumed = tidal.jax.Loader(ds, num_workers=2)\n"
        "resumed.load_state_dict(state)\n"
        "rest = [b['id'].tolist() for b in itertools.islice(resumed, 2)]\n"
        "whole = [b['id'].tolist() for b in itertools.islice(tidal.jax.Loader(ds, num_workers=2), 5)]\n"
        "print(head + rest == whole)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=TIMEOUT)
    assert out.stdout.strip() == "True"


# -- several JAX processes --------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_processes(tmp_path: Path, name: str, jobs: list[dict], processes: int) -> Path:
    """Run ``jobs`` in ``processes`` JAX processes (two CPU devices each), each in its own session;
    on failure or timeout every process group is killed. Returns the output directory."""
    out = tmp_path / name
    out.mkdir()
    config = out / "config.json"
    data = tmp_path / "data"
    config.write_text(
        json.dumps({"data": str(data), "out": str(out), "jobs": jobs, "shuffle": SHUFFLE, "batch": BATCH})
    )
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "XLA_FLAGS")}
    env.update(
        JAX_PLATFORMS="cpu",
        XLA_FLAGS="--xla_force_host_platform_device_count=2",
        TIDAL_CACHE_DIR=str(tmp_path / "cache"),
        OMP_NUM_THREADS="1",
    )
    port = str(free_port())
    procs: list[tuple[subprocess.Popen, Path]] = []
    try:
        for p in range(processes):
            log = out / f"log-p{p}.txt"
            cmd = [sys.executable, str(SCRIPT), str(config), str(p), str(processes), port]
            with log.open("w") as f:
                procs.append(
                    (subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True), log)
                )
        deadline = time.monotonic() + TIMEOUT
        for p, (proc, log) in enumerate(procs):
            try:
                code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pytest.fail(f"process {p} did not finish in {TIMEOUT} s:\n{log.read_text()[-4000:]}")
            assert code == 0, f"process {p} failed ({code}):\n{log.read_text()[-4000:]}"
    finally:
        for proc, _ in procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return out


def result(out: Path, job: str, process: int) -> dict[str, Any]:
    return json.loads((out / f"{job}-p{process}.json").read_text())


def epoch_order(data: Path) -> list[int]:
    """The epoch's records in position order: the unsplit dataset, read in this process."""
    return [int(r["id"]) for r in tidal.Dataset(data).shuffle(**SHUFFLE)]


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """One run of two JAX processes: the whole epoch, a save and restore, an uneven pass."""
    tmp = tmp_path_factory.mktemp("jax2")
    make_shards(tmp / "data", SIZES)
    jobs = [{"name": "full"}, {"name": "resume", "steps": STEPS}, {"name": "uneven"}]
    return tmp, run_processes(tmp, "two", jobs, processes=2)


@pytest.mark.slow
def test_global_batches_join_distinct_slices_and_cover_the_epoch_once(two: tuple[Path, Path]) -> None:
    tmp, out = two
    runs = [result(out, "full", p) for p in range(2)]
    assert runs[0]["steps"] and [s["global"] for s in runs[0]["steps"]] == [s["global"] for s in runs[1]["steps"]]
    for s0, s1 in zip(runs[0]["steps"], runs[1]["steps"], strict=True):
        assert s0["global"] == s0["local"] + s1["local"]  # process p's rows are rows p*n..(p+1)*n
        assert not set(s0["local"]) & set(s1["local"])
    read = [i for s in runs[0]["steps"] for i in s["global"]]
    order = epoch_order(tmp / "data")
    assert len(read) == len(set(read)) == 4 * (len(order) // 4)
    assert set(order) - set(read) == set(order[-(len(order) % 4) :])  # the documented remainder


@pytest.mark.slow
def test_a_restore_on_the_same_processes_continues_exactly(two: tuple[Path, Path]) -> None:
    _, out = two
    full = [s["global"] for s in result(out, "full", 0)["steps"]]
    runs = [result(out, "resume", p) for p in range(2)]
    assert runs[0]["state"] == runs[1]["state"]  # gathered: every process saves the same dict
    assert runs[0]["state"]["topology"] == [2, 2] and all(runs[0]["state"]["ranks"])
    for run in runs:
        assert [s["global"] for s in run["steps"] + run["rest"]] == full
    assert "saved on 2 rank(s) x 2 worker(s)" in tidal.state.show(runs[0]["state"])


@pytest.mark.slow
def test_an_uneven_pass_ends_on_the_same_step_for_every_process(two: tuple[Path, Path]) -> None:
    tmp, out = two
    runs = [result(out, "uneven", p) for p in range(2)]
    kept = tidal.Dataset(tmp / "data").shuffle(**SHUFFLE).filter(lambda r: r["id"] < 60).batch(BATCH)
    per_process = [
        sum(len(list(kept.iterator(World(p, 2, w, 2)))) for w in range(2)) for p in range(2)
    ]  # batches each process has this pass
    assert per_process[0] != per_process[1], "the filter should leave the processes uneven"
    assert len(runs[0]["steps"]) == len(runs[1]["steps"]) == min(per_process)


@pytest.mark.slow
def test_a_restore_on_one_process_of_a_state_saved_by_two_loses_and_repeats_nothing(two: tuple[Path, Path]) -> None:
    tmp, out = two
    state = out / "state.json"
    one = run_processes(tmp, "one", [{"name": "restore", "state": str(state)}], processes=1)
    head = [i for s in result(out, "resume", 0)["steps"] for i in s["global"]]
    rest = [i for s in result(one, "restore", 0)["steps"] for i in s["global"]]
    assert not set(head) & set(rest) and len(rest) == len(set(rest))
    # the new readers (1 process x 2 workers) split what is left of the epoch, in position order, into
    # equal consecutive parts (the last len(left) % 2 positions unread); each yields whole batches of 4
    left = [i for i in epoch_order(tmp / "data") if i not in set(head)]
    q = len(left) // 2
    expected = [i for c in range(2) for i in left[c * q : c * q + q // BATCH * BATCH]]
    assert sorted(rest) == sorted(expected)
    assert result(one, "restore", 0)["state"]["topology"] == [1, 2]
