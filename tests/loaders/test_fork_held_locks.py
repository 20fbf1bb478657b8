"""A DataLoader whose workers are forked while another thread of the training process holds
tidal's locks: the workers read on (each lock is free again in a forked child), where before a
worker waited for ever on a lock no thread of its own would release."""

from __future__ import annotations

import multiprocessing
import os
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tidal
from tidal import fork_safe
from tidal.formats import binary
from tidal.sources.siblings import Siblings
from tidal.storage import logs
from tidal.transport import recycle, rings


def _module_locks() -> list[fork_safe.Lock]:
    return [
        binary._NPY_HEADER_LOCK,
        Siblings._made_lock,
        logs._lock,
        recycle.RECYCLED._lock,
        rings._ring_lock,
        rings._mapped_lock,
    ]


def test_every_lock_a_forked_child_may_take_is_fork_safe() -> None:
    assert all(isinstance(lock, fork_safe.Lock) for lock in _module_locks())


def test_a_lock_held_by_another_thread_is_free_in_a_forked_child() -> None:
    lock = fork_safe.Lock()
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            held.set()
            release.wait()

    threading.Thread(target=hold, daemon=True).start()
    held.wait()
    pid = os.fork()
    if pid == 0:  # the child: exit 0 once it has the lock (else the parent kills it)
        with lock:
            os._exit(0)
    try:
        code = _wait(pid, 10.0)
    finally:
        release.set()
    assert code == 0


def _wait(pid: int, timeout: float) -> int | None:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return None


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="no fork here")
def test_workers_forked_while_a_thread_holds_tidals_locks_read_on(tmp_path: Path) -> None:
    for f in range(3):
        pq.write_table(pa.table({"id": list(range(f * 100, f * 100 + 100))}), tmp_path / f"{f}.parquet")
    ds = tidal.Dataset(tmp_path).shuffle(seed=2, block_size=60).batch(10)
    whole = sorted(i for b in tidal.DataLoader(ds, num_workers=0) for i in b["id"].tolist())
    held, release = threading.Event(), threading.Event()
    # the module locks but the two this process takes as it starts its workers; the ring's is what
    # a worker takes first, to send its batches
    locks = [lock for lock in _module_locks() if lock not in (rings._mapped_lock, recycle.RECYCLED._lock)]

    def hold() -> None:
        for lock in locks:
            assert lock._lock.acquire(timeout=30)
        held.set()
        release.wait()
        for lock in locks:
            lock._lock.release()

    threading.Thread(target=hold, daemon=True).start()
    held.wait()
    try:  # the workers start (are forked) as the loader is built: while the locks are held here
        loader = tidal.DataLoader(
            ds, num_workers=2, multiprocessing_context=multiprocessing.get_context("fork"), timeout=30
        )
        assert loader._early is not None
    finally:
        release.set()  # this process's own loop takes some of them
    assert sorted(i for b in loader for i in b["id"].tolist()) == whole
