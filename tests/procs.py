"""Processes for the tests: start them at once, wait with a deadline, and leave nothing behind.

The multi-process tests start real processes: ``torch.distributed.run`` and its ranks, plain
processes given RANK/WORLD_SIZE, readers of a shared cache. Killing the process we started,
or its process group, is not enough: torchrun starts each rank in a session of its own, a
rank forks DataLoader workers, and a process whose parent died is adopted by init. So each
:class:`Tree` of commands is found and killed as a whole:

- every command starts in its own session, with an environment that carries a mark,
  ``TIDAL_TEST_TREE=<token>``, which all its descendants inherit;
- when the tree is left (success, failure, timeout or an exception in the test), every live
  process that carries the mark (``/proc/<pid>/environ``: this finds an orphan, which has lost
  its parent link) or descends from one that does (the parent links of ``/proc/<pid>/stat``:
  this finds a process started with another environment) is stopped with SIGSTOP; the search
  is repeated until it finds nothing new (a stopped process cannot fork), then all of them get
  SIGKILL, and the tree waits until none is left;
- on a timeout, the frozen processes get SIGABRT one at a time, so that Python's fault handler
  (``PYTHONFAULTHANDLER=1`` in :func:`child_env`) writes the stack of each of its threads, as
  they were when the tree froze, into the output the failure reports: where a rank or a
  DataLoader worker was stuck.

Output goes to unnamed temporary files, never to pipes: a straggler holding a pipe open keeps
its reader waiting for an end of file that never comes, and a full pipe stalls a writer.

>>> out = torchrun(SCRIPT, str(config), nproc=2, env=child_env(tmp_path / "cache"))
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

TIMEOUT = 120.0  # seconds for a whole run: a few times what the slowest takes on 2 busy cores
MARK = "TIDAL_TEST_TREE"
TOPOLOGY = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE"}
TOPOLOGY |= {"ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT"}  # and TORCHELASTIC_*
TAIL = 6000  # characters of each output in a failure report
TAIL_AFTER_TIMEOUT = 24000  # with the stack dumps
PROC = os.path.isdir("/proc")  # Linux: the tree is found through /proc; elsewhere, the sessions we started


class ProcessFailed(AssertionError):
    """A command exited with an error or did not finish in time; the message has its output."""


@dataclass(frozen=True)
class Command:
    """``argv`` run with ``env``; ``what`` names it in a failure report."""

    what: str
    argv: Sequence[str]
    env: dict[str, str]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child_env(cache: Path | None = None, **extra: str) -> dict[str, str]:
    """This process's environment without a topology (RANK, WORLD_SIZE, MASTER_*, TORCHELASTIC_*),
    with one torch thread, a fault handler, ``TIDAL_CACHE_DIR=cache`` when given, and ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in TOPOLOGY and k != MARK and not k.startswith("TORCHELASTIC_")}
    env.update(OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1")
    if cache is not None:
        env["TIDAL_CACHE_DIR"] = str(cache)
    env.update(extra)
    return env


def torchrun_argv(script: Path | str, *args: str, nproc: int) -> list[str]:
    """``python -m torch.distributed.run`` on one node with ``nproc`` ranks, rendezvous on a free port."""
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", "1", "--nproc_per_node", str(nproc),
        "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
        str(script), *args,
    ]  # fmt: skip


def torchrun(script: Path | str, *args: str, nproc: int, env: dict[str, str], timeout: float = TIMEOUT) -> str:
    """Run ``script`` under torchrun with ``nproc`` ranks (gloo on CPU is the script's business); its output."""
    argv = torchrun_argv(script, *args, nproc=nproc)
    what = " ".join(["torchrun --nproc_per_node", str(nproc), Path(script).name, *args])
    return run([Command(what, argv, env)], timeout)[0]


def plain_ranks(
    script: Path | str, *args: str, world_size: int, env: dict[str, str], timeout: float = TIMEOUT
) -> list[str]:
    """Run ``script`` in ``world_size`` concurrent processes given RANK/WORLD_SIZE by hand; their outputs."""
    commands = [
        Command(
            f"rank {rank} of {Path(script).name}",
            [sys.executable, str(script), *args],
            {**env, "RANK": str(rank), "WORLD_SIZE": str(world_size)},
        )
        for rank in range(world_size)
    ]
    return run(commands, timeout)


def single(script: Path | str, *args: str, env: dict[str, str], timeout: float = TIMEOUT) -> str:
    """Run ``script`` in one fresh process; its output."""
    return run([Command(Path(script).name, [sys.executable, str(script), *args], env)], timeout)[0]


def run(commands: Sequence[Command], timeout: float = TIMEOUT) -> list[str]:
    """Start the commands at once, wait until all succeed (or raise :class:`ProcessFailed`), kill
    what is left of their tree; each command's standard output (its standard error is reported
    on failure only)."""
    with Tree(commands) as tree:
        return tree.wait(timeout)


class Tree:
    """Commands started at once, each in its own session; leaving the ``with`` kills their whole tree.

    >>> with Tree([Command("reader", [sys.executable, "-c", code], child_env())]) as tree:
    ...     tree.procs[0].poll()  # a test may watch, signal or wait for them itself
    ...     outputs = tree.wait(timeout=60)
    """

    def __init__(self, commands: Sequence[Command]):
        self.commands = list(commands)
        self.mark = f"{os.getpid()}-{uuid.uuid4().hex}"
        self.procs: list[subprocess.Popen] = []
        self._files: list[tuple[int, int]] = []  # descriptors of each command's stdout and stderr

    def __enter__(self) -> Tree:
        try:
            for command in self.commands:
                out, err = _output_file(), _output_file()
                self._files.append((out, err))
                env = {**command.env, MARK: self.mark}
                self.procs.append(
                    subprocess.Popen(command.argv, env=env, stdout=out, stderr=err, start_new_session=True)
                )
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def wait(self, timeout: float = TIMEOUT) -> list[str]:
        """Wait for every command; raise :class:`ProcessFailed` (after killing the tree) as soon as one
        fails, or when they are not all done in ``timeout`` seconds; else their standard outputs."""
        deadline = time.monotonic() + timeout
        while True:
            codes = [proc.poll() for proc in self.procs]
            failed = [i for i, code in enumerate(codes) if code not in (None, 0)]
            if failed:
                self.kill()
                i = failed[0]
                raise ProcessFailed(f"{self.commands[i].what} failed with exit status {codes[i]}\n{self.report()}")
            if None not in codes:
                return [self.output(i)[0] for i in range(len(self.procs))]
            if time.monotonic() > deadline:
                pending = [c.what for c, code in zip(self.commands, codes, strict=True) if code is None]
                self.dump_stacks()
                self.kill()
                raise ProcessFailed(
                    f"{', '.join(pending)} did not finish in {timeout:g} s; the stacks of every process of the "
                    f"tree, written when it was stopped, are in the output\n{self.report(TAIL_AFTER_TIMEOUT)}"
                )
            time.sleep(0.05)

    def output(self, i: int) -> tuple[str, str]:
        """What command ``i`` (and what it started) wrote so far: its standard output and standard error."""
        out, err = self._files[i]
        return _read(out), _read(err)

    def report(self, tail: int = TAIL) -> str:
        parts = []
        for i, command in enumerate(self.commands):
            out, err = self.output(i)
            for name, text in (("stdout", out), ("stderr", err)):
                if text:
                    cut = "...\n" if len(text) > tail else ""
                    parts.append(f"--- {command.what}: {name} ---\n{cut}{text[-tail:]}")
        return "\n".join(parts) or "(no output)"

    def dump_stacks(self, grace: float = 2.0) -> None:
        """Freeze the tree, then one process at a time: a header into its standard error (when that is
        one of our files), SIGABRT (no core file), SIGCONT, and ``grace`` seconds at most for it to
        end. Python's fault handler prints the stack of every thread as it was when the tree froze;
        the others stay stopped meanwhile, so none reacts to the end of another (torchrun would
        SIGTERM the ranks when one dies)."""
        if not PROC:
            self._killpg(signal.SIGABRT)
            time.sleep(grace)
            return
        ours = {_file_id(err): err for _, err in self._files}
        frozen = freeze(self.mark)
        parents = {pid: stat[1] if (stat := _stat(pid)) else "?" for pid in frozen}  # before any ends
        for pid, start in sorted(frozen.items()):
            err = ours.get(_file_id(f"/proc/{pid}/fd/2"))
            if err is not None:
                os.write(err, f"\n--- pid {pid} (parent {parents[pid]}): {_cmdline(pid)}\n".encode())
            with contextlib.suppress(OSError):
                resource.prlimit(pid, resource.RLIMIT_CORE, (0, resource.prlimit(pid, resource.RLIMIT_CORE)[1]))
            _signal(pid, start, signal.SIGABRT)
            _signal(pid, start, signal.SIGCONT)
            _wait_gone({pid: start}, grace)

    def kill(self) -> list[int]:
        """Stop and kill every live process of the tree, wait until they are gone and reap the ones
        we started; the pids killed. Raises if one survives."""
        # not Linux: the sessions we started are all we can find
        killed = kill_tree(self.mark) if PROC else self._killpg(signal.SIGKILL)
        for proc in self.procs:
            proc.wait()
        return killed

    def _killpg(self, sig: int) -> list[int]:
        hit = []
        for proc in self.procs:
            if proc.returncode is None:  # not reaped: its pid is not another process's yet
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, sig)
                    hit.append(proc.pid)
        return hit

    def close(self) -> None:
        """Kill the tree and close the files of the outputs."""
        try:
            self.kill()
        finally:
            for out, err in self._files:
                os.close(out)
                os.close(err)
            self._files = []


def freeze(mark: str) -> dict[int, int]:
    """SIGSTOP every live process that carries ``mark`` in its environment or descends from one that
    does, and search again until nothing new turns up; pid -> start time of the stopped ones."""
    stopped: dict[int, int] = {}
    for _ in range(100):  # each round stops what the last one missed; stopped processes cannot fork
        found = {pid: start for pid, start in _tree(mark).items() if pid not in stopped}
        if not found:
            break
        for pid, start in found.items():
            _signal(pid, start, signal.SIGSTOP)
        stopped.update(found)
    return stopped


def kill_tree(mark: str, timeout: float = 10.0) -> list[int]:
    """:func:`freeze` the processes of ``mark``, SIGKILL them all and wait until they are gone; the
    pids killed. Raises if one is still alive after ``timeout`` seconds."""
    stopped = freeze(mark)
    for pid, start in stopped.items():
        _signal(pid, start, signal.SIGKILL)
    survivors = _wait_gone(stopped, timeout)
    if survivors:
        raise RuntimeError(f"processes {survivors} of a test survived SIGKILL for {timeout:g} s")
    return sorted(stopped)


def alive(pid: int, start: int | None = None) -> bool:
    """Whether ``pid`` is a live process (not a zombie), and the one that started at ``start`` if given."""
    stat = _stat(pid)
    return stat is not None and stat[0] not in "ZX" and (start is None or stat[2] == start)


# -- /proc ---------------------------------------------------------------------------------------


def _output_file() -> int:
    """The descriptor of an unnamed file that every writer appends to, whatever offset another left."""
    fd, path = tempfile.mkstemp(prefix="tidal-test-output-")
    os.unlink(path)
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_APPEND)
    return fd


def _read(fd: int) -> str:
    """All of the file, read without moving the offset its writers share."""
    return os.pread(fd, os.fstat(fd).st_size, 0).decode(errors="replace")


def _file_id(file: int | str) -> tuple[int, int] | None:
    try:
        st = os.stat(file)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _cmdline(pid: int, limit: int = 300) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            text = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"
    return text if len(text) <= limit else text[:limit] + "..."


def _stat(pid: int) -> tuple[str, int, int] | None:
    """State, parent pid and start time (clock ticks after boot) of ``pid``, from ``/proc/<pid>/stat``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2 :].split()  # the command name may hold spaces and parentheses
    return fields[0].decode(), int(fields[1]), int(fields[19])


def _marked(pid: int, mark: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return mark in f.read().split(b"\0")
    except OSError:
        return False


def _tree(mark: str) -> dict[int, int]:
    """pid -> start time of the live processes that carry ``mark`` or descend from one that does."""
    me, needle = os.getpid(), f"{MARK}={mark}".encode()
    procs: dict[int, tuple[str, int, int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None and stat[0] not in "ZX":
            procs[int(entry.name)] = stat
    children: dict[int, list[int]] = {}
    for pid, (_, ppid, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    todo = [pid for pid in procs if pid != me and _marked(pid, needle)]
    found: set[int] = set()
    while todo:
        pid = todo.pop()
        if pid not in found and pid != me:
            found.add(pid)
            todo.extend(children.get(pid, []))
    return {pid: procs[pid][2] for pid in found}


def _signal(pid: int, start: int, sig: int) -> None:
    """``sig`` to ``pid`` if it is still the process that started at ``start`` (not a reused pid)."""
    if not alive(pid, start):
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _wait_gone(members: dict[int, int], timeout: float) -> list[int]:
    """Wait until none of ``members`` is alive, ``timeout`` seconds at most; those still alive."""
    deadline = time.monotonic() + timeout
    while (left := [pid for pid, start in members.items() if alive(pid, start)]) and time.monotonic() < deadline:
        time.sleep(0.02)
    return left
