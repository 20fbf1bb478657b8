"""Closing what the garbage collector drops, where closing it there could hang.

Closing a reader waits for its reads in flight (their threads joined). The collector may
finalize a dropped iterator in a thread that holds a lock of ``threading``'s which joining (or
starting) a thread takes, and waiting there hung the process for ever (seen once in the test
suite: a scan's thread starting up). Such a finalizer hands what it would close to one closer
thread per process (``SimpleQueue.put`` may be called from a finalizer); anywhere else, and in
a process that made no threads to join, it closes at once, as files are expected to be.

The closer thread is started by what makes the threads a close joins (a reader's threads, the
prefetcher), from ordinary code: a process without them stays without threads (forking one
that has threads is what Python 3.12 warns about).

An iterator still open as the interpreter exits (a script that ends mid-epoch, its iterator in
a global) is closed at exit, while its threads still run: closed later, by the collector once
the interpreter has frozen its daemon threads, it waited on a file's lock that a frozen thread
held, and the interpreter aborted the process ("could not acquire lock ... at interpreter
shutdown").
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
import weakref
from queue import Empty, SimpleQueue
from typing import Any

# threading's functions that hold its own locks (which starting and joining a thread take)
_HOLDING = frozenset(
    ["_maintain_shutdown_locks", "_set_tstate_lock", "_stop", "_delete", "_shutdown", "_after_fork", "start"]
)
_THREADING = threading.__file__
DRAIN_S = 10.0  # how long exit waits for the closes handed to the closer thread


class _Closer:
    def __init__(self) -> None:
        self.pid = -1
        self._queue: SimpleQueue[Any] = SimpleQueue()

    def start(self) -> None:
        """Start the thread in this process, if it has none yet."""
        if self.pid != os.getpid():
            self.pid, self._queue = os.getpid(), SimpleQueue()  # a fork's copy is the parent's
            threading.Thread(target=self._run, args=(self._queue,), name="tidal-close", daemon=True).start()

    def put(self, closable: Any) -> None:
        self._queue.put(closable)

    def drain(self, timeout: float = DRAIN_S) -> None:
        """Wait for the closes handed over so far: at exit, a close still running in this daemon
        thread as the interpreter tears down (pyarrow's readers) can abort the process."""
        if self.pid == os.getpid():
            done: SimpleQueue[bool] = SimpleQueue()
            self._queue.put(done)  # the thread answers once it gets to it, after what came before
            with contextlib.suppress(Empty):
                done.get(timeout=timeout)

    @staticmethod
    def _run(queue: SimpleQueue[Any]) -> None:
        while True:
            closable = queue.get()
            if isinstance(closable, SimpleQueue):
                closable.put(True)
                continue
            try:
                closable.close()
            except Exception:  # what a finalizer would have ignored
                continue


CLOSER = _Closer()
start = CLOSER.start
atexit.register(CLOSER.drain)

_OPEN: weakref.WeakSet[Any] = weakref.WeakSet()  # what close_at_exit was given, while it lives


def close_at_exit(closable: Any) -> None:
    """Call ``closable.at_exit()`` at exit, before the interpreter tears down, if it is still alive then."""
    _OPEN.add(closable)


def _close_open() -> None:
    for closable in list(_OPEN):
        with contextlib.suppress(Exception):
            closable.at_exit()


atexit.register(_close_open)  # registered after drain: runs before it (and both before teardown)


def close_dropped(closable: Any) -> None:
    """``closable.close()`` from a finalizer: at once, or by the closer thread where the collector
    interrupted threading's bookkeeping (its frames right above, one holding its lock)."""
    if not sys.is_finalizing() and CLOSER.pid == os.getpid() and _in_threading_bookkeeping(sys._getframe(2)):
        CLOSER.put(closable)
    else:
        closable.close()


def _in_threading_bookkeeping(frame: Any) -> bool:
    while frame is not None and frame.f_code.co_filename == _THREADING:
        if frame.f_code.co_name in _HOLDING:
            return True
        frame = frame.f_back
    return False
