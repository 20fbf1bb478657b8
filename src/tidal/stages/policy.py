"""A reader's ``errors=`` policy: what happens to bad data (raise, skip and count, or a function)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from tidal.errors import FormatError, TidalError
from tidal.formats import Errors

log = logging.getLogger("tidal")

_held = threading.local()  # gate: the reader of this thread's (readers in threads)
_held_here: Any = None  # the reader of this process's (a DataLoader worker, a reader process)


def hold_reports(gate: Any, process: bool) -> None:
    """Hold this reader's reports of bad data (a function's calls, the log) until ``gate.wait()``
    returns: a loader started early reports nothing for a pass it drops before ``iter()`` takes it
    (a state loaded since, other ranks), and the reports of the pass it takes as they were met.
    ``process``: for every thread of this process (a worker's one reader), else this thread's."""
    global _held_here
    if process:
        _held_here = gate
    else:
        _held.gate = gate


class Policy:
    """One reader's ``errors`` policy: raises, or skips and remembers what it skipped.

    Under ``"skip"`` each file with skipped data is logged once (logger ``tidal``, WARNING,
    with the first error's location; the rest are counted in ``stats()``); a function is
    given every error instead, and stops the reader by raising. Either way what is skipped
    is counted, and the first few errors are kept for the message of a reader that skipped
    everything.
    """

    KEEP = 3

    def __init__(self, errors: Errors, quiet: bool = False):
        self.errors = errors
        self.quiet = quiet  # a replay (tidal.stages.Context.replay): skipped as the run did, not reported again
        self.first: list[str] = []  # the first few errors skipped
        self.logged: set[str] = set()
        self.bad_files: set[str] = set()  # files with a part (not a record) unreadable
        self.stopped: BaseException | None = None  # what the user's function raised
        # whether row ``row`` of file ``path`` is in this reader's share of the block being read
        self.owns: Callable[[str, int], bool] | None = None
        # while a block's files are read in threads: what they skipped, per file, handed over
        # afterwards in file order (see replay), so that logs, counts and a function see what
        # reading them one by one shows
        self.deferred: dict[str, list[TidalError]] | None = None

    def for_file(self, path: str) -> FilePolicy:
        return FilePolicy(self, path)

    def __call__(self, path: str, error: TidalError) -> None:
        deferred = self.deferred
        if deferred is not None:
            deferred.setdefault(path, []).append(error)
            return
        self.now(path, error)

    def now(self, path: str, error: TidalError, mine: bool = False) -> None:
        """The policy on ``error`` at once, whatever threads are reading. A bad record another
        reader yields (readers read whole blocks, each yielding its share) is that reader's to
        raise or count: ``mine`` when it is known to be this reader's (found bad downstream)."""
        row = getattr(error, "row", None)
        if not mine and row is not None and self.owns is not None and not self.owns(path, row):
            return
        if self.errors == "raise" or not (self.errors == "skip" or callable(self.errors)):
            raise error
        if self.quiet:
            return
        gate = getattr(_held, "gate", None) or _held_here
        if gate is not None:
            gate.wait()  # (raises in a pass dropped before it was taken)
        if callable(self.errors):
            try:
                self.errors(error)
            except BaseException as exc:
                self.stopped = exc
                raise
        if len(self.first) < self.KEEP:
            self.first.append(str(error))
        if isinstance(error, FormatError):
            self.bad_files.add(path)
        if self.errors == "skip" and path not in self.logged:  # a function logs if it wants to
            self.logged.add(path)
            log.warning("skipping bad data: %s [more in this file is counted in stats(), not logged]", error)

    def replay(self, path: str, deferred: dict[str, list[TidalError]]) -> None:
        """Hand over what reading ``path`` in a thread skipped, in its order (a function may raise)."""
        for error in deferred.pop(path, []):
            self(path, error)


class FilePolicy:
    """The policy as a format reader of one file calls it (``errors(error)``)."""

    def __init__(self, policy: Policy, path: str):
        self._policy, self._path = policy, path

    def __call__(self, error: TidalError) -> None:
        self._policy(self._path, error)
