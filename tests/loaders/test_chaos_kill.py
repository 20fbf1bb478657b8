"""Kill-and-resume chaos: a training loop under torchrun, SIGKILLed whole at random points, resumed
from its last saved state, sometimes on another world size. Nothing lost, nothing repeated.

Each cycle starts ``tests/distributed/run_train.py`` under torchrun (1 to 3 ranks x 2 DataLoader
workers), waits until it has trained a random number of steps, then freezes and SIGKILLs its
whole process tree (torchrun, ranks, workers). The next cycle resumes from the last state the
job saved. Every rank writes an audit line per step; what the job consumed is each cycle's
audit up to the step of the last state that cycle saved (what the next cycle resumed from),
and all of it for a cycle that reached the end of the data. Over a finished job each record
must appear once per epoch, bar the documented remainder (fewer records than readers per
epoch); over an unfinished one, never more often.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections import Counter
from pathlib import Path

import pytest
from conftest import make_shards
from procs import Command, ProcessFailed, Tree, child_env, torchrun_argv

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).parents[1] / "distributed" / "run_train.py"
CYCLES = int(os.environ.get("TIDAL_CHAOS_CYCLES", "20"))  # docs/reliability.md quotes a run of 50 too
TOPOLOGIES = [2, 2, 1, 2, 3, 2]  # ranks per cycle: every other resume is on another world size
EPOCHS = 2  # as in run_train.py
MAX_READERS = 3 * 2
SIZES = [30, 22, 40, 17, 35, 26, 45, 13, 32, 20]  # 280 records: a job ends after about 9 cycles


def audit(job: Path, cycle: int) -> list[dict]:
    lines = []
    for path in sorted(job.glob(f"audit-c{cycle}-r*.jsonl")):
        for line in path.read_text().splitlines():
            if line.endswith("}"):  # a line cut by the kill is not a consumed batch: its step has no state
                lines.append(json.loads(line))
    return lines


def rank0_steps(job: Path, cycle: int) -> int:
    path = job / f"audit-c{cycle}-r0.jsonl"
    return path.read_text().count("\n") if path.exists() else 0


def consumed(job: Path, cycles: list[int], finished: bool) -> Counter[int]:
    """Record ids consumed by the job: each cycle's audit up to the last state it saved."""
    saved: dict[int, int] = {}
    for cycle, step in json.loads((job / "saves.json").read_text()):
        saved[cycle] = step  # the state the next cycle resumed from, when this cycle saved one
    ids: Counter[int] = Counter()
    for i, cycle in enumerate(cycles):
        last = finished and i == len(cycles) - 1
        for entry in audit(job, cycle):
            if last or entry["step"] <= saved.get(cycle, -1):
                ids.update(entry["ids"])
    return ids


@pytest.mark.timeout(1200)  # 20 torchrun starts: a minute or two on 2 cores
def test_sigkill_at_random_points_loses_and_repeats_nothing(tmp_path: Path) -> None:
    data = make_shards(tmp_path / "data", SIZES)
    total = sum(SIZES)
    rng = random.Random(20261123)
    env = child_env(tmp_path / "cache")
    job_index, job, cycles, saves = 0, tmp_path / "job0", [], []
    job.mkdir()
    finished_jobs = 0
    kills = 0
    for cycle in range(CYCLES):
        nproc = TOPOLOGIES[cycle % len(TOPOLOGIES)]
        target = rng.randint(2, 14)
        argv = torchrun_argv(SCRIPT, str(data), str(job), str(cycle), str(100 + job_index), nproc=nproc)
        cycles.append(cycle)
        with Tree([Command(f"cycle {cycle} on {nproc} ranks", argv, env)]) as tree:
            deadline = time.monotonic() + 90
            while tree.procs[0].poll() is None and rank0_steps(job, cycle) < target:
                if time.monotonic() > deadline:
                    raise ProcessFailed(f"cycle {cycle} made no progress in 90 s\n{tree.report()}")
                time.sleep(0.02)
            code = tree.procs[0].poll()
            if code not in (None, 0):
                raise ProcessFailed(f"cycle {cycle} failed with exit status {code}\n{tree.report()}")
            if code is None:
                tree.kill()  # the whole tree, at once: torchrun, every rank, every DataLoader worker
                kills += 1
        state = job / "state.json"
        if state.exists():
            saved = json.loads(state.read_text())
            saves.append([saved["cycle"], saved["step"]])
        (job / "saves.json").write_text(json.dumps(saves))
        if (job / "done").exists():
            ids = consumed(job, cycles, finished=True)
            assert max(ids.values()) <= EPOCHS, f"job {job_index}: records consumed more than once per epoch"
            missing = sum(EPOCHS - ids[i] for i in range(total))
            # the documented remainder: fewer records than readers per epoch, on the last topology
            assert missing <= EPOCHS * (MAX_READERS - 1), f"job {job_index}: {missing} records lost"
            finished_jobs += 1
            job_index += 1
            job, cycles, saves = tmp_path / f"job{job_index}", [], []
            job.mkdir()
    if cycles:
        ids = consumed(job, cycles, finished=False)
        assert not ids or max(ids.values()) <= EPOCHS, "the unfinished job consumed a record too often"
    assert finished_jobs >= 1 and kills >= CYCLES // 2, (finished_jobs, kills)
    (tmp_path.parent / "chaos-figures.json").write_text(
        json.dumps({"cycles": CYCLES, "kills": kills, "finished_jobs": finished_jobs})
    )
