"""The process harness (tests/procs.py) leaves nothing running: hung, failed or finished.

``tests/distributed/run_hang.py`` starts what a ``killpg`` of its launcher misses: a child in
a session of its own, an orphan adopted by init, DataLoader workers; under torchrun each rank
is in a session of its own too. Every process announces its pid in a file, so the checks
below see, from outside the harness, that none of them is alive afterwards.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import procs
import pytest

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).parents[1] / "distributed" / "run_hang.py"
PER_RANK = 5  # main, escaped, orphan, 2 DataLoader workers


def announced(out: Path) -> dict[str, int]:
    """role -> pid, as the processes wrote them: ``rank{r}-{role}-{pid}``."""
    return {p.name: int(p.name.rsplit("-", 1)[1]) for p in out.iterdir()}


def wait_for(out: Path, n: int, tree: procs.Tree, timeout: float = 60) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    while len(announced(out)) < n:
        assert time.monotonic() < deadline, f"only {sorted(announced(out))} started; {tree.report()}"
        assert all(p.poll() is None for p in tree.procs), f"a command ended early: {tree.report()}"
        time.sleep(0.05)
    return announced(out)


def assert_none_alive(pids: dict[str, int]) -> None:
    time.sleep(0.2)  # a straggler the harness missed would still be running, not merely exiting
    alive = {role: pid for role, pid in pids.items() if procs.alive(pid)}
    assert not alive, f"left running: {alive}"


def test_a_hung_torchrun_is_killed_with_its_ranks_their_workers_and_orphans(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    argv = procs.torchrun_argv(SCRIPT, str(out), nproc=2)
    with procs.Tree([procs.Command("torchrun", argv, procs.child_env(tmp_path / "cache"))]) as tree:
        pids = wait_for(out, 2 * PER_RANK, tree)
        pids["torchrun"] = tree.procs[0].pid
        sessions = {os.getsid(pid) for pid in pids.values()}
        assert len(sessions) >= 5, "torchrun, its two ranks and their escaped children have sessions of their own"
        with pytest.raises(procs.ProcessFailed, match="did not finish") as failure:
            tree.wait(timeout=0)
    assert_none_alive(pids)
    report = str(failure.value)
    assert "run_hang.py" in report and "Current thread" in report, f"no stack dumps in the report:\n{report}"


def test_a_failing_rank_kills_the_others_and_all_they_started(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    env = procs.child_env(tmp_path / "cache")
    hang = procs.Command("rank 0", [sys.executable, str(SCRIPT), str(out)], {**env, "RANK": "0"})
    fail = [sys.executable, str(SCRIPT), str(out), "--fail-after", str(PER_RANK)]
    t0 = time.monotonic()
    with pytest.raises(procs.ProcessFailed, match="rank 1 failed with exit status 3"):
        procs.run([hang, procs.Command("rank 1", fail, {**env, "RANK": "1"})], timeout=120)
    assert time.monotonic() - t0 < 60, "the harness waited for the hung rank after the other failed"
    pids = announced(out)
    assert len(pids) == PER_RANK
    assert_none_alive(pids)


def test_what_a_successful_command_left_behind_is_killed(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    code = (
        "import os, sys, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        f"    open(os.path.join({str(out)!r}, f'rank0-daemon-{{os.getpid()}}'), 'w').close()\n"
        "    time.sleep(600)\n"
        "else:\n"
        f"    while not os.listdir({str(out)!r}): time.sleep(0.02)\n"
        "    print('done')\n"
    )
    assert procs.run([procs.Command("parent", [sys.executable, "-c", code], procs.child_env())]) == ["done\n"]
    pids = announced(out)
    assert len(pids) == 1
    assert_none_alive(pids)
