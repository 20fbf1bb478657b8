"""Buffers for what the training process copies out of shared memory, used again once free.

Each bundle a worker sends through shared memory is copied out into fresh arrays (the slot is
the worker's again at once). Fresh memory of a few MB is a fresh mapping whose every page
faults on first touch, and in a virtual machine a fault costs microseconds: copying four int64
columns of 35 packed batches out of a ring ran at 1.9 GB/s, 60% of the training process's time.
Here a copy goes into a buffer the pool made before, once nothing outside the pool holds it any
more (no batch, tensor or view of it is alive, which CPython's reference count tells), else
into a new one. A batch the loop keeps is never written over: it holds its buffer.
"""

from __future__ import annotations

import sys
from math import prod
from typing import Any

import numpy as np

from tidal import fork_safe

MIN_BYTES = 1 << 20  # smaller arrays are malloc's, which reuses them without faults
MAX_POOL_BYTES = 256 << 20  # buffers kept for reuse, in use or not


class Recycled:
    """``empty(shape, dtype)``: an array in a buffer of the pool that nothing else holds, or new."""

    def __init__(self, max_bytes: int = MAX_POOL_BYTES):
        self._bases: list[np.ndarray] = []
        self._bytes = 0
        self._max = max_bytes
        self._lock = fork_safe.Lock()
        # kept: a loader's generator left open at interpreter exit trims the pool after the
        # interpreter has set the modules' names to None
        self._refs = sys.getrefcount

    def empty(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        dtype = np.dtype(dtype)
        nbytes = prod(shape) * dtype.itemsize
        if nbytes < MIN_BYTES:
            return np.empty(shape, dtype)
        with self._lock:
            base = self._free(nbytes)
            if base is None:
                base = np.empty(nbytes, np.uint8)
                self._forget_free(self._max - nbytes)  # bundles grow at first: room for this size
                if self._bytes + nbytes <= self._max:
                    self._bases.append(base)
                    self._bytes += nbytes
            return base[:nbytes].view(dtype).reshape(shape)

    def trim(self) -> None:
        """Forget the buffers nothing holds (a loader's pass ended: no more bundles soon)."""
        with self._lock:
            self._forget_free(0)

    def _forget_free(self, until: int) -> None:
        """Forget free buffers, oldest first, until the pool keeps at most ``until`` bytes."""
        i = 0
        while self._bytes > until and i < len(self._bases):
            if self._refs(self._bases[i]) == 2:  # the list, getrefcount's argument
                self._bytes -= len(self._bases.pop(i))
            else:
                i += 1

    def _free(self, nbytes: int) -> np.ndarray | None:
        """A kept buffer of ``nbytes`` to twice that which only this pool refers to."""
        for base in self._bases:
            # references: the list, this loop's name, getrefcount's argument; a live view adds one
            if nbytes <= len(base) <= 2 * nbytes and self._refs(base) == 3:
                return base
        return None


RECYCLED = Recycled()  # the training process's, for every loader in it
