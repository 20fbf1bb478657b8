"""Bundles from reader processes through shared memory: one copy on each side instead of four.

Pickled to a pipe, a bundle's arrays are copied into the pickle, into the pipe, out of it and
out of the pickle, each time into fresh pages, and that, not the work, bounds a worker at small
batches. So a reader process writes the arrays of each bundle into a slot of its own ring of
shared memory and sends only where they are; the training process copies them out while it
unpickles the message, and the slot is free again.

A slot is never overwritten before it is read: the reader marks it read once it has copied it
out, and a writer whose next slot is not marked sends that bundle through the pipe instead (it
never waits: torch asks a worker for about ``prefetch_factor`` results ahead, so a ring of
``prefetch_factor + 1`` slots is rarely full). Each slot also starts with the number of the
bundle written into it, read before and after the copy: were a slot ever reused too early, that
is an error that says so, never another bundle's data.

The writer creates its segment and leaves it to the reader, which unlinks its name as soon as it
has mapped it: nothing is left in ``/dev/shm`` however the processes end. Where shared memory
cannot be had (a small ``/dev/shm`` in a container), bundles go through the pipe as before.
"""

from __future__ import annotations

import logging
import os
import threading
from multiprocessing import resource_tracker, shared_memory
from typing import Any

import numpy as np

from tidal.bundle import Strings
from tidal.errors import TidalError

SLOT_BYTES = 16 << 20  # a bundle larger than this goes through the pipe
_HEADER = 64  # the slot's bundle number and whether it was read, then the arrays, each at a multiple of 64 bytes

log = logging.getLogger("tidal")


class Ring:
    """This process's slots, written in turn."""

    def __init__(self, slots: int):
        self.slots = slots
        self.shm = shared_memory.SharedMemory(create=True, size=slots * SLOT_BYTES)
        try:  # the pages now: a full /dev/shm is an error here, not a SIGBUS at the first write
            if hasattr(os, "posix_fallocate"):
                os.posix_fallocate(self.shm._fd, 0, slots * SLOT_BYTES)  # type: ignore[attr-defined]
        except OSError:
            self.shm.close()
            self.shm.unlink()
            raise
        resource_tracker.unregister(self.shm._name, "shared_memory")  # type: ignore[attr-defined]  # the reader unlinks it
        self.seq = 0
        self.pid = os.getpid()

    def put(self, arrays: list[np.ndarray]) -> tuple | None:
        """Where ``arrays`` now are, or None when they do not fit a slot or the next slot was not
        read yet (then they go through the pipe: a reader never waits on the ring)."""
        offsets, at = [], _HEADER
        for a in arrays:
            offsets.append(at)
            at += -(-a.nbytes // 64) * 64
        slot = (self.seq + 1) % self.slots
        base = slot * SLOT_BYTES
        buf = self.shm.buf
        header = np.ndarray(2, np.int64, buffer=buf, offset=base)  # [bundle number, read]
        if at > SLOT_BYTES or (header[0] != 0 and header[1] != 1):
            return None
        self.seq += 1
        header[:] = (-1, 0)  # being written
        for a, off in zip(arrays, offsets, strict=True):
            np.ndarray(a.shape, a.dtype, buffer=buf, offset=base + off)[...] = a
        header[0] = self.seq
        layout = [(a.dtype.str, a.shape, off) for a, off in zip(arrays, offsets, strict=True)]
        return (self.shm.name, self.pid, slot, self.seq, layout)


_ring: Ring | None = None
_ring_failed = False
_ring_lock = threading.Lock()


def ring(slots: int) -> Ring | None:
    """This process's ring (made on first use), or None where shared memory cannot be had."""
    global _ring, _ring_failed
    with _ring_lock:
        if _ring is None or _ring.pid != os.getpid():  # a forked child makes its own
            if _ring_failed:
                return None
            try:
                _ring = Ring(slots)
            except OSError as exc:
                _ring_failed = True
                log.warning("no shared memory for reader processes (%s): batches go through a pipe", exc)
                return None
        return _ring


_mapped: dict[str, tuple[shared_memory.SharedMemory, int]] = {}
_mapped_lock = threading.Lock()
taken = 0  # bundles this process took out of shared memory: for tests and stats


def take(where: tuple) -> list[np.ndarray]:
    """The arrays a ring put at ``where``, copied out of the slot."""
    name, pid, slot, seq, layout = where
    shm = _attach(name, pid)
    base = slot * SLOT_BYTES
    header = np.ndarray(2, np.int64, buffer=shm.buf, offset=base)
    if header[0] != seq:
        raise _reused(seq, int(header[0]))
    out = [np.ndarray(shape, np.dtype(dtype), buffer=shm.buf, offset=base + off).copy() for dtype, shape, off in layout]
    if header[0] != seq:
        raise _reused(seq, int(header[0]))
    header[1] = 1  # read: the writer may use the slot again
    global taken
    taken += 1
    return out


def _reused(seq: int, found: int) -> TidalError:
    return TidalError(
        f"a reader process reused the shared memory of bundle {seq} (found {found}) before it was read; "
        "this is a bug in tidal: please report it"
    )


def _attach(name: str, pid: int) -> shared_memory.SharedMemory:
    with _mapped_lock:
        got = _mapped.get(name)
        if got is not None:
            return got[0]
        for other, (shm, owner) in list(_mapped.items()):  # segments of reader processes that are gone
            if not _alive(owner):
                del _mapped[other]
                shm.close()
        shm = shared_memory.SharedMemory(name=name)
        shm.unlink()  # mapped on both sides: the name is no longer needed (this unregisters it too)
        _mapped[name] = (shm, pid)
        return shm


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def pack_columns(columns: dict[str, Any], slots: int) -> tuple[dict[str, Any], tuple] | None:
    """A bundle's numeric columns and text buffers written to this process's ring: the columns
    without them, and where they are; None when there is no ring or they do not fit a slot."""
    names, arrays = [], []
    rest = dict(columns)
    for key, col in columns.items():
        if isinstance(col, np.ndarray) and col.dtype.kind in "biuf":
            names.append((key, "array"))
            arrays.append(np.ascontiguousarray(col))
            rest[key] = None
        elif isinstance(col, Strings):
            names.append((key, "strings"))
            arrays += [np.frombuffer(col.data, np.uint8), col.offsets]
            rest[key] = Strings.empty(col.starts)
    r = ring(slots) if arrays else None
    where = r.put(arrays) if r is not None else None
    return None if where is None else (rest, (where, names))


def unpack_columns(columns: dict[str, Any], packed: tuple) -> dict[str, Any]:
    """``columns`` with what :func:`pack_columns` moved to shared memory back in place."""
    where, names = packed
    arrays = iter(take(where))
    out = dict(columns)
    for key, kind in names:
        if kind == "array":
            out[key] = next(arrays)
        else:
            out[key].data, out[key].offsets = next(arrays), next(arrays)
    return out
