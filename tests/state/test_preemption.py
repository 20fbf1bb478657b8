"""Preemption: SIGTERM in the middle of a loop with DataLoader workers, a handler that saves the
loader's state and exits; the job resumed from it continues exactly; nothing is left behind
(no worker, no thread, no segment of shared memory), with a handler or without one."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import procs
import pytest
from conftest import make_shards

pytestmark = pytest.mark.slow
pytest.importorskip("torch")

SCRIPT = Path(__file__).parents[1] / "distributed" / "run_preempted.py"


def segments(pid: int) -> set[str]:
    """The segments of shared memory the process ``pid`` made (tests in other processes make theirs)."""
    mine = f"psm_tidal_{pid}_"
    return {n for n in os.listdir("/dev/shm") if n.startswith(mine)} if os.path.isdir("/dev/shm") else set()


def ids(path: Path) -> list[list[int]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("handler", [True, False])
def test_sigterm_mid_epoch_saves_a_state_that_resumes_exactly_and_leaves_nothing(tmp_path: Path, handler: bool) -> None:
    data = make_shards(tmp_path / "data", [120] * 5)
    full, first, second = tmp_path / "full", tmp_path / "first", tmp_path / "second"
    for d in (full, first, second):
        d.mkdir()
    procs.single(SCRIPT, str(data), str(full), env=procs.child_env())
    reference = ids(full / "ids.jsonl")
    assert len(reference) == 150

    env = procs.child_env()
    argv = [sys.executable, str(SCRIPT), str(data), str(first)]
    if not handler:  # the default action of SIGTERM: the process ends where it is
        keep = (
            "import runpy, signal, sys; sys.argv = sys.argv[1:]; install = signal.signal; "
            "signal.signal = lambda s, h: None if s == signal.SIGTERM else install(s, h); "
            "runpy.run_path(sys.argv[0], run_name='__main__')"
        )
        argv = [sys.executable, "-c", keep, *argv[1:]]
    with procs.Tree([procs.Command("preempted", argv, env)]) as tree:
        trainer = tree.procs[0].pid  # the segments of shared memory are named after it
        deadline = time.monotonic() + 120
        while not (first / "ids.jsonl").exists() or len(ids(first / "ids.jsonl")) < 30:
            assert time.monotonic() < deadline and tree.procs[0].poll() is None, tree.report()
            time.sleep(0.05)
        tree.procs[0].send_signal(signal.SIGTERM)
        tree.procs[0].wait(60)
        assert tree.procs[0].returncode == (0 if handler else -signal.SIGTERM), tree.report()
        deadline = time.monotonic() + 30  # the workers notice their parent is gone
        while procs._tree(tree.mark) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not procs._tree(tree.mark), "a DataLoader worker outlived its training process"
    deadline = time.monotonic() + 30
    while segments(trainer) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not segments(trainer)
    if not handler:
        return
    taken = ids(first / "ids.jsonl")
    assert 30 <= len(taken) < 150 and taken == reference[: len(taken)]
    procs.single(SCRIPT, str(data), str(second), str(first / "state.json"), env=procs.child_env())
    assert taken + ids(second / "ids.jsonl") == reference  # nothing lost, nothing read twice
