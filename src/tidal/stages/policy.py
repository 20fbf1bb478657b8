"""A reader's ``errors=`` policy: what happens to bad data (raise, skip and count, or a function)."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from tidal.errors import FormatError, MissingDependency, SchemaError, StateError, StorageError, TidalError
from tidal.formats import Errors
from tidal.formats.bad_data import data_errors, exhausted

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


class Reports:
    """The bad records a pass's readers reported (to the ``errors`` function, or counted as skipped),
    so that the readers that replace them in the same pass (``set_weights`` restarts them at the
    ledger's position, behind where they had read ahead) report none of them again.

    Readers run in worker processes, threads or the training process; each appends what it reports
    to a file of its own in ``directory`` (bad records are rare: a line each, nothing when there
    are none), and :meth:`gathered` reads them all once those readers are stopped. ``before``: the
    reports of the readers replaced so far, as ``(source key, epoch, path, row)``."""

    def __init__(self, directory: str, tag: str, before: frozenset[tuple[str, int, str, int]] = frozenset()):
        self.directory, self.tag, self.before = directory, tag, before

    def add(self, key: tuple[str, int, str, int]) -> None:
        name = f"{self.tag}-{os.getpid()}-{threading.get_ident()}"
        with open(os.path.join(self.directory, name), "a", encoding="utf-8") as f:
            f.write("\t".join(map(str, key)) + "\n")

    def gathered(self) -> Reports:
        """These reports with those the readers made since (read from their files)."""
        got = set(self.before)
        try:
            names = [n for n in os.listdir(self.directory) if n.startswith(self.tag + "-")]
        except OSError:
            names = []
        for name in names:
            try:
                with open(os.path.join(self.directory, name), encoding="utf-8") as f:
                    for line in f:
                        parts = line.rstrip("\n").rsplit("\t", 3)
                        if len(parts) == 4 and line.endswith("\n"):  # (a line cut short: its reader was killed)
                            got.add((parts[0], int(parts[1]), parts[2], int(parts[3])))
            except (OSError, ValueError):
                continue
        return Reports(self.directory, self.tag, frozenset(got))

    def rows(self, key: str, epoch: int) -> dict[str, set[int]]:
        """Per path, the rows of ``epoch`` of source ``key`` reported before."""
        out: dict[str, set[int]] = {}
        for k_, e, path, row in self.before:
            if k_ == key and e == epoch:
                out.setdefault(path, set()).add(row)
        return out

    def clear(self) -> None:
        """Delete the readers' files (the pass is over)."""
        try:
            names = [n for n in os.listdir(self.directory) if n.startswith(self.tag + "-")]
        except OSError:
            return
        for name in names:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.directory, name))


class HeldReports(Reports):
    """:class:`Reports` kept in this process's memory: a ``tidal.ray`` reader's actor, which the
    training machine's folder is out of reach of, records its reports here for the actor's life,
    and :meth:`made` hands them back as plain data (``[key, epoch, path, row]`` lists)."""

    def __init__(self, before: frozenset[tuple[str, int, str, int]] = frozenset()):
        super().__init__("", "", before)
        self._made: set[tuple[str, int, str, int]] = set()

    def add(self, key: tuple[str, int, str, int]) -> None:
        self._made.add(key)

    def made(self) -> list[list[Any]]:
        """What the readers recording here reported (``before`` left out), as :func:`as_rows` lists."""
        return as_rows(self._made)

    def gathered(self) -> Reports:
        return HeldReports(self.before | frozenset(self._made))

    def clear(self) -> None:
        self._made.clear()


def as_rows(keys: Iterable[tuple[str, int, str, int]]) -> list[list[Any]]:
    """Report keys as plain ``[source key, epoch, path, row]`` lists, sorted (to cross to a Ray actor)."""
    return [list(key) for key in sorted(keys)]


def as_keys(rows: Iterable[Sequence[Any]]) -> frozenset[tuple[str, int, str, int]]:
    """The report keys of :func:`as_rows` lists."""
    return frozenset((str(a), int(b), str(c), int(d)) for a, b, c, d in rows)


_directory: str | None = None  # this process's folder of Reports files (removed at exit)


def fresh_reports() -> Reports:
    """The reports of a pass about to start: none yet."""
    global _directory
    if _directory is None or not os.path.isdir(_directory):
        import shutil  # only for a loader's passes: not at `import tidal`
        import tempfile

        _directory = tempfile.mkdtemp(prefix="tidal-reports-")
        atexit.register(shutil.rmtree, _directory, True)
    return Reports(_directory, uuid.uuid4().hex)


_book_here: Reports | None = None  # the reports of this process's reader (a DataLoader worker)


@contextlib.contextmanager
def reports_kept(book: Reports | None, process: bool = False) -> Iterator[None]:
    """Readers opened inside it record what they report in ``book`` and report nothing it holds
    from before; ``process``: for every reader this process opens from now on (a worker's)."""
    global _book_here
    if process:
        _book_here = book
        yield
        return
    was = getattr(_held, "book", None)
    _held.book = book
    try:
        yield
    finally:
        _held.book = was


def book_kept() -> Reports | None:
    """The reports readers opened here now record theirs in (see :func:`reports_kept`): a stage
    that opens readers later (a mixture restarting a stream that ended) opens them in it again."""
    return getattr(_held, "book", None) or _book_here


class Policy:
    """One reader's ``errors`` policy: raises, or skips and remembers what it skipped.

    Under ``"skip"`` each file with skipped data is logged once (logger ``tidal``, WARNING,
    with the first error's location; the rest are counted in ``stats()``); a function is
    given every error instead, and stops the reader by raising. Either way what is skipped
    is counted, and the first few errors are kept for the message of a reader that skipped
    everything.
    """

    KEEP = 3

    def __init__(self, errors: Errors, quiet: bool = False, key: str = "", epoch: Callable[[], int] | None = None):
        self.errors = errors
        self.key = key  # the source key of the reader (see tidal.stages.Context.key)
        self.epoch = epoch  # the epoch the reader is in
        # what the readers this one replaces in the pass reported (set_weights): not again
        self.book = None if quiet else book_kept()
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

    def reported_before(self, epoch: int) -> dict[str, set[int]]:
        """Per path, the rows of ``epoch`` whose bad records the readers this one replaces reported."""
        return self.book.rows(self.key, epoch) if self.book is not None and self.book.before else {}

    def now(self, path: str, error: TidalError, mine: bool = False) -> bool:
        """The policy on ``error`` at once, whatever threads are reading. A bad record another
        reader yields (readers read whole blocks, each yielding its share) is that reader's to
        raise or count: ``mine`` when it is known to be this reader's (found bad downstream).
        False where it is not this reader's, or was reported before in the pass (not counted again)."""
        row = getattr(error, "row", None)
        if not mine and row is not None and self.owns is not None and not self.owns(path, row):
            return False
        if self.errors == "raise" or not (self.errors == "skip" or callable(self.errors)):
            raise error
        if self.quiet:
            return True
        book = self.book
        key = None
        if book is not None and row is not None:
            owns = None if mine else self.owns
            epoch = getattr(owns, "epoch", None)
            if epoch is None and self.epoch is not None:
                epoch = self.epoch()
            if epoch is not None:
                key = (self.key, int(epoch), path, int(row))
                if key in book.before:
                    return False
                book.add(key)  # first: a reader stopped right after its report does not leave it to its successor
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
        return True

    def unreadable(self, path: str, exc: Exception) -> TidalError:
        """What a reader raised, as a FormatError naming the file; re-raised as it is where no
        policy may skip it (the network, a schema, a package not installed, the user's own stop, a
        record under "raise")."""
        if exc is self.stopped or isinstance(exc, (SchemaError, StorageError, StateError, MissingDependency)):
            raise exc
        short = exhausted(exc)
        if short is not None:  # the machine's fault, not the file's: never skipped
            raise StorageError(f"{path}: out of {short} while reading it: {exc}") from exc
        if isinstance(exc, TidalError):
            if self.errors == "raise":
                raise exc
            return exc
        if not isinstance(exc, data_errors()):
            raise exc  # not bad data: a bug, which no policy hides
        error = FormatError(f"{path}: unreadable ({type(exc).__name__}): {exc}")
        if self.errors == "raise":
            raise error from exc
        return error

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
