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

The training process makes each worker's segment before the workers start; each worker maps
its own as it starts and unlinks its name, so that nothing is left in ``/dev/shm`` however the
processes end, a whole process tree killed at once included. A segment whose worker never
started is unlinked by the training process when the loader's iterator ends or the process
exits, or by its resource tracker if it is killed. (Segments made by the workers were left in
``/dev/shm`` whenever the training process ended before it had read a worker's first bundle:
48 MB each time.) Where shared memory cannot be had (a small ``/dev/shm`` in a container),
bundles go through the pipe as before.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
from collections.abc import Callable, Collection
from multiprocessing import shared_memory
from typing import Any

import numpy as np

from tidal import fork_safe
from tidal.errors import TidalError
from tidal.transport.bundles import Strings, numeric
from tidal.transport.recycle import RECYCLED

SLOT_BYTES = 16 << 20  # a bundle larger than this goes through the pipe
_HEADER = 64  # the slot's bundle number and whether it was read, then the arrays, each at a multiple of 64 bytes

log = logging.getLogger("tidal")
PREFIX = "psm_tidal_"  # of every segment's name, then the pid of the process that made it


def make_rings(count: int, slots: int) -> list[str] | None:
    """``count`` segments of ``slots`` slots, made and owned by this (the training) process, to
    be written by one reader process each and released with :func:`release`; None where shared
    memory cannot be had (then: the pipe)."""
    made: list[str] = []
    try:
        for _ in range(count):
            segment = _segment(slots * SLOT_BYTES)
            with _mapped_lock:
                _mapped[segment.name] = segment
            made.append(segment.name)
    except OSError as exc:
        release(made)
        log.warning("no shared memory for reader processes (%s): batches go through a pipe", exc)
        return None
    return made


def _segment(size: int) -> shared_memory.SharedMemory:
    """A segment of ``size`` bytes, registered with this process's resource tracker. Its pages
    are reserved by the worker that writes it (:class:`Ring`), as it first writes them, not
    here: that took 27 ms before the workers even started. Named after the process that made it (as
    ``psm_tidal_<pid>_...``), so that what a process left is told from what others hold."""
    return shared_memory.SharedMemory(name=f"{PREFIX}{os.getpid()}_{secrets.token_hex(4)}", create=True, size=size)


def release(names: list[str]) -> None:
    """Unlink segments :func:`make_rings` made, and unmap them here."""
    for name in names:
        with _mapped_lock:
            segment = _mapped.pop(name, None)
        if segment is None:
            continue
        _unlink(segment)
        _forget(segment)  # unlinked here or by its worker, which may have been killed before it told the tracker
        with contextlib.suppress(BufferError):  # a view of it still held somewhere: unmapped when that goes
            segment.close()


def _unlink(segment: shared_memory.SharedMemory) -> bool:
    """Unlink ``segment``'s name, telling the resource tracker nothing (see :func:`_forget`);
    False where it was unlinked already."""
    import _posixshmem  # (what SharedMemory.unlink calls)

    try:
        _posixshmem.shm_unlink(segment._name)  # type: ignore[attr-defined]
    except FileNotFoundError:
        return False
    return True


def _forget(segment: shared_memory.SharedMemory) -> None:
    """Have the resource tracker forget ``segment``, whether it knows it or not, after its name
    was unlinked. Both the worker (as it starts) and the training process (as it releases the
    rings) say so, and either may be killed before it does: a segment left registered was warned
    of at exit as "leaked", though it did not exist. So each says "register, unregister" in one
    write to the tracker's pipe (atomic: two processes' lines never interleave): its set of names
    takes a second register as one, so the name is gone after either, and no unregister ever
    comes for a name the tracker does not hold (the tracker printed a KeyError's traceback where
    the training process's unregister came between a worker's unlink and its own)."""
    from multiprocessing import resource_tracker

    name = segment._name  # type: ignore[attr-defined]  # as SharedMemory registered it: with its slash
    tracker = getattr(resource_tracker, "_resource_tracker", None)
    said = f"REGISTER:{name}:shared_memory\nUNREGISTER:{name}:shared_memory\n".encode("ascii")
    if tracker is not None and hasattr(tracker, "ensure_running") and len(said) <= 512:
        tracker.ensure_running()
        fd = getattr(tracker, "_fd", None)
        if isinstance(fd, int) and os.write(fd, said) == len(said):
            return
    resource_tracker.register(name, "shared_memory")  # (another Python's tracker: its own calls)
    resource_tracker.unregister(name, "shared_memory")


class Ring:
    """A reader process's slots in a segment the training process made, written in turn."""

    def __init__(self, name: str, slots: int):
        self.slots = slots
        with _mapped_lock:  # a forked worker has the training process's mapping already
            self.shm = _mapped.get(name) or shared_memory.SharedMemory(name=name)
        if _unlink(self.shm):  # mapped on both sides: the name is no longer needed
            _forget(self.shm)
        self.seq = 0
        self.pid = os.getpid()
        # What of each slot is reserved: pages are reserved before they are first written, so that
        # a full /dev/shm is a refusal (the pipe) and not a SIGBUS at a write; only those a bundle
        # needs, as it is written: a worker sending small batches holds a few pages, not 48 MB, and
        # workers starting together do not each spend 13 ms of a core reserving theirs at once.
        self._reserved = [0] * slots
        self.refused: OSError | None = None

    def _reserve(self, slot: int, size: int) -> bool:
        """Whether the first ``size`` bytes of ``slot`` are reserved (now, if they were not)."""
        if self.refused is not None:
            return False
        if size > self._reserved[slot]:
            try:
                if hasattr(os, "posix_fallocate"):
                    os.posix_fallocate(self.shm._fd, slot * SLOT_BYTES, size)  # type: ignore[attr-defined]
            except OSError as exc:
                self.refused = exc
                log.warning("no shared memory for a reader process (%s): its batches go through a pipe", exc)
                return False
            self._reserved[slot] = size
        return True

    def put(self, arrays: list[np.ndarray | list[bytes]]) -> tuple | None:
        """Where ``arrays`` now are, or None when they do not fit a slot or the next slot was not
        read yet (then they go through the pipe: a reader never waits on the ring). A list of
        ``bytes`` is written as one byte array, piece by piece."""
        offsets, sizes, at = [], [], _HEADER
        for a in arrays:
            offsets.append(at)
            sizes.append(a.nbytes if isinstance(a, np.ndarray) else sum(map(len, a)))
            at += -(-sizes[-1] // 64) * 64
        slot = (self.seq + 1) % self.slots
        if at > SLOT_BYTES or not self._reserve(slot, at):
            return None
        base = slot * SLOT_BYTES
        buf = self.shm.buf
        assert buf is not None  # (mapped until released)
        header = np.ndarray(2, np.int64, buffer=buf, offset=base)  # [bundle number, read]
        if header[0] != 0 and header[1] != 1:
            return None
        self.seq += 1
        header[:] = (-1, 0)  # being written
        layout = []
        for a, off, size in zip(arrays, offsets, sizes, strict=True):
            if isinstance(a, np.ndarray):
                np.ndarray(a.shape, a.dtype, buffer=buf, offset=base + off)[...] = a
                layout.append((a.dtype.str, a.shape, off))
                continue
            at = base + off
            for piece in a:
                buf[at : at + len(piece)] = piece
                at += len(piece)
            layout.append(("|u1", (size,), off))
        header[0] = self.seq
        return (self.shm.name, slot, self.seq, layout)


_ring: Ring | None = None
_refused: tuple[int, str] | None = None  # (process, segment) whose ring could not be had
_ring_lock = fork_safe.Lock()


def ring(name: str, slots: int) -> Ring | None:
    """This process's ring in segment ``name`` (mapped on first use: as the worker starts); None
    where it is gone (the loader ended while this reader started)."""
    global _ring, _refused
    with _ring_lock:
        if _ring is not None and _ring.pid == os.getpid() and _ring.shm.name == name:
            return _ring
        if _refused == (os.getpid(), name):
            return None
        try:
            _ring = Ring(name, slots)
        except OSError:
            _refused = (os.getpid(), name)
            return None
        return _ring


_mapped: dict[str, shared_memory.SharedMemory] = {}  # the segments this process made
_mapped_lock = fork_safe.Lock()
taken = 0  # bundles this process took out of shared memory: for tests and stats


def _copies(views: list[np.ndarray]) -> list[np.ndarray]:
    return [v.copy() for v in views]


def take(where: tuple, use: Callable[[list[np.ndarray]], Any] = _copies) -> Any:
    """What ``use`` makes of the arrays a ring put at ``where`` (views of the slot, free again
    once it returns); by default, copies of them."""
    name, slot, seq, layout = where
    with _mapped_lock:
        shm = _mapped.get(name)
    if shm is None:
        raise TidalError(f"a reader process sent a bundle in shared memory {name!r} that its loader already released")
    base = slot * SLOT_BYTES
    header = np.ndarray(2, np.int64, buffer=shm.buf, offset=base)
    if header[0] != seq:
        raise _reused(seq, int(header[0]))
    out = use([np.ndarray(shape, np.dtype(dtype), buffer=shm.buf, offset=base + off) for dtype, shape, off in layout])
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


def pack_columns(columns: dict[str, Any], name: str, slots: int) -> tuple[dict[str, Any], tuple] | None:
    """A bundle's numeric columns and text buffers written to this process's ring: the columns
    without them, and where they are; None when there is no ring or they do not fit a slot."""
    names: list[tuple[str, str]] = []
    arrays: list[np.ndarray | list[bytes]] = []
    rest = dict(columns)
    for key, col in columns.items():
        if numeric(col):
            names.append((key, "array"))
            arrays.append(np.ascontiguousarray(col))
            rest[key] = None
        elif isinstance(col, Strings):
            names.append((key, "strings"))
            arrays += [col.encoded if col.encoded is not None else np.frombuffer(col.data, np.uint8), col.offsets]
            rest[key] = Strings.empty(col.starts)
    r = ring(name, slots) if arrays else None
    where = r.put(arrays) if r is not None else None
    return None if where is None else (rest, (where, names))


def unpack_columns(columns: dict[str, Any], packed: tuple, wide: Collection[str] = ()) -> dict[str, Any]:
    """``columns`` with what :func:`pack_columns` moved to shared memory back in place; those
    named in ``wide`` as int64, widened as they are copied out (one pass over them, not two)."""
    where, names = packed

    def read(views: list[np.ndarray]) -> dict[str, Any]:
        arrays, out = iter(views), dict(columns)
        for key, kind in names:
            if kind == "array":
                view = next(arrays)
                out[key] = copy = RECYCLED.empty(view.shape, np.int64 if key in wide else view.dtype)
                np.copyto(copy, view)  # token ids widened as they are copied: one pass
            else:  # the strings made straight from the slot: no copy of the text first
                data, offsets = next(arrays), next(arrays)
                out[key] = Strings.read(data, offsets, out[key].starts)
        return out

    return take(where, read)
