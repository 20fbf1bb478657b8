"""Thread pools that go on working while the interpreter exits.

Once the main thread has ended, ``concurrent.futures`` refuses new work ("cannot schedule new
futures after interpreter shutdown") though the threads a script left running still run and
Python waits for them: a training loop in a thread of its own, the main thread done. Their
reads would fail at the next block. While Python waits for such a thread, :class:`Threads`
runs each task in a thread of its own (not in the caller's: a caller may hold a lock its task
takes), and waits for those too when it shuts down.
"""

from __future__ import annotations

import concurrent.futures.thread as _futures_thread
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


class Threads(ThreadPoolExecutor):
    """A ``ThreadPoolExecutor`` that takes work after the interpreter began to exit."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._late: list[threading.Thread] = []
        self._closed = False  # shut down by its owner (the interpreter's exit flags every pool shut down)

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        if not getattr(_futures_thread, "_shutdown", False) or self._closed or not _waited_for():
            return super().submit(fn, *args, **kwargs)
        future: Future[T] = Future()

        def run() -> None:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as exc:
                    future.set_exception(exc)

        thread = threading.Thread(target=run, name=f"{self._thread_name_prefix}-late", daemon=True)
        self._late = [t for t in self._late if t.is_alive()] + [thread]
        thread.start()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._closed = True
        super().shutdown(wait=wait, cancel_futures=cancel_futures)
        if wait:
            for thread in self._late:
                thread.join()


def _waited_for() -> bool:
    """Whether Python waits for a thread of the script's as it exits (one not a daemon): only
    then is the work worth doing. Daemon threads are left to stop where they are (their reads
    refused, as ``concurrent.futures`` refuses them): a library's native threads still decoding
    as the process ends can abort it."""
    main = threading.main_thread()
    return any(t.is_alive() and not t.daemon and t is not main for t in threading.enumerate())
