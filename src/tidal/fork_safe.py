"""Locks that are free again in every child of ``fork``.

A process forked while another of its threads holds a lock gives the child that lock held for
ever: no thread of the child will release it. A DataLoader worker forked while a thread of the
training process held one of tidal's locks (reading a ``.npy`` header, counting a remote read,
releasing a loader's shared memory as the collector finalized it) waited on it without end.
Every lock of tidal that a forked child may take is a :class:`Lock`: the child gets a free one.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any


class Lock:
    """A ``threading.Lock`` for ``with`` blocks, replaced by a free one in a child of ``fork``."""

    __slots__ = ("__weakref__", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        _made.add(self)

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(self, *exc: Any) -> None:
        self._lock.release()

    def __reduce__(self) -> tuple:  # a pickled owner gets a free lock on the other side
        return (Lock, ())


_made: weakref.WeakSet[Lock] = weakref.WeakSet()


def _renew() -> None:
    for lock in list(_made):
        lock._lock = threading.Lock()


os.register_at_fork(after_in_child=_renew)
