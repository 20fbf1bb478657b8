"""Before pytest-timeout fails a test that hangs, the stacks of the processes it started.

pytest-timeout prints the stacks of the test's own process only; a test that hangs waiting on
a DataLoader worker shows a training process waiting on a queue and nothing of the worker. So
a watchdog thread (one per test process) prints the stacks of every process the test started,
with ``py-spy``, a little before the timeout, into the test's captured output.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from typing import Any

BEFORE_S = 20.0  # how long before the timeout the stacks are printed


class Watchdog:
    def __init__(self) -> None:
        self.current: tuple[float, str, float] | None = None  # the running test: when it started, its id, its timeout
        self._thread: threading.Thread | None = None
        self._dumped: set[str] = set()
        self._spy = shutil.which("py-spy", path=_bin_path())  # None: no stacks to print

    def running(self, nodeid: str | None, timeout: float = 0.0) -> None:
        """``nodeid`` runs from now, for at most ``timeout`` seconds (None: no test runs)."""
        if self._thread is None and self._spy is not None:
            self._thread = threading.Thread(target=self._watch, name="tests-hang-dump", daemon=True)
            self._thread.start()
        self.current = (time.monotonic(), nodeid, timeout) if nodeid and timeout > BEFORE_S else None

    def _watch(self) -> None:
        while True:
            time.sleep(2.0)
            current = self.current
            if current is None or current[1] in self._dumped:
                continue
            if time.monotonic() - current[0] >= current[2] - BEFORE_S:
                self._dumped.add(current[1])
                _dump(self._spy, current[1])


def _bin_path() -> str:
    return os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])


def _descendants(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                children = [int(c) for c in f.read().split()]
        except OSError:
            continue
        for child in children:
            out += [child, *_descendants(child)]
    return out


def _dump(spy: str, nodeid: str) -> None:
    lines = [f"\n+++ {nodeid} is about to time out: the stacks of the processes it started +++"]
    for pid in _descendants(os.getpid()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")[:200]
            got: Any = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30)
            lines += [f"--- process {pid}: {cmd}", got.stdout + got.stderr]
        except (OSError, subprocess.SubprocessError) as exc:
            lines.append(f"--- process {pid}: no stacks ({exc})")
    print("\n".join(lines), flush=True)
