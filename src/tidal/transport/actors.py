"""Readers as Ray actors: a rank's readers on a Ray cluster's CPUs, each a worker that lives elsewhere.

:class:`Reader` is one reader (rank x reader, as a DataLoader worker is rank x worker): an
actor that opens the dataset at a reader state (``open``) and answers each ``next()`` call with
its next bundle of at most ``chunk`` batches, with the reader state after each
(:mod:`tidal.transport.bundles`). :class:`Actors` holds one rank's readers for the life of a
loader and starts them, for a pass, from the ledger's reader states (:meth:`Actors.start`: the
actors are opened again where they are, not started again: an actor takes seconds to start);
the :class:`Session` it returns is asked for reader ``w``'s next bundle (``fetch(w)``), as
:class:`tidal.transport.pool.Pool` is for threads and spawned processes.

- **Back-pressure.** An actor answers its calls in order and makes a bundle only when asked.
  ``fetch(w)`` asks for the next bundle as it receives one, so a reader makes one bundle while
  the loop takes the batches of the last: at most ``prefetch`` batches ahead of what the
  training process has taken (``chunk`` is half of it; with ``prefetch=1`` it is asked when
  its batch is wanted).
- **Transport.** Bundles travel through Ray's object store: columns are numpy arrays, which Ray
  serializes out of band (the training process reads them where they lie: zero-copy on the
  same node), text columns one UTF-8 buffer; states and marks are small.
- **Replacement.** A reader whose call fails because its actor died (killed, out of memory, its
  node lost) or whose next bundle does not come within ``timeout`` seconds is killed and
  replaced: a new actor opens the dataset at the state after the last batch the training process
  received from it, so its share goes on with the next batch and no record is lost or repeated.
  Its counters go on from those of the reader it replaces (``readers_replaced`` counts them). A
  reader lost :data:`LOST` times in a row before it sends a batch is an error; one that never sent
  a batch, on a cluster whose resources in all cannot hold the job's readers, is an error at its
  first timeout, naming what they need and what the cluster has (warned of as the pass starts).
- **Errors.** An error raised in a reader (a bad record, a missing file) comes back as data and
  is raised where the loop fetches, as it is: it is no reason to replace the reader, which would
  read the same record again.

Ray is imported when :class:`Actors` is made, never at module level: this module, and
:class:`Reader` which Ray pickles by reference, import neither Ray nor torch.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from tidal.errors import ArgumentError, StateError, StorageError, needs
from tidal.metrics import Mark, Streams
from tidal.stages import add_stats
from tidal.stages.policy import HeldReports, as_keys, as_rows, reports_kept
from tidal.state import schema
from tidal.transport.bundles import Bundle, bundles
from tidal.transport.pool import _Failure
from tidal.world import World

if TYPE_CHECKING:
    from tidal.dataset import Dataset

_log = logging.getLogger("tidal")

LOST = 3  # a reader replaced this many times in a row without sending a batch: an error, not again
FIXED_OPTIONS = (
    "max_restarts",
    "max_task_retries",
    "max_concurrency",
    "name",
    "namespace",
    "lifetime",
    "get_if_exists",
)
"""Actor options tidal sets or forbids: Ray restarting a reader would start it from its first
state again (tidal replaces readers from the ledger); a reader answers one call at a time; and
a name, a namespace or a detached lifetime would outlive the loader or clash between readers."""


def _contiguous(value: np.ndarray) -> np.ndarray:
    """Arrays as the reader made them (token ids narrow: the training process widens them)."""
    return np.ascontiguousarray(value)


class Reader:
    """One reader on a Ray worker, of ``dataset``: made an actor by :class:`Actors` (``ray.remote``),
    opened at a reader state by :meth:`open`. The dataset is opened at the first ``next()``, so an
    error opening it comes back as the answer to that call, not as a dead actor."""

    def __init__(self, dataset: Dataset, chunk: int):
        self._dataset = dataset
        self._chunk = chunk
        self._open: tuple | None = None
        self._made: Iterator[Bundle] | None = None
        self._book = HeldReports()  # the bad records it reported since opened (kept in this actor)

    def open(
        self,
        world: World,
        state: dict | None,
        first_epoch: int,
        origin: dict | None,
        weights: dict | None,
        reported: list[list[Any]] | None = None,
    ) -> None:
        """Read, from the next call on, as reader ``world.worker`` of rank ``world.rank`` from ``state``.
        ``reported``: the bad records the readers it replaces in the pass reported (``set_weights``,
        see :class:`tidal.stages.policy.Reports`), as :meth:`reported` lists them: not again."""
        if self._made is not None:
            getattr(self._made, "close", lambda: None)()  # (a generator: its files closed)
        self._open, self._made = (world, state, first_epoch, origin, weights), None
        self._book = HeldReports(as_keys(reported or ()))

    def reported(self) -> list[list[Any]]:
        """The bad records this reader reported since it was opened, as ``[source key, epoch, path, row]``."""
        return self._book.made()

    def next(self) -> Bundle | _Failure | None:
        """The next bundle; an error raised reading, as data; None after the last bundle."""
        try:
            if self._made is None:
                assert self._open is not None, "a reader is opened before it is asked"
                _threads_of_this_reader()
                world, state, first_epoch, origin, weights = self._open
                where = schema.reader_where(world.rank, world.worker)
                with reports_kept(self._book, process=True):  # (the actor's one reader, its threads too)
                    it = self._dataset.iterator(world, state, first_epoch, origin, where, weights)
                self._made = bundles(it, world.worker, True, _contiguous, self._chunk)
            return next(self._made)
        except StopIteration:
            return None
        except BaseException as exc:
            return _Failure(exc, crossing=True)

    def where(self) -> tuple[str, int]:
        """``(node id, process id)`` of this reader."""
        import ray

        return ray.get_runtime_context().get_node_id(), os.getpid()


def _threads_of_this_reader() -> None:
    """A reader's threads are the CPUs Ray gave it (``num_cpus``), not a share of its node's cores
    divided by the rank's readers as for DataLoader workers, which share the training machine:
    the tokenizer's pool, and the threads that read blocks. Values the user set are kept."""
    import ray

    cpus = max(1, int(ray.get_runtime_context().get_assigned_resources().get("CPU", 1)))
    os.environ.setdefault("RAYON_NUM_THREADS", str(cpus))
    if cpus > 1:  # (1 would mean no thread: a reader of one CPU reads as a worker of one core's share)
        os.environ.setdefault("TIDAL_READ_THREADS", str(min(4, cpus)))


def _shifted(mark: Mark, base: Streams | None) -> Mark:
    """A replacement's mark, its mixture's counts going on from ``base``, where its predecessor stood."""
    records, tokens, streams = mark
    if base is None or streams is None:
        return mark

    def plus(counts: dict[str, int]) -> dict[str, int]:
        return {n: base.records_at.get(n, 0) + v for n, v in counts.items()}

    def plus_tokens(counts: dict[str, int]) -> dict[str, int]:
        return {n: base.tokens_at.get(n, 0) + v for n, v in counts.items()}

    moved = Streams(
        plus(streams.records),
        plus_tokens(streams.tokens),
        streams.weights,
        plus(streams.records_at),
        plus_tokens(streams.tokens_at),
    )
    return records, tokens, moved


class Actors:
    """One rank's ``readers`` readers of ``dataset`` as Ray actors, for the life of a loader.

    :meth:`start` opens them for a pass and returns the :class:`Session` that fetches their
    bundles, made by ``convert`` into what the loop takes. ``options``: the actor options of each
    reader (``num_cpus``, ``resources``, ``scheduling_strategy``, ...). ``timeout``: seconds a
    reader may take to send its next bundle before it is treated as dead. :meth:`close` stops them.
    """

    def __init__(
        self,
        dataset: Dataset,
        *,
        readers: int,
        options: dict,
        prefetch: int,
        timeout: float,
        convert: Callable[[Bundle], Bundle],
    ):
        ray = needs("ray", "tidal.ray.DataLoader", "ray")
        if not ray.is_initialized():
            ray.init()  # RAY_ADDRESS's cluster, or a local one
        self._ray = ray
        self._n = readers
        self._convert = convert
        self._timeout = timeout
        self._chunk = max(1, prefetch // 2)
        self._eager = 2 * self._chunk <= prefetch  # ask for the next bundle as one arrives
        self._options = with_defaults(options)
        self._remote = remote_reader(ray, options)
        self._dataset = ray.put(dataset)  # pickled once for all readers (and their replacements)
        self._handles: list[Any] = [self._remote.remote(self._dataset, self._chunk) for _ in range(readers)]
        self._pending: list[deque[Any]] = [deque() for _ in range(readers)]  # calls sent, oldest first
        self._rank = 0
        self._opened: tuple = ()
        self._worlds: list[World] = []
        self._last: list[dict | None] = [None] * readers  # per reader, its state after the last batch received
        self._stats: list[dict] = [{} for _ in range(readers)]  # its counters as of its last bundle
        self._streams: list[Streams | None] = [None] * readers  # its mixture's counts after its last batch
        self._base_stats: list[dict] = [{} for _ in range(readers)]  # counters of the readers it replaced
        self._base_streams: list[Streams | None] = [None] * readers
        self._lost = [0] * readers  # times replaced since its last bundle
        self._reported: frozenset[tuple[str, int, str, int]] = frozenset()  # reported before the pass's readers
        self.session = 0  # the pass the readers read for (Session)
        self._world_size = 1
        self.closed = False

    @property
    def handles(self) -> list[Any]:
        """The readers' actor handles, in reader order (replacements in place of those they replaced)."""
        return list(self._handles)

    def start(
        self,
        ranks: World,
        states: list[dict | None],
        first_epoch: int,
        origin: dict | None,
        weights: dict | None,
        ask: bool = True,
        reported: frozenset[tuple[str, int, str, int]] = frozenset(),
    ) -> Session:
        """Open every reader for a pass as rank ``ranks``, reader ``w`` from ``states[w]`` (None: the
        start of its share); the session fetches their bundles. ``ask``: ask each for its first
        bundle now (else at the session's first ``fetch``: nothing is read, so nothing is reported
        of bad data, for a pass that may be dropped). Calls of an earlier pass still running are
        answered and dropped (a reader opened again finishes them first). ``reported``: the bad
        records the readers they replace in the pass reported (:meth:`reported`): not again."""
        self.park()
        if self.session == 0:
            short = self._unplaceable(ranks.world_size)
            if short is not None:
                _log.warning("tidal.ray: %s: readers wait until the cluster grows (up to reader_timeout)", short)
        self.session += 1
        self._world_size = ranks.world_size
        self._reported = reported
        self._rank, self._opened = ranks.rank, (first_epoch, origin, weights)
        self._worlds = [ranks.with_worker(w, self._n) for w in range(self._n)]
        self._last = list(states)
        self._stats = [{} for _ in range(self._n)]
        self._streams = [None] * self._n
        self._base_stats = [{} for _ in range(self._n)]
        self._base_streams = [None] * self._n
        self._lost = [0] * self._n
        for w in range(self._n):
            self._open(w, ask)
        return Session(self, self.session)

    def _open(self, w: int, ask: bool = True) -> None:
        handle = self._handles[w]
        handle.open.remote(self._worlds[w], self._last[w], *self._opened, as_rows(self._reported))
        self._pending[w] = deque([handle.next.remote()] if ask else [])

    def fetch(self, w: int) -> Bundle:
        """Reader ``w``'s next bundle; an error it raised is raised here; a reader that died or
        did not answer in time is replaced, and its next bundle is the replacement's first."""
        ray = self._ray
        while True:
            pending = self._pending[w]
            if not pending:
                pending.append(self._handles[w].next.remote())
            try:
                got = ray.get(pending[0], timeout=self._timeout)
            except ray.exceptions.GetTimeoutError:
                short = self._unplaceable(self._world_size) if not self._stats[w] else None
                if short is not None:
                    raise ArgumentError(
                        f"tidal.ray reader {w} of rank {self._rank} sent nothing for {self._timeout:g} s: {short}; "
                        "ask for fewer readers or less in reader_options, or start a larger cluster (ray status)"
                    ) from None
                self._replace(w, f"it sent nothing for {self._timeout:g} s")
                continue
            except ray.exceptions.RayTaskError as exc:  # not a death: the call itself raised
                cause = exc.cause if isinstance(exc.cause, BaseException) else exc
                raise cause from None
            except ray.exceptions.RayError as exc:  # the actor died, or its node with what it made
                self._replace(w, f"{type(exc).__name__}: {_first_line(exc)}")
                continue
            pending.popleft()
            if isinstance(got, _Failure):
                raise got.exc
            if got is None:  # (asked past its end: never, as the loop stops asking at the end)
                raise StorageError(f"tidal.ray reader {w} of rank {self._rank} has no more bundles")
            self._lost[w] = 0
            bundle = self._received(w, got)
            if self._eager and not bundle.end:
                pending.append(self._handles[w].next.remote())
            return self._convert(bundle)

    def reported(self) -> frozenset[tuple[str, int, str, int]]:
        """The bad records reported in the pass: those its readers were opened with, and those each
        live reader reported since (asked after the calls it was sent: what it read ahead counts).
        A reader that died took its own with it (its replacement was opened with those before)."""
        ray = self._ray
        got = set(self._reported)
        calls = [handle.reported.remote() for handle in self._handles]
        for call in calls:
            try:
                got |= as_keys(ray.get(call, timeout=self._timeout))
            except (ray.exceptions.RayError, TimeoutError):  # dead, or not answering: its reports are lost
                continue
        return frozenset(got)

    def _received(self, w: int, bundle: Bundle) -> Bundle:
        """Note where reader ``w`` stands after ``bundle``; a replacement's counters go on from its predecessor's."""
        if self._base_stats[w]:
            bundle.stats = add_stats(self._base_stats[w], bundle.stats)
        if self._base_streams[w] is not None:
            bundle.marks = [_shifted(mark, self._base_streams[w]) for mark in bundle.marks]
        if bundle.states:
            self._last[w] = bundle.states[-1]
        if bundle.marks:
            self._streams[w] = bundle.marks[-1][2]
        self._stats[w] = bundle.stats
        return bundle

    def _replace(self, w: int, why: str) -> None:
        """A new actor for reader ``w``, from the state after the last batch received from it."""
        self._lost[w] += 1
        self._kill(self._handles[w])
        if self._lost[w] > LOST:
            raise StorageError(
                f"tidal.ray reader {w} of rank {self._rank} was lost {LOST + 1} times in a row before it sent a "
                f"batch (last: {why}); check that reader_options can be met on the cluster (ray status) and "
                "that the readers' nodes can import tidal and reach the data"
            )
        _log.warning(
            "tidal.ray: reader %d of rank %d is replaced (%s); it goes on after the last batch received",
            w,
            self._rank,
            why,
        )
        self._base_stats[w] = add_stats(self._stats[w], {"readers_replaced": 1})
        self._stats[w] = self._base_stats[w]
        self._base_streams[w] = self._streams[w]
        self._handles[w] = self._remote.remote(self._dataset, self._chunk)
        self._open(w)

    def _unplaceable(self, ranks: int) -> str | None:
        """Why the cluster's resources in all (now) cannot hold ``ranks`` ranks' readers; None where they can."""
        try:
            total = self._ray.cluster_resources()
        except Exception:  # not answering: the timeouts say what they say
            return None
        options = self._options
        each = {"CPU": options.get("num_cpus"), "GPU": options.get("num_gpus"), "memory": options.get("memory")}
        each.update(options.get("resources") or {})
        count = ranks * self._n
        short = {k: v * count for k, v in each.items() if v and v * count > total.get(k, 0)}
        if not short:
            return None
        need = ", ".join(f"{v:g} {k}" for k, v in short.items())
        have = ", ".join(f"{total.get(k, 0):g} {k}" for k in short)
        return f"{count} readers ({ranks} ranks x {self._n}) of {options} need {need}; the cluster has {have} in all"

    def _kill(self, handle: Any) -> None:
        try:  # noqa: SIM105  (not contextlib: this may run as the interpreter exits, its modules gone)
            self._ray.kill(handle, no_restart=True)
        except Exception:  # dead already, or its node gone
            pass

    def park(self) -> None:
        """Ask the readers for nothing more (what they were asked is dropped); they stay, to be
        opened again by the next :meth:`start`."""
        for pending in self._pending:  # (no module global here: this may run as the interpreter exits)
            pending.clear()

    def close(self) -> None:
        """Stop every reader (again: nothing)."""
        if self.closed:
            return
        self.closed = True
        self.park()
        for handle in self._handles:
            self._kill(handle)


class Session(Iterator[Bundle]):
    """The readers of :class:`Actors` for one pass: ``fetch(w)`` is reader ``w``'s next bundle.
    A pass started since (a new ``iter()``, ``set_weights``, a state loaded) took the readers:
    this session fetches nothing more. Iterating it (the loader drains its workers at the end
    of a pass) lets the readers go idle."""

    def __init__(self, actors: Actors, session: int):
        self._actors, self._session = actors, session

    def _current(self) -> bool:
        return self._actors.session == self._session and not self._actors.closed

    def fetch(self, w: int) -> Bundle:
        if not self._current():
            raise StateError(
                "this pass over a tidal.ray.DataLoader was superseded: a newer iter(), set_weights or "
                "load_state_dict took its readers (or the loader was closed)"
            )
        return self._actors.fetch(w)

    def park(self) -> None:
        """The readers go idle (if this session still holds them)."""
        if self._current():
            self._actors.park()

    _shutdown_workers = park  # what tidal.DataLoader calls to stop its workers

    def __iter__(self) -> Iterator[Bundle]:
        return self

    def __next__(self) -> Bundle:
        self.park()
        raise StopIteration


def with_defaults(options: dict) -> dict:
    """A reader's ``reader_options``: one CPU unless they say otherwise."""
    return {"num_cpus": 1, **options}


def remote_reader(ray: Any, options: dict) -> Any:
    """The :class:`Reader` actor class with ``options`` (:func:`with_defaults`)."""
    return ray.remote(Reader).options(**with_defaults(options), max_restarts=0, max_task_retries=0)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""
