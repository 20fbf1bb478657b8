"""Spawned workers beyond the cores are sent their work in turn (tidal.transport.spawn_turns)."""

from __future__ import annotations

import functools
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import procs
import pytest
import torch
from conftest import make_shards

import tidal

pytestmark = pytest.mark.slow  # spawned workers import torch: seconds each


def logged(record: dict, log: str) -> dict:
    """A map that notes which torch worker read a record: a line per record, in the order made."""
    with open(log, "a") as f:
        f.write(f"read {torch.utils.data.get_worker_info().id}\n")
    return record


def started(worker: int, log: str) -> None:
    """A worker_init_fn: a line when torch's worker ``worker`` has imported and unpickled its work."""
    with open(log, "a") as f:
        f.write(f"init {worker}\n")


def ids(batches: list[dict]) -> list[list[int]]:
    return [b["id"].tolist() for b in batches]


def test_spawned_workers_beyond_the_cores_start_once_those_before_them_made_their_first_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """4 spawned workers on a rank that warms up 1 at a time: worker w starts (imports, runs its
    worker_init_fn) only once worker w - 1 has read its first batch; the batches are the forked
    workers'."""
    data = make_shards(tmp_path / "data", [30, 25, 41, 18, 33])
    log = tmp_path / "log.txt"
    ds = tidal.Dataset(data).shuffle(seed=3, block_size=24).map(functools.partial(logged, log=str(log))).batch(4)
    forked = ids(list(tidal.DataLoader(ds, num_workers=4, multiprocessing_context="fork")))
    log.unlink()
    monkeypatch.setenv("TIDAL_WARMUP_WORKERS", "1")
    loader = tidal.DataLoader(
        ds,
        num_workers=4,
        multiprocessing_context="spawn",
        worker_init_fn=functools.partial(started, log=str(log)),
    )
    assert ids(list(loader)) == forked
    lines = log.read_text().splitlines()
    for w in range(1, 4):
        assert lines.index(f"init {w}") > lines.index(f"read {w - 1}"), (w, lines[:12])


HELD = """
import functools, json, os, sys, time
import tidal
sys.path.insert(0, sys.argv[3])
from test_spawn_turns import logged, started

def children():
    out = []
    for pid in os.listdir("/proc"):
        try:
            stat = open(f"/proc/{pid}/stat").read()
        except OSError:
            continue
        if pid.isdigit() and int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid():
            if b"spawn_main" in open(f"/proc/{pid}/cmdline", "rb").read():  # (not the resource tracker)
                out.append(int(pid))
    return out

if __name__ == "__main__":
    data, log = sys.argv[1], sys.argv[2]
    ds = tidal.Dataset(data).map(functools.partial(logged, log=log)).batch(4)
    loader = tidal.DataLoader(ds, num_workers=4, multiprocessing_context="spawn",
                              worker_init_fn=functools.partial(started, log=log))  # started when built
    spawned = children()
    deadline = time.monotonic() + 120
    while not (os.path.exists(log) and "init 0" in open(log).read()) and time.monotonic() < deadline:
        time.sleep(0.05)
    if sys.argv[4] == "kill":  # killed: workers 1 to 3 find the pipe they wait on closed
        print(json.dumps({"spawned": spawned}), flush=True)
        os.kill(os.getpid(), 9)
    del loader  # the pass is dropped: worker 0 killed mid-read, 1 to 3 before their turn
    deadline = time.monotonic() + 60
    while set(spawned) & set(children()) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = sorted(set(spawned) & set(children()))
    print(json.dumps({"spawned": len(spawned), "left": left, "log": open(log).read().splitlines()}))
"""


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the workers in /proc")
def test_workers_dropped_before_their_turn_end_at_once_having_run_nothing(tmp_path: Path) -> None:
    """A pass dropped while spawned workers wait for their turn: they end with it, none of them
    having run the worker_init_fn or said anything on stderr."""
    data = make_shards(tmp_path / "data", [300, 300])
    log = tmp_path / "log.txt"
    env = {**os.environ, "TIDAL_WARMUP_WORKERS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    run = subprocess.run(
        [sys.executable, "-c", HELD, str(data), str(log), str(Path(__file__).parent), "drop"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["spawned"] == 4 and got["left"] == [], got
    assert "init 0" in got["log"] and not {"init 1", "init 2", "init 3"} & set(got["log"]), got["log"]
    assert "Traceback" not in run.stderr, run.stderr[-3000:]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the workers in /proc")
def test_workers_waiting_for_their_turn_when_the_training_process_is_killed_end_quietly(tmp_path: Path) -> None:
    """``kill -9`` of the training process while spawned workers wait for their turn: each finds
    its pipe closed before it was sent anything, and ends without a traceback."""
    data = make_shards(tmp_path / "data", [300, 300])
    log = tmp_path / "log.txt"
    env = {**os.environ, "TIDAL_WARMUP_WORKERS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    run = subprocess.run(  # returns once every process holding its stderr has ended
        [sys.executable, "-c", HELD, str(data), str(log), str(Path(__file__).parent), "kill"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert run.returncode == -9, run.stderr[-3000:]
    spawned = json.loads(run.stdout.strip().splitlines()[-1])["spawned"]
    deadline = time.monotonic() + 30  # (ended; reaped by init meanwhile)
    while [p for p in spawned if procs.alive(p)] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(spawned) == 4 and not [p for p in spawned if procs.alive(p)]
    assert not {"init 2", "init 3"} & set(log.read_text().splitlines())  # (1 may have had its turn)
    assert "Traceback" not in run.stderr, run.stderr[-3000:]


MARKER = """
import os
with open({log!r}, "a") as f:
    f.write(f"import {{os.getpid()}}\\n")

def read(record):
    with open({log!r}, "a") as f:
        f.write(f"read {{os.getpid()}}\\n")
    return record
"""


def test_jax_reader_processes_beyond_the_cores_start_in_turn_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tidal.jax.Loader's spawned reader processes, 4 on a rank that warms up 1 at a time: each
    imports what its dataset needs (a module that notes it) only once the one before it read its
    first batch; the batches are the reader threads'."""
    jax_loader = pytest.importorskip("tidal.jax")
    data = make_shards(tmp_path / "data", [30, 25, 41, 18, 33])
    log = tmp_path / "log.txt"
    (tmp_path / "spawn_turn_marker.py").write_text(MARKER.format(log=str(log)))
    monkeypatch.syspath_prepend(str(tmp_path))
    import spawn_turn_marker  # type: ignore[import-not-found]

    ds = tidal.Dataset(data).shuffle(seed=3, block_size=24).map(spawn_turn_marker.read).batch(4)
    threads = [np.asarray(b["id"]).tolist() for b in jax_loader.Loader(ds, num_workers=4)]
    log.unlink()
    monkeypatch.setenv("TIDAL_WARMUP_WORKERS", "1")
    got = [np.asarray(b["id"]).tolist() for b in jax_loader.Loader(ds, num_workers=4, worker_type="process")]
    assert got == threads
    lines = log.read_text().splitlines()
    imports = [line.split()[1] for line in lines if line.startswith("import ")]
    assert len(imports) == 4, lines
    for before, pid in itertools.pairwise(imports):
        assert lines.index(f"import {pid}") > lines.index(f"read {before}"), (pid, lines[:16])
