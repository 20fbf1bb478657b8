"""Work ahead of the training loop without torch: readers in threads or processes, and a thread
that runs any iterator ahead.

:class:`Pool` runs one rank's readers (workers), each a
:class:`~tidal.iterator.DatasetIterator` over its share, in background threads or in
processes started with ``spawn``. Each worker sends bundles of batches with its reader state
after each batch (:mod:`tidal.transport.bundles`) through a bounded queue of its own, so a worker reads
at most ``depth`` bundles ahead and ``fetch(w)`` always returns worker ``w``'s next bundle:
the round robin never holds more than one bundle per worker. An error in a worker is sent
down its queue and raised where the loop fetches from it; a worker process that dies is
named. Nothing is shared but the queues: a worker starts from a reader state and needs no
coordination.

:class:`Ahead` runs an iterator in a background thread, ``depth`` items ahead: the loaders
use it to put the next batches on the devices while the training step runs. Its items
carry the state after them, which the loader applies only when it hands an item to the
training loop, so what is read ahead never counts as consumed.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import pickle
import queue
import threading
import time
import traceback
from collections.abc import Generator, Iterator
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from tidal.errors import ArgumentError, StorageError, TidalError
from tidal.stages.policy import Reports, hold_reports, reports_kept
from tidal.state import keys as k
from tidal.transport import orphans, spawn_turns, warmup
from tidal.transport.bundles import MAX_BUNDLE, Bundle, Widen, bundles, check_pickles
from tidal.world import World

if TYPE_CHECKING:
    from tidal.dataset import Dataset

T = TypeVar("T")
WorkerType = Literal["thread", "process"]
JOIN_S = 10.0  # how long closing waits for a worker before giving up (threads) or killing it (processes)
POLL_S = 0.1


class _Failure:
    """An error raised in a worker, on its way to the loop that fetches from it."""

    def __init__(self, exc: BaseException, crossing: bool):
        if crossing:  # to another process: the traceback does not pickle, so it travels as a note
            text = "".join(traceback.format_exception(exc)).rstrip()
            exc.add_note(f"raised in a tidal reader process:\n{text}")
            try:
                pickle.loads(pickle.dumps(exc))
            except Exception:
                exc = TidalError(f"{type(exc).__name__}: {exc}\n{text}")
        self.exc = exc


_running: dict[threading.Thread, Any] = {}  # the background threads alive, and the stop event of each


def _start(thread: threading.Thread, stop: Any) -> None:
    _running[thread] = stop
    thread.start()


@atexit.register
def _stop_all() -> None:
    """At exit, stop the threads still running (a loop that broke off and dropped its loader)
    before the interpreter tears down: a daemon thread cut off inside native code (Arrow, XLA)
    while Python shuts down aborts the process."""
    for stop in list(_running.values()):
        stop.set()
    deadline = time.monotonic() + JOIN_S
    for thread in list(_running):
        thread.join(max(0.0, deadline - time.monotonic()))


def _put(out: Any, item: Any, stop: Any) -> bool:
    """Put ``item`` on the bounded queue ``out`` unless ``stop`` is set first; whether it went."""
    while not stop.is_set():
        try:
            out.put(item, timeout=POLL_S)
            return True
        except queue.Full:
            continue
    return False


def _read(
    dataset: Dataset,
    world: World,
    state: dict | None,
    first_epoch: int,
    origin: dict | None,
    weights: dict | None,
    process: bool,
    widen: Widen,
    out: Any,
    stop: Any,
    loop: int,
    taken: Taken | None = None,
    reports: Reports | None = None,
    gate: warmup.WarmupGate | None = None,
) -> None:
    """One worker: its reader's bundles onto ``out`` until the end, an error, or ``stop``; a
    process exits with ``loop``, the training process, if that is killed. ``taken``: a pass
    started early, whose reports of bad data wait until it is taken; ``reports``: the bad records
    the pass's readers reported (see :class:`tidal.stages.policy.Reports`); ``gate``: reader
    processes warm up in the loop's order, as DataLoader workers do (:mod:`tidal.transport.warmup`)."""
    if process:
        orphans.exit_with(loop)
    if taken is not None:
        hold_reports(taken, process)
    where = f"state['{k.RANKS}'][{world.rank}]['{k.WORKERS}'][{world.worker}]"

    def opened() -> Iterator[Bundle]:
        with reports_kept(reports, process):
            it = dataset.iterator(world, state, first_epoch, origin, where, weights)
        # across processes, bundles grow to many batches (one message, few buffers); threads pass objects
        return bundles(it, world.worker, process, widen, MAX_BUNDLE if process else 1)

    try:
        for bundle in gate.gated(opened, world.worker) if gate is not None else opened():
            if not _put(out, bundle, stop):
                break
    except BaseException as exc:
        _put(out, _Failure(exc, crossing=process), stop)
    finally:
        _running.pop(threading.current_thread(), None)
    if process and stop.is_set():
        out.cancel_join_thread()  # exit now; the loop no longer reads what is still buffered


class Pool:
    """One rank's ``workers`` readers, in threads or spawned processes; ``fetch(w)`` is worker
    ``w``'s next bundle. ``workers=0``: one reader, read in the calling thread.

    ``states``: per worker, the reader state to continue from (None: the start of its share).
    ``widen`` converts numeric arrays in the worker (token ids to the loop's integer type).
    ``weights``: the mixture weights set on the loader, if any. ``taken``: a pass started early
    (its workers hold their reports of bad data until it is taken; made from ``spawn`` for processes).
    ``reports``: the bad records the pass's readers reported, none of which they report again.
    ``first``: the worker the loop asks first: reader processes warm up, and beyond the cores are
    spawned, in turn from it (:mod:`tidal.transport.warmup`, :mod:`tidal.transport.spawn_turns`).
    """

    def __init__(
        self,
        dataset: Dataset,
        ranks: World,
        states: list[dict | None],
        first_epoch: int,
        origin: dict | None,
        *,
        workers: int,
        worker_type: WorkerType,
        widen: Widen,
        depth: int = 4,
        weights: dict | None = None,
        taken: Taken | None = None,
        reports: Reports | None = None,
        first: int = 0,
    ):
        if worker_type not in ("thread", "process"):
            raise ArgumentError(f"worker_type must be 'thread' or 'process', not {worker_type!r}")
        self._n = max(1, workers)
        self._process = workers > 0 and worker_type == "process"
        self._closed = False
        self._inline: Iterator[Bundle] | None = None
        self._queues: list[Any] = []
        self._workers: list[Any] = []
        worlds = [ranks.with_worker(w, self._n) for w in range(self._n)]
        if workers == 0:
            where = f"state['{k.RANKS}'][{ranks.rank}]['{k.WORKERS}'][0]"
            with reports_kept(reports):
                it = dataset.iterator(worlds[0], states[0], first_epoch, origin, where, weights)
            self._inline = bundles(it, 0, False, widen, 1)
            return
        gate = None
        if self._process:
            check_pickles(dataset.stage, "tidal.jax.Loader workers started with 'spawn'")
            ctx = multiprocessing.get_context("spawn")
            self._stop: Any = ctx.Event()
            self._queues = [ctx.Queue(maxsize=depth) for _ in range(self._n)]
            gate = warmup.start_gate(ctx, self._n, first)
        else:
            self._stop = threading.Event()
            self._queues = [queue.Queue(maxsize=depth) for _ in range(self._n)]
        self._gate = gate  # kept while the pool lives: spawned workers open its semaphores as they start
        make: Any = ctx.Process if self._process else threading.Thread
        self._workers = [None] * self._n
        with spawn_turns.started_in_turn(gate, "spawn", self._n) as spawning:
            if spawning is not None:
                make = spawning.Process
            for w in [(first + t) % self._n for t in range(self._n)]:  # the loop's order: spawned in turn
                args = (
                    dataset,
                    worlds[w],
                    states[w],
                    first_epoch,
                    origin,
                    weights,
                    self._process,
                    widen,
                    self._queues[w],
                    self._stop,
                    os.getpid(),
                    taken,
                    reports,
                    gate,
                )
                worker = make(target=_read, args=args, daemon=True, name=f"tidal-reader-{ranks.rank}-{w}")
                if self._process:
                    worker.start()
                else:
                    _start(worker, self._stop)
                self._workers[w] = worker

    @property
    def workers(self) -> int:
        """Readers of this rank (1 when reading in the calling thread)."""
        return self._n

    def fetch(self, w: int) -> Bundle:
        """Worker ``w``'s next bundle; an error it raised is raised here."""
        if self._inline is not None:
            return next(self._inline)
        while True:
            try:
                got = self._queues[w].get(timeout=1.0)
            except queue.Empty:
                worker = self._workers[w]
                if not worker.is_alive() and self._queues[w].empty():
                    code = getattr(worker, "exitcode", None)
                    raise StorageError(
                        f"tidal reader {w} ended without its data (exit code {code}); its error, if any, is "
                        "above. Readers started with spawn import the main script again: guard its code "
                        "with `if __name__ == '__main__':`"
                    ) from None
                continue
            if isinstance(got, _Failure):
                raise got.exc
            return got

    def close(self, wait: bool = True) -> None:
        """Stop the workers and wait for them (processes that do not stop in time are killed).
        ``wait=False``: processes are killed now, threads end after the bundle they are making."""
        if self._closed:
            return
        self._closed = True
        if self._inline is not None:
            if wait:  # else it may be running in a thread that stops (it is closed as it goes)
                self._inline.close()  # type: ignore[attr-defined]
            return
        self._stop.set()
        if not wait:
            for worker, q in zip(self._workers, self._queues, strict=True):
                if self._process:
                    worker.kill()
                    worker.join()
                    q.close()
                    q.join_thread()
            return
        deadline = time.monotonic() + JOIN_S
        for worker, q in zip(self._workers, self._queues, strict=True):
            while worker.is_alive() and time.monotonic() < deadline:
                _drain(q)  # a worker blocked on a full queue, or flushing one, moves on
                worker.join(POLL_S)
            if self._process:
                if worker.is_alive():
                    worker.kill()
                    worker.join()
                _drain(q)
                q.close()
                q.join_thread()

    def __del__(self) -> None:  # not closed: let the workers stop on their own (they are daemons)
        stop = getattr(self, "_stop", None)
        if stop is not None and not self._closed:
            stop.set()


def _drain(q: Any) -> None:
    try:
        while True:
            q.get_nowait()
    except (queue.Empty, OSError, ValueError):
        pass


class _End:
    pass


class Ahead(Iterator[T], Generic[T]):
    """The items of ``source``, made up to ``depth`` ahead in a background thread; an error
    raised there is raised here, at the item where it happened.

    ``source`` runs in that thread only, from the first item to its end (it is closed there),
    so it may be any iterator, a generator included. The thread holds no reference to this
    object: dropping it stops the thread.
    """

    def __init__(self, source: Iterator[T], depth: int, name: str = "tidal-ahead"):
        if depth < 1:
            raise ArgumentError(f"depth must be at least 1, not {depth}")
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(target=_ahead, args=(source, self._queue, self._stop), daemon=True, name=name)
        _start(self._thread, self._stop)

    def __next__(self) -> T:
        if self._done:
            raise StopIteration
        got = self._queue.get()
        if isinstance(got, tuple):
            return got[0]
        self._done = True
        self._thread.join()  # the source is no longer in use once this returns
        if isinstance(got, _Failure):
            raise got.exc
        raise StopIteration

    def stop(self) -> None:
        """Stop the thread without waiting: it lets go of ``source`` after the item it is making."""
        self._done = True
        self._stop.set()

    def close(self) -> None:
        """Stop the thread and wait until it has let go of ``source``."""
        self._done = True
        self._stop.set()
        while self._thread.is_alive():
            _drain(self._queue)
            self._thread.join(POLL_S)

    def __del__(self) -> None:
        stop = getattr(self, "_stop", None)
        if stop is not None:
            stop.set()


def _ahead(source: Iterator[Any], out: queue.Queue[Any], stop: threading.Event) -> None:
    """:class:`Ahead`'s thread: each item as a 1-tuple, then the end or the error."""
    try:
        for item in source:
            if not _put(out, (item,), stop):
                return
        _put(out, _End(), stop)
    except BaseException as exc:
        _put(out, _Failure(exc, crossing=False), stop)
    finally:
        try:
            close = getattr(source, "close", None)
            if close is not None:
                close()
        finally:
            _running.pop(threading.current_thread(), None)


class Dropped(Exception):
    """Raised in a reader of a pass started early and dropped: it ends, reporting nothing."""


class Taken:
    """Whether ``iter()`` has taken a pass its loader started early: until then its readers hold
    their reports of bad data (:func:`tidal.stages.policy.hold_reports`). Made from the
    multiprocessing ``context`` its reader processes start from (None: readers in threads)."""

    def __init__(self, context: Any = None):
        self._taken = context.Event() if context is not None else threading.Event()
        self._dropped = context.Event() if context is not None else threading.Event()
        self._seen = False

    def take(self) -> None:
        self._taken.set()

    def drop(self) -> None:
        self._dropped.set()

    def wait(self) -> None:
        """Return once the pass is taken; raise :class:`Dropped` once it is dropped."""
        if self._seen:
            return
        while not self._taken.wait(POLL_S):
            if self._dropped.is_set():
                raise Dropped("a pass started early and dropped reports no bad data")
        self._seen = True


def reporting_when_taken(source: Iterator[T], taken: Taken) -> Generator[T]:
    """``source``, run from the thread that first asks with its reports held until ``taken``."""
    hold_reports(taken, process=False)
    yield from source


class _HandedOver:
    pass


class HeadStart(Iterator[T], Generic[T]):
    """The items of ``source``, its first ``depth`` made from now on in a background thread, the
    rest in the caller's thread as it asks for them: a reader in the training process starts
    before the loop asks (a loader started early) and costs no thread after its first items.

    ``source`` runs in one thread at a time: the background thread until it has made its items
    (or is stopped), then the caller's. :meth:`close` stops the thread after the item it is making.
    """

    def __init__(self, source: Iterator[T], depth: int, name: str = "tidal-head-start"):
        self._source = source
        self._made: queue.Queue[Any] = queue.Queue()
        self._stop = threading.Event()
        self._done = False
        self._thread: threading.Thread | None = threading.Thread(
            target=_head, args=(source, depth, self._made, self._stop), daemon=True, name=name
        )
        _start(self._thread, self._stop)

    def __next__(self) -> T:
        if self._done:
            raise StopIteration
        if self._thread is not None:
            got = self._made.get()
            if isinstance(got, tuple):
                return got[0]
            self._thread.join()
            self._thread = None  # the source is the caller's from here on
            if isinstance(got, _Failure):
                self._done = True
                raise got.exc
            if isinstance(got, _End):
                self._done = True
                raise StopIteration
        return next(self._source)

    def close(self) -> None:
        """Stop: the thread lets go of the source after the item it is making and closes it."""
        self._done = True
        self._stop.set()
        if self._thread is None or not self._thread.is_alive():
            close = getattr(self._source, "close", None)
            if close is not None:
                close()

    def __del__(self) -> None:
        stop = getattr(self, "_stop", None)
        if stop is not None and getattr(self, "_thread", None) is not None:
            stop.set()


def _head(source: Iterator[Any], depth: int, out: queue.Queue[Any], stop: threading.Event) -> None:
    """:class:`HeadStart`'s thread: its first items as 1-tuples, then the end, an error, or the
    hand-over; stopped first, it closes the source."""
    try:
        for _ in range(depth):
            if stop.is_set():
                break
            try:
                item = next(source)
            except StopIteration:
                out.put(_End())
                return
            out.put((item,))
        else:
            out.put(_HandedOver())
            return
        close = getattr(source, "close", None)
        if close is not None:
            close()
    except BaseException as exc:
        out.put(_Failure(exc, crossing=False))
    finally:
        _running.pop(threading.current_thread(), None)
