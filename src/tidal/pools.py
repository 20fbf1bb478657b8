"""Thread pools that go on working while the interpreter exits.

Once the main thread has ended, ``concurrent.futures`` refuses new work ("cannot schedule new
futures after interpreter shutdown") though the threads a script left running still run and
Python waits for them: a training loop in a thread of its own, the main thread done. Their
reads would fail at the next block. :class:`Threads` then runs each task in a thread of its
own (not in the caller's: a caller may hold a lock its task takes), and waits for those too
when it shuts down.
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

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        if not getattr(_futures_thread, "_shutdown", False) or self._shutdown:
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
        super().shutdown(wait=wait, cancel_futures=cancel_futures)
        if wait:
            for thread in self._late:
                thread.join()
