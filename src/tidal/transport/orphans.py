"""A DataLoader worker whose training process is gone exits, however it was started.

Torch's worker watches its parent process. A forkserver's worker (Python 3.14's default start
method on Linux) has the server as its parent, and the server lives as long as any worker holds
its "alive" pipe: every worker does. So a training process killed (the OOM killer, ``kill -9``,
``os._exit``) left its forkserver workers running for ever, each holding its memory; a spawned
worker that started after its parent died watched the wrong parent too. Each worker here
watches the training process itself.
"""

from __future__ import annotations

import os
import threading
import time

CHECK_S = 1.0
_watching: set[int] = set()  # the training processes this process watches (one, in a worker)


def exit_with(loop: int) -> None:
    """In a worker: exit once process ``loop`` (the training process) is gone. Idempotent."""
    if loop in _watching or loop == os.getpid():
        return
    _watching.add(loop)
    threading.Thread(target=_watch, args=(loop,), name="tidal-orphan-watch", daemon=True).start()


def _watch(loop: int) -> None:
    while alive(loop):
        time.sleep(CHECK_S)
    os._exit(1)  # no clean-up: the process it worked for is gone


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True  # no /proc: signal 0 is all there is
