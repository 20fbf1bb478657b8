"""Bundles through shared memory (tidal.transport.rings): the same batches as through a pipe, nothing left behind."""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import make_shards

import tidal
from tidal.testing import same
from tidal.transport import rings as shm
from tidal.transport.bundles import Strings


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return make_shards(tmp_path / "data", [40, 75, 13, 60, 52, 33, 90, 17])


def segments(pid: int) -> set[str]:
    """The segments of shared memory the process ``pid`` made (tests in other processes make theirs)."""
    mine = f"psm_tidal_{pid}_"
    return {n for n in os.listdir("/dev/shm") if n.startswith(mine)} if os.path.isdir("/dev/shm") else set()


def batches(ds: tidal.Dataset, context: str) -> list[dict]:
    loader = tidal.DataLoader(ds, num_workers=2, multiprocessing_context=multiprocessing.get_context(context))
    return list(loader)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_batches_through_shared_memory_are_the_pipes_and_nothing_is_left(
    data: Path, context: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ds = tidal.Dataset(data).shuffle(seed=3, block_size=40).map(with_numbers).batch(5)
    taken = shm.taken
    through_memory = batches(ds, context)
    assert shm.taken > taken  # the bundles came through shared memory...
    monkeypatch.setenv("TIDAL_SHARED_MEMORY", "0")
    taken = shm.taken
    through_pipe = batches(ds, context)
    assert shm.taken == taken  # ...and here through the pipe
    assert len(through_memory) == len(through_pipe) == 76
    for a, b in zip(through_memory, through_pipe, strict=True):
        assert same(a, b) and a["text"] == b["text"] and a["vector"].dtype == b["vector"].dtype
    assert not segments(os.getpid())  # every segment unlinked once both sides had it
    made = shm.make_rings(2, 1)  # named after the process that made them, as segments() finds them
    assert made and segments(os.getpid()) == set(made)
    shm.release(made)
    assert not segments(os.getpid())


def with_numbers(record: dict) -> dict:
    return {**record, "vector": np.arange(4, dtype=np.float32) * record["id"], "big": record["id"] * 10**10}


def test_packed_token_batches_through_shared_memory_are_the_pipes(data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ds = tidal.Dataset(data).shuffle(seed=1).map(token_ids).pack(16).batch(4)
    through_memory = batches(ds, "fork")
    monkeypatch.setenv("TIDAL_SHARED_MEMORY", "0")
    through_pipe = batches(ds, "fork")
    assert len(through_memory) == len(through_pipe) > 10
    assert set(through_memory[0]) >= {"input_ids", "labels", "position_ids"}
    assert all(same(a, b) for a, b in zip(through_memory, through_pipe, strict=True))
    in_process = list(tidal.DataLoader(ds))  # the same batches, made in the loop: the dtypes a model gets
    want = {"input_ids": torch.int64, "labels": torch.int64, "position_ids": torch.int64, "segment_ids": torch.int32}
    for made in (through_memory, through_pipe, in_process):
        assert {k: v.dtype for k, v in made[0].items()} == want


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned memory needs a GPU")
@pytest.mark.parametrize("workers", [0, 2])
def test_pin_memory_pins_every_array_of_a_packed_batch(data: Path, workers: int) -> None:
    # token ids were widened with .long() after torch pinned the bundle, and a bundle made in
    # the training process had nothing pinned: the batches reached the loop in pageable memory
    ds = tidal.Dataset(data).shuffle(seed=1).map(token_ids).pack(16).batch(4)
    batch = next(iter(tidal.DataLoader(ds, num_workers=workers, pin_memory=True)))
    assert {k: (v.dtype, v.is_pinned()) for k, v in batch.items()} == {
        "input_ids": (torch.int64, True),
        "labels": (torch.int64, True),
        "position_ids": (torch.int64, True),
        "segment_ids": (torch.int32, True),
    }


def token_ids(record: dict) -> dict:
    return {"input_ids": [record["id"] * 7 % 50_000 + k for k in range(record["id"] % 9 + 1)]}


@pytest.mark.parametrize("where", ["training process", "worker"])
def test_without_shared_memory_batches_go_through_the_pipe(
    data: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, where: str
) -> None:
    def refuse(*args: object) -> None:
        raise OSError(28, "No space left on device")

    expected = batches(tidal.Dataset(data).shuffle(seed=2).batch(7), "fork")
    if where == "worker":  # its pages reserved as it starts (forked workers inherit the patch)
        monkeypatch.setattr(os, "posix_fallocate", refuse)
    else:  # the segments made before the workers start
        monkeypatch.setattr(shm, "_segment", refuse)
    taken = shm.taken
    assert all(
        same(a, b) for a, b in zip(batches(tidal.Dataset(data).shuffle(seed=2).batch(7), "fork"), expected, strict=True)
    )
    assert shm.taken == taken
    if where == "training process":  # (a worker's warning goes to its own stderr)
        assert "no shared memory for reader processes" in caplog.text


def test_a_slot_not_read_yet_is_never_written() -> None:
    names = shm.make_rings(1, 2)
    assert names is not None
    ring = shm.Ring(names[0], 2)
    try:
        first = ring.put([np.arange(10)])
        second = ring.put([np.arange(20)])
        assert first is not None and second is not None
        assert ring.put([np.arange(30)]) is None  # the next slot holds the first, unread: the pipe takes it
        assert shm.take(first)[0].tolist() == list(range(10))
        third = ring.put([np.arange(30)])  # read now: the slot is free
        assert third is not None and shm.take(third)[0].tolist() == list(range(30))
        with pytest.raises(tidal.TidalError, match="reused the shared memory of bundle 1"):
            shm.take(first)  # its slot holds the third now: an error, never the third's data
        assert ring.put([np.zeros(shm.SLOT_BYTES // 8 + 1)]) is None  # larger than a slot: the pipe
    finally:
        ring.shm.close()
        shm.release(names)
    with pytest.raises(tidal.TidalError, match="already released"):
        shm.take(third)


@pytest.mark.skipif(not hasattr(os, "posix_fallocate"), reason="pages reserved with posix_fallocate")
def test_a_ring_reserves_the_pages_it_writes_as_it_writes_them(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker's ring holds the pages its bundles need, not its whole segment from the start
    (48 MB a worker, reserved by every worker at once as they start); reserving them before each
    first write keeps a full /dev/shm a refusal (the pipe), never a SIGBUS."""
    names = shm.make_rings(1, 3)
    assert names is not None
    ring = shm.Ring(names[0], 3)
    try:
        held = os.fstat(ring.shm._fd).st_blocks * 512  # type: ignore[attr-defined]
        assert held < shm.SLOT_BYTES // 4  # nothing reserved yet
        where = ring.put([np.arange(1000)])
        assert where is not None and shm.take(where)[0].tolist() == list(range(1000))
        held = os.fstat(ring.shm._fd).st_blocks * 512  # type: ignore[attr-defined]
        assert 8000 <= held < shm.SLOT_BYTES // 4  # the bundle's pages, not the segment's 48 MB

        def full(fd: int, offset: int, size: int) -> None:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(os, "posix_fallocate", full)
        with caplog.at_level(logging.WARNING, logger="tidal"):
            assert ring.put([np.arange(10)]) is None  # the next slot's pages cannot be had: the pipe takes it
            assert ring.put([np.arange(10)]) is None  # and every bundle after it
        assert caplog.text.count("no shared memory for a reader process") == 1
    finally:
        ring.shm.close()
        shm.release(names)


EXITS = """
import os, signal, sys, time
import tidal

loader = tidal.DataLoader(tidal.Dataset(sys.argv[1]).shuffle(seed=1).repeat().batch(5), num_workers=2)
it = iter(loader)
next(it)
time.sleep(1.0)  # both workers have sent a bundle by now; the second one is never read
print("read", flush=True)
if sys.argv[2] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
if sys.argv[2] == "kill-tree":
    time.sleep(60)  # killed with its workers and its resource tracker, at once
"""


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="segments are listed in /dev/shm")
@pytest.mark.parametrize("how", ["exit", "kill", "kill-tree"])
def test_no_segment_is_left_when_the_training_process_ends_before_reading_every_worker(
    data: Path, tmp_path: Path, how: str
) -> None:
    """A training process that exits, or is killed, or is killed with all its processes at once,
    with a worker's bundle unread: no segment of shared memory is left, and no warning."""
    script = tmp_path / "exits.py"
    script.write_text(EXITS)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(data), how],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "read\n"
        if how == "kill-tree":
            os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == (0 if how == "exit" else -signal.SIGKILL), err
    deadline = time.monotonic() + 30  # killed: the workers notice their parent is gone within seconds
    while segments(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not segments(proc.pid)
    assert "leaked" not in err


FORGOTTEN = """
import sys
from multiprocessing import shared_memory
from tidal.transport import rings
import _posixshmem
killed, ended, unused = rings.make_rings(3, 1)
# a worker killed after it unlinked its segment's name, before it told the resource tracker
_posixshmem.shm_unlink("/" + killed)
# a worker that mapped and unlinked its segment as it does (the tracker told)
rings.Ring(ended, 1)
rings.release([killed, ended, unused])
# a worker whose training process releases the rings (at exit) between the worker's unlink of its
# segment's name and its word to the tracker
raced = rings.make_rings(1, 1)[0]
real, released = _posixshmem.shm_unlink, []
def unlink(name):
    real(name)
    if name == "/" + raced and not released:
        released.append(name)
        rings.release([raced])
_posixshmem.shm_unlink = unlink
rings.Ring(raced, 1)
_posixshmem.shm_unlink = real
print(killed, ended, unused, raced, flush=True)
"""


def test_a_worker_killed_as_it_unlinked_its_segment_leaves_no_leak_warning_at_exit(tmp_path: Path) -> None:
    """The rings a loader releases are forgotten by the resource tracker whichever way their workers
    ended: the tracker warned of a "leaked" segment that did not exist when a worker was killed
    (load_state_dict, a restart) between unlinking its segment's name and telling the tracker, and
    printed a KeyError's traceback where the training process released the rings in between."""
    script = tmp_path / "forgotten.py"
    script.write_text(FORGOTTEN)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "leaked" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    names = done.stdout.split()
    assert len(names) == 4 and not [n for n in names if os.path.exists(f"/dev/shm/{n}")]


def test_text_through_a_slot_and_through_the_pipe_is_the_text() -> None:
    """Strings are written into the slot piece by piece and made straight out of it: multi-byte
    UTF-8, empty strings and empty batches keep their bounds either way."""
    batches = [["é", "", "日本語"], [], ["a" * 1000, "ß\x00z"], [""]]
    names = shm.make_rings(1, 2)
    assert names is not None
    try:
        moved = shm.pack_columns({"text": Strings(batches), "n": np.arange(4)}, names[0], 2)
        assert moved is not None
        rest, packed = moved
        out = shm.unpack_columns(pickle.loads(pickle.dumps(rest)), packed)
        assert [out["text"][j] for j in range(4)] == batches and out["n"].tolist() == [0, 1, 2, 3]
        piped = pickle.loads(pickle.dumps(Strings(batches)))
        assert [piped[j] for j in range(4)] == batches
    finally:
        shm.release(names)


def test_batches_the_loop_keeps_are_never_written_over_by_later_bundles(tmp_path: Path) -> None:
    # bundles are copied out of shared memory into buffers used again once nothing holds them
    # (tidal.transport.recycle): a batch kept by the loop holds its buffer, so it never changes
    from tidal.formats.tokens import TokenWriter

    rng = np.random.default_rng(0)
    with TokenWriter(tmp_path / "tok") as w:
        for _ in range(3000):
            w.write(rng.integers(0, 60_000, int(rng.integers(50, 2000))))
    ds = tidal.Dataset(tmp_path / "tok").shuffle(seed=1).repeat().pack(1024).batch(8)
    loader = tidal.DataLoader(ds, num_workers=2)
    kept, copies = [], []
    for step, batch in enumerate(loader):
        if step % 3 == 0:  # kept; the others are dropped at once, so their buffers come back
            kept.append(batch)
            copies.append({k: v.clone() for k, v in batch.items()})
        if step == 600:
            break
    assert shm.taken > 0
    for got, want in zip(kept, copies, strict=True):
        assert all(torch.equal(got[k], want[k]) for k in want)


def test_a_recycled_buffer_is_handed_out_again_only_once_nothing_holds_it() -> None:
    from tidal.transport.recycle import MIN_BYTES, Recycled

    pool = Recycled(max_bytes=8 * MIN_BYTES)
    a = pool.empty((MIN_BYTES // 8,), np.int64)
    view = a[10:20]
    del a
    b = pool.empty((MIN_BYTES // 8,), np.int64)
    assert not np.shares_memory(b, view)  # a view still holds the first buffer
    del view
    c = pool.empty((MIN_BYTES // 4,), np.int32)
    assert c.shape == (MIN_BYTES // 4,) and c.dtype == np.int32
    first = c.__array_interface__["data"][0]
    del c
    d = pool.empty((MIN_BYTES // 8,), np.int64)
    assert d.__array_interface__["data"][0] == first  # free again: the same memory
    small = pool.empty((8,), np.int64)
    assert small.base is None  # below MIN_BYTES: malloc's
