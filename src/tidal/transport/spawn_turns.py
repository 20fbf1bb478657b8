"""Spawned workers beyond the cores are sent their work when their turn to warm up comes.

A spawned worker is a fresh interpreter that imports what the training script imports (torch
above all: 2.6 s of a core) before it runs a line of tidal. Torch starts every worker at once,
so with more workers than cores all of them import side by side and the first batch, which
needs the first worker only, waits for a share of the cores that shrinks with every worker
(2 workers on 2 cores: 2.5 s; 8: 10 s). Here the interpreters still start at once (each has
its pid, as torch expects), but a worker beyond the first ``slots`` in the loop's order gets the
pickled process it is to run (the pipe it waits on at start, :mod:`multiprocessing.spawn`)
only once the workers before it have made their first batch, as
:class:`tidal.transport.warmup.WarmupGate` lets them: until then it waits on that pipe and
takes no core. With as many cores as workers nothing waits.

A worker never sent its work is killed when torch joins it (the pass ended before its turn):
it has run nothing.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import threading
import time
from collections.abc import Iterator
from multiprocessing import context, popen_spawn_posix, reduction, spawn
from multiprocessing import util as _util
from typing import Any

from tidal.transport.warmup import PATIENCE_S, POLL_S, WarmupGate

util: Any = _util  # (its stubs lack what spawning uses)
_releasing: _Releaser | None = None  # the pass whose workers torch is starting (see started_in_turn)


class _Popen(popen_spawn_posix.Popen):
    """A spawned interpreter started now, and sent its process when :meth:`release` is called."""

    _fds: list[int]

    def __init__(self, process_obj: Any, releaser: _Releaser):
        self._held: tuple[int, bytes] | None = None  # (the pipe to the worker, what to send on it)
        self._lock = threading.Lock()
        super().__init__(process_obj)
        releaser.hold(self)

    def _launch(self, process_obj: Any) -> None:
        from multiprocessing import resource_tracker

        tracker_fd: int = resource_tracker.getfd()  # type: ignore[assignment]
        self._fds.append(tracker_fd)
        sent = io.BytesIO()
        context.set_spawning_popen(self)
        try:
            reduction.dump(spawn.get_preparation_data(process_obj._name), sent)
            reduction.dump(process_obj, sent)
        finally:
            context.set_spawning_popen(None)
        parent_r, child_w = os.pipe()
        child_r, parent_w = os.pipe()
        try:
            command = _quiet_if_orphaned(spawn.get_command_line(tracker_fd=tracker_fd, pipe_handle=child_r))
            self._fds.extend([child_r, child_w])
            self.pid = util.spawnv_passfds(spawn.get_executable(), command, self._fds)
            self.sentinel = parent_r
        finally:
            self.finalizer = util.Finalize(self, util.close_fds, [parent_r, parent_w])
            os.close(child_r)
            os.close(child_w)
        self._held = (parent_w, sent.getvalue())

    def release(self) -> None:
        """Send the worker its process: it starts importing and running it."""
        with self._lock:
            held, self._held = self._held, None
        if held is None:
            return
        fd, data = held
        with contextlib.suppress(OSError), open(fd, "wb", closefd=False) as pipe:  # (killed meanwhile)
            pipe.write(data)

    def wait(self, timeout: float | None = None) -> int | None:
        with self._lock:
            idle = self._held is not None
            self._held = None
        if idle and self.returncode is None:  # joined before its turn: it ran nothing, and never will
            with contextlib.suppress(OSError):
                os.kill(self.pid, signal.SIGKILL)
        return super().wait(timeout)


def _quiet_if_orphaned(command: list[str]) -> list[str]:
    """``command`` with its program ending quietly where the pipe it reads first closes before
    anything came (the training process killed while the worker waited for its turn): spawn's
    EOFError would print a traceback in every such worker."""
    if "-c" not in command:  # (a frozen executable: its own entry point)
        return command
    at = command.index("-c") + 1
    wrapped = (  # only the EOFError of spawn's first read (pickle is C: _main is the last Python frame)
        f"import os\ntry:\n    {command[at]}\nexcept EOFError as e:\n    tb = e.__traceback__\n"
        "    while tb.tb_next:\n        tb = tb.tb_next\n"
        "    if tb.tb_frame.f_code.co_name != '_main':\n        raise\n    os._exit(1)\n"
    )
    return [*command[:at], wrapped, *command[at + 1 :]]


class _Releaser:
    """Sends each held worker its process once fewer than ``slots`` workers before it in the
    loop's order are still making their first batch (or after ``PATIENCE_S``)."""

    def __init__(self, gate: WarmupGate):
        self._gate = gate
        self._held: list[_Popen] = []

    def hold(self, popen: _Popen) -> None:
        turn = len(self._held)  # torch starts its workers in order, and its worker w is the w-th asked
        self._held.append(popen)
        if turn < self._gate.slots:
            popen.release()

    def start(self) -> None:
        if len(self._held) > self._gate.slots:
            threading.Thread(target=self._run, name="tidal-spawn-turns", daemon=True).start()

    def _run(self) -> None:
        gate, deadline = self._gate, time.monotonic() + PATIENCE_S
        turn = gate.slots
        while turn < len(self._held):
            if turn < gate.ready.value + gate.slots or time.monotonic() > deadline:
                self._held[turn].release()
                turn += 1
                continue
            time.sleep(POLL_S)
        self._held = []


class SpawnInTurn(context.SpawnContext):
    """The spawn context, its processes sent their work in turn (see the module)."""

    class Process(context.SpawnProcess):
        @staticmethod
        def _Popen(process_obj: Any) -> Any:
            if _releasing is None:
                return popen_spawn_posix.Popen(process_obj)
            return _Popen(process_obj, _releasing)


@contextlib.contextmanager
def started_in_turn(gate: WarmupGate | None, method: str, workers: int) -> Iterator[SpawnInTurn | None]:
    """A spawn context whose processes started in the block are sent their work in turn; None
    where the pass's workers are not spawned, or no more than the gate lets warm up at once."""
    global _releasing
    if gate is None or method != "spawn" or workers <= gate.slots or os.name != "posix":
        yield None
        return
    releaser = _releasing = _Releaser(gate)
    try:
        yield SpawnInTurn()
    finally:
        _releasing = None
    releaser.start()  # (not where starting them failed: torch stops those it started)
