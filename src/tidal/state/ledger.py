"""The ledger of a loader: what its training loop has consumed, and the state made from it.

``tidal.DataLoader`` and ``tidal.jax.Loader`` keep their ledger here and only move batches:
each hands the ledger, batch by batch, its worker's reader state after the batch
(:meth:`Ledger.consume`), and gathers the rank states of all ranks when a state is saved
(:meth:`Ledger.snapshot`). The ledger holds

- the **pass** (complete passes over the loader before this one) and the **origin** (the
  progress an elastic restore started this pass's readers from, or None);
- this rank's **rank state** (:data:`~tidal.state.schema.RankState`): per worker its reader
  state after the last batch consumed, which worker is next, and the counts;
- a **pending** state: loaded (and checked) by :meth:`Ledger.load`, applied when the next
  iteration starts (:meth:`Ledger.restore`), and returned as it is by a ``state_dict()``
  before then;
- the **undo** records of the last :data:`UNDO` batches, so a state can leave out batches the
  loader yielded but the training loop has not trained on (Lightning fetches ahead);
- the mixture **weights** set by ``loader.set_weights`` (None: the mixture's own), how many
  times they were set (``changes``: a loader whose readers read under older ones restarts them),
  and the **calls** that set them (:mod:`tidal.state.calls`): ``snapshot`` checks that every
  rank made the same ones, and the state keeps them for a replay.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from tidal.errors import ArgumentError, StateError
from tidal.state import calls as weight_calls
from tidal.state import keys as k
from tidal.state import schema
from tidal.state.schema import RankState, ReaderState
from tidal.state.view import View
from tidal.world import World

if TYPE_CHECKING:
    from tidal.dataset import Dataset

UNDO = 64  # batches a state can step back over (see Ledger.snapshot)

Gather = Callable[[Any], list[Any]]
"""Every rank's value, in rank order, given this rank's (a collective: every rank calls it)."""


class Undo(NamedTuple):
    """How to step back over one consumed batch (or part of one: continuous rows)."""

    worker: int
    before: ReaderState | None  # the worker's reader state before it
    next_worker: int  # the worker that was next before it
    tokens: int
    batches: int


class Start(NamedTuple):
    """Where a pass's readers start, as rank ``ranks``: what :meth:`Ledger.start` says they
    would, compared when a loader started its readers before it was asked (``start_early``)."""

    ranks: World
    readers: list[ReaderState | None]  # per worker, the reader state to continue from
    first_epoch: int
    origin: dict | None
    weights: dict[str, float] | None
    next_worker: int
    changes: int  # set_weights calls before it


class Ledger:
    """One loader's ledger over ``dataset``, read by ``workers`` readers on each rank;
    ``ranks``: the ranks the loader reads as (``World.ranks``, or the JAX processes)."""

    def __init__(self, dataset: Dataset, workers: int, ranks: Callable[[], World] = World.ranks):
        self.dataset = dataset
        self.workers = workers
        self._ranks = ranks
        self.pass_ = 0
        self.origin: dict | None = None  # progress an elastic restore started from
        self.local = schema.fresh_rank(workers)  # this rank's readers: what the training loop consumed
        self.pending: dict | None = None  # a loaded state, applied when iteration starts
        self._undo: deque[Undo] = deque(maxlen=UNDO)
        self.weights: dict[str, float] | None = None  # set by set_weights: in force from the next batch
        self.changes = 0  # how many times they were set
        self.calls = weight_calls.Calls()  # and where (tidal.state.calls)
        self._loaded_calls: list = []  # those a loaded state holds

    def set_weights(self, weights: dict[str, float]) -> None:
        """Mixture weights from the next batch on (in a state loaded and not applied yet, too),
        recorded with the batches consumed so far. No collective: see :mod:`tidal.state.calls`."""
        if self.pending is not None:
            ranks = self._ranks()
            restored = schema.restore(View(self.pending), ranks.rank, ranks.world_size, self.workers)
            self.calls.add(restored.pass_, restored.rank[k.COUNTS][k.BATCHES], weights)
            saved = self.calls.saved(self._loaded_calls)  # the state's own calls, then these
            self.pending = {**self.pending, k.WEIGHTS: weights, k.WEIGHT_CALLS: saved}
        else:
            self.calls.add(self.pass_, self.local[k.COUNTS][k.BATCHES], weights)
            self.weights = weights
        self.changes += 1

    # -- what the readers start from ------------------------------------------------------

    def first_epoch(self) -> int:
        """The first epoch of the pass in progress."""
        return self.pass_ * self.dataset.epochs_per_pass()

    @property
    def readers(self) -> list[ReaderState | None]:
        """Per worker, the reader state to continue from (None: the start of its share)."""
        return list(self.local[k.WORKERS])

    @property
    def next_worker(self) -> int:
        """The worker whose batch comes next."""
        return self.local[k.NEXT_WORKER]

    def sources(self) -> dict:
        """``sources`` of a state of this dataset."""
        return schema.sources_of(self.dataset.sources())

    # -- loading and restoring ---------------------------------------------------------

    def load(self, state: dict) -> None:
        """Check ``state`` whole, and this rank's positions in it, and keep it for the next
        :meth:`restore`. A state that is not one, or not this dataset's, or that puts a reader
        where none can be, is a :class:`~tidal.StateError` naming the key."""
        view = schema.check(state, self.dataset.fingerprint(), self.sources())
        self._check_weights(view)
        self._check_positions(view)
        self.pending = state
        self.calls = weight_calls.Calls(state.get(k.WEIGHT_CALLS))  # the run's count goes on from the state's
        self._loaded_calls = list((state.get(k.WEIGHT_CALLS) or {}).get(k.CALLS, []))

    def _check_weights(self, view: View) -> None:
        """That the weights a state sets are those of this dataset's mixture."""
        weights = view.optional(k.WEIGHTS)
        if weights is None:
            return
        try:
            names = self.dataset.stage.mixed_streams()
        except ArgumentError as exc:
            raise StateError(f"{weights.path}: {exc}") from None
        if names is None:
            raise StateError(f"{weights.path}: this dataset has no mixture (tidal.mix) to weigh")
        unknown = sorted(set(weights.data) - set(names))
        if unknown:
            raise StateError(f"{weights.where(unknown[0])}: no stream of that name in this dataset's mixture")

    def _check_positions(self, view: View) -> None:
        """Open, and close, this rank's readers where the state puts them: a position no reader
        takes (an offset past its share, a negative count, an epoch past the pass) is an error
        now, naming its key, not at the first batch inside a worker. Little is read (a packer
        reads its chunk again), and as a replay: no bad record goes to the errors function twice."""
        from tidal.iterator import DatasetIterator  # a floor up: the ledger holds datasets, opens them only here

        ranks = self._ranks()
        restored = schema.restore(view, ranks.rank, ranks.world_size, self.workers)
        first = restored.pass_ * self.dataset.epochs_per_pass()
        for w, state in enumerate(restored.rank[k.WORKERS]):
            world = ranks.with_worker(w, self.workers)
            where = schema.reader_where(ranks.rank, w)
            weights = view.data.get(k.WEIGHTS)
            fingerprint = self.dataset.fingerprint()
            DatasetIterator(
                self.dataset.stage, fingerprint, world, state, first, restored.origin, where, weights, replay=True
            ).close()

    def start(self, ranks: World) -> Start:
        """Where this rank's readers start at the next iteration as ``ranks``: the pending state as
        :meth:`restore` will apply it, else the ledger as it is. Nothing is applied."""
        pass_, origin, local, weights = self.pass_, self.origin, self.local, self.weights
        if self.pending is not None:
            restored = schema.restore(View(self.pending), ranks.rank, ranks.world_size, self.workers)
            pass_, origin, local, weights = restored.pass_, restored.origin, restored.rank, self.pending.get(k.WEIGHTS)
        first = pass_ * self.dataset.epochs_per_pass()
        return Start(ranks, list(local[k.WORKERS]), first, origin, weights, local[k.NEXT_WORKER], self.changes)

    def restore(self, ranks: World) -> None:
        """At the start of an iteration as rank ``ranks``: apply the pending state, if any."""
        if self.pending is not None:
            view = schema.check(self.pending, self.dataset.fingerprint(), self.sources())
            restored = schema.restore(view, ranks.rank, ranks.world_size, self.workers)
            self.pass_, self.origin, self.local = restored.pass_, restored.origin, restored.rank
            self.weights = self.pending.get(k.WEIGHTS)
            self.pending = None
        self._undo.clear()

    # -- batch by batch ------------------------------------------------------------------

    def consume(self, worker: int, reader: ReaderState, tokens: int, batches: int = 1) -> None:
        """The training loop received a batch of ``worker`` (``batches=0``: a part of one, see
        :func:`tidal.state.schema.consume`), after which its reader state is ``reader``."""
        local = self.local
        self._undo.append(Undo(worker, local[k.WORKERS][worker], local[k.NEXT_WORKER], tokens, batches))
        schema.consume(local, worker, reader, tokens, batches)

    def rewound(self, records: int) -> RankState:
        """A copy of the rank state before the last ``records`` consumed (at most :data:`UNDO`)."""
        local = schema.copy_rank(self.local)
        for undo in list(self._undo)[::-1][:records] if records else ():
            local[k.WORKERS][undo.worker], local[k.NEXT_WORKER] = undo.before, undo.next_worker
            local[k.COUNTS][k.BATCHES] -= undo.batches
            local[k.COUNTS][k.TOKENS] -= undo.tokens
        return local

    def pass_ended(self) -> None:
        """The pass ended: the next one starts afresh, with the next epochs."""
        self.pass_, self.origin, self.local = self.pass_ + 1, None, schema.fresh_rank(self.workers)
        self._undo.clear()

    # -- saving --------------------------------------------------------------------------

    def snapshot(self, gather: Gather | None = None, rewind: int = 0) -> dict:
        """The loader state (the pending one, if it has not been applied yet): this rank's
        state less its last ``rewind`` records (batches not trained on), and with several
        ranks and a ``gather``, every rank's; else this rank's alone, the others None.

        Gathered, the ranks' states must have been taken at the same step (a
        :class:`~tidal.StateError`) and the ranks must have made the same ``set_weights`` calls
        since the last snapshot (an :class:`~tidal.ArgumentError` naming them, on every rank)."""
        if self.pending is not None:
            return self.pending
        ranks = self._ranks()
        local = self.rewound(rewind)
        every: list[RankState | None] = [None] * ranks.world_size
        if ranks.world_size > 1 and gather is not None:
            gathered = gather([local, self.calls.mine(self.weights)])
            every = [g[0] for g in gathered]
            schema.check_same_step(every)
            try:
                weight_calls.agree([g[1] for g in gathered])
            except ArgumentError:
                self.calls.taken()  # said once; weights in force that differ are said again
                raise
        else:
            every[ranks.rank] = local
        state = schema.make(
            self.dataset.fingerprint(),
            self.sources(),
            self.pass_,
            self.first_epoch(),
            [ranks.world_size, self.workers],
            every,
            self.origin,
            self.dataset.records_per_batch(),
            self.weights,
            self.calls.saved(),
        )
        self.calls.taken()
        return state
