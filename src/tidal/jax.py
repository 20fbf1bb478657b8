"""``tidal.jax.Loader``: global ``jax.Array`` batches, sharded over a mesh, with exact, elastic state.

JAX training (Flax, MaxText- or EasyDeL-style loops) runs one process per host, each
driving its local devices, and steps on *global* arrays. Each process is a rank here: it
reads only its own share of the data (``tidal.World.ranks()`` reads the rank from
``jax.process_index()`` once ``jax.distributed.initialize`` has run) and the global batch is
assembled from the processes' local batches by ``jax.make_array_from_process_local_data``:
with ``.batch(n)`` and P processes, every numeric column is a global array of ``n * P`` rows,
each process's rows on its own devices. No record is in two processes' slices.

Loading happens in the background, in threads (default) or in processes started with
``spawn`` (:class:`tidal.transport.pool.Pool`): each worker reads its own share of the process's
share and sends batches with its reader state after each; batches are taken round-robin over
the workers, as ``tidal.DataLoader`` does (:mod:`tidal.transport.bundles`). A thread puts the next
``prefetch`` batches on the devices ahead of the training step. Neither counts as consumed:
``state_dict()`` is exactly what the training loop received.

The state is the loader state of :mod:`tidal.state.schema`, the same JSON as
``tidal.DataLoader.state_dict()`` (ranks are JAX processes, workers this loader's readers),
so ``tidal state show`` and ``tidal state skip`` work on it, and a state restores on any
number of processes and workers with no record lost or repeated within the epoch. Under
multi-process JAX, ``state_dict()`` gathers every process's part (``process_allgather`` of
the JSON bytes), so every process returns the same dict: call it on every process at the
same step, as any collective.

The readers start when the loader is built and when it is given a state (``start_early``),
where the processes can be known then without starting JAX's backends (they run already, or
``jax.distributed`` is initialized): ``iter()`` takes that start only if it would start from
the same place itself, and else stops it and starts afresh.

This module needs JAX, not torch, and is imported only when used.
"""

from __future__ import annotations

import functools
import json
import logging
import multiprocessing
import sys
import threading
import time
import weakref
from collections.abc import Generator, Iterator, Mapping
from types import TracebackType
from typing import Any

import numpy as np

from tidal.errors import missing

try:
    import jax
    from jax.experimental import multihost_utils
    from jax.sharding import Mesh, NamedSharding, PartitionSpec, Sharding
except ImportError as exc:
    raise missing("jax", "tidal.jax", exc, "jax") from None

from tidal import env
from tidal.dataset import Dataset
from tidal.errors import ArgumentError, TidalError
from tidal.metrics import Meter
from tidal.stages import weights as live
from tidal.stages.batch import Batch
from tidal.stages.continuous import shared_rows
from tidal.stages.policy import Reports, fresh_reports
from tidal.state.ledger import Ledger, Start
from tidal.transport.bundles import numeric, round_robin, side_by_side, steps
from tidal.transport.jax import int32_ids
from tidal.transport.pool import Ahead, HeadStart, Pool, Taken, WorkerType, reporting_when_taken
from tidal.world import World

__all__ = ["Loader", "data_sharding"]

_log = logging.getLogger("tidal")


def data_sharding(axis: str = "data") -> NamedSharding:
    """The default: the batch axis split over every device of every process, in process order
    (a 1-D mesh named ``axis``), other axes whole. Process ``p``'s rows land on its own devices."""
    devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    return NamedSharding(Mesh(np.array(devices), (axis,)), PartitionSpec(axis))


class Loader:
    """Global ``jax.Array`` batches of a batched tidal :class:`~tidal.Dataset`, loaded in the
    background and put on the devices ahead, with a small JSON state that restores exactly.

    >>> ds = tidal.Dataset("data/*.parquet", columns=["text"]).shuffle(seed=0).repeat()
    >>> loader = tidal.jax.Loader(ds.tokenize("tokenizer.json").pack(2048).batch(8), num_workers=2)
    >>> for step, batch in enumerate(loader):       # batch["input_ids"]: int32 (8 x processes, 2048)
    ...     params, loss = train_step(params, batch)
    ...     if step % 1000 == 0:
    ...         save(params, loader.state_dict())   # every process, at the same step
    >>> loader.load_state_dict(state)                # in a new run: continues exactly

    ``sharding``: how every numeric column is laid out over the devices; its batch axis must
    split over the processes (each process's devices hold its own rows), as in data parallel
    training. Default: :func:`data_sharding`, the batch over every device. Columns that are not
    numeric arrays (text) stay this process's own rows, as lists. Token ids (``uint16``,
    ``uint32``) arrive as ``int32``; other dtypes as JAX makes them (``int64`` becomes
    ``int32`` unless ``jax_enable_x64`` is set). Every batch must have the dataset's batch
    size on every process (``.batch(n)`` drops incomplete batches by default).

    ``num_workers``: readers in the background (0: read in the loop's thread, or in the
    prefetch thread); ``worker_type``: ``"thread"`` (default; tokenizing, decompressing and
    Arrow release the GIL) or ``"process"`` (started with ``spawn``: functions given to
    ``map``/``filter`` must pickle, and the main script needs an ``if __name__ == "__main__"``
    guard). ``prefetch``: batches put on the devices ahead of the loop (0: when asked for).
    ``batch_size=n`` is a shortcut for ``dataset.batch(n)``.

    ``start_early`` (default: True, or ``TIDAL_START_EARLY=0``'s False): start the readers now,
    and again at ``load_state_dict``, not at the first ``iter()``, where the processes can be
    known now (JAX's backends run, or ``jax.distributed`` is initialized: asking earlier would
    start them); the batches are those of a loader started when iterated, always.

    Iterating goes on from the last batch consumed; after a complete pass over a finite dataset
    the next pass reads the next epochs. Under multi-process JAX, a finite pass whose readers may
    end unevenly (filters, packing, a mixture that stops) ends on the same step for every process,
    at the cost of one tiny all-gather per batch, so no process waits on another that ran out.
    """

    def __init__(
        self,
        dataset: Dataset,
        sharding: Sharding | None = None,
        *,
        num_workers: int = 2,
        worker_type: WorkerType = "thread",
        prefetch: int = 2,
        batch_size: int | None = None,
        start_early: bool | None = None,
    ):
        if not isinstance(dataset, Dataset):
            raise ArgumentError(f"tidal.jax.Loader takes a tidal.Dataset, not {type(dataset).__name__}")
        if batch_size is not None:
            if dataset.batched:
                raise ArgumentError("the dataset is already batched; drop batch_size= or the .batch() call")
            dataset = dataset.batch(batch_size)
        if not isinstance(dataset.stage, Batch):
            raise ArgumentError("tidal.jax.Loader makes global arrays of batches: end the dataset with .batch(n)")
        if sharding is not None and not isinstance(sharding, Sharding):
            raise ArgumentError(f"sharding must be a jax.sharding.Sharding, not {type(sharding).__name__}")
        if worker_type not in ("thread", "process"):
            raise ArgumentError(f"worker_type must be 'thread' or 'process', not {worker_type!r}")
        for name, value in (("num_workers", num_workers), ("prefetch", prefetch)):
            if not isinstance(value, int) or value < 0:
                raise ArgumentError(f"{name} must be a non-negative int, not {value!r}")
        if start_early is not None and not isinstance(start_early, bool):
            raise ArgumentError(f"start_early must be True, False or None (TIDAL_START_EARLY), not {start_early!r}")
        self.dataset = dataset
        self.batch_size = dataset.stage.size
        self._sharding = sharding
        self._num_workers = num_workers
        self._workers = max(1, num_workers)
        self._worker_type: WorkerType = worker_type
        self._prefetch = prefetch
        self._ledger = Ledger(dataset, self._workers, self._ranks)  # what the loop consumed, and the state
        self._running: weakref.ref[LoaderIterator] | None = None  # the pass in progress, while it lives
        self._meter = Meter(dataset.stage)  # what the loop received, for metrics()
        self._early_on = env.start_early() if start_early is None else start_early
        self._early: LoaderIterator | None = None  # the readers started before iter() asked
        self._start_early()

    # -- iteration -------------------------------------------------------------------

    def __iter__(self) -> LoaderIterator:
        """Start the readers from the last batch consumed (or the loaded state)."""
        early, self._early = self._early, None
        self.close()
        ranks = self._ranks()
        ledger = self._ledger
        reopened = ledger.pending is not None or any(r is not None for r in ledger.readers)
        ledger.restore(ranks)
        self._meter.new_pass(reopened)
        together = self._together(ranks)
        at = ledger.start(ranks)
        if early is not None and early.start == at:
            running = early
            running.adopt(self, together)  # (after new_pass: what its readers counted is this pass's)
        else:
            if early is not None:
                early.abandon()
            running = LoaderIterator(self, ranks, together, at)
        self._running = weakref.ref(running)
        return running

    def _together(self, ranks: World) -> bool:
        return ranks.world_size > 1 and jax.process_count() > 1 and self.dataset.may_end_unevenly()

    def _start_early(self) -> None:
        """Start the readers now from where the next ``iter()`` will continue (``start_early``),
        where the processes can be known now; anything that fails is left to ``iter()``."""
        if self._early is not None:
            self._early.abandon()
            self._early = None
        if not self._early_on or not _jax_runs():
            return
        try:
            if World.settled() is None:
                return
            ranks = self._ranks()
            self._early = LoaderIterator(self, ranks, self._together(ranks), self._ledger.start(ranks), early=True)
        except Exception as exc:
            _log.debug("tidal.jax: the readers start when iterated: %s", exc)

    @staticmethod
    def _ranks() -> World:  # static: the ledger holds it, and no cycle back to the loader
        ranks = World.ranks()
        count = jax.process_count()
        if count > 1 and (ranks.rank, ranks.world_size) != (jax.process_index(), count):
            raise TidalError(
                f"the ranks tidal reads (rank {ranks.rank} of {ranks.world_size}, from torch.distributed or "
                f"RANK/WORLD_SIZE) are not the JAX processes (process {jax.process_index()} of {count})"
            )
        return ranks

    @staticmethod
    def _globalize(batch: Any, sharding: Sharding, batch_size: int) -> dict:
        """This process's batch as global arrays (numeric columns) and local lists (the rest).
        (Static: the readers' threads hold it, and must not hold the loader, which holds them.)"""
        out = {}
        for name, value in batch.items():
            if not numeric(value):
                out[name] = value
                continue
            if value.ndim == 0 or value.shape[0] != batch_size:
                raise TidalError(
                    f"column {name!r}: a batch of shape {value.shape} where {batch_size} rows were expected; "
                    "global arrays need the same batch size on every process (.batch(n, drop_last=True), the default)"
                )
            out[name] = jax.make_array_from_process_local_data(sharding, value)
        return out

    def __getstate__(self) -> dict:  # a copy (pickled, deepcopied) starts its readers when iterated
        return {**self.__dict__, "_early": None, "_running": None}

    def close(self) -> None:
        """Stop the background readers and prefetching (a later ``iter()`` starts them again)."""
        if self._early is not None:
            self._early.abandon()
            self._early = None
        running = self._running() if self._running is not None else None
        if running is not None:
            running.close()
        self._running = None

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()

    def metrics(self) -> dict[str, float | int]:
        """This process's metrics as a flat dict of numbers, as :meth:`tidal.DataLoader.metrics`:
        ``batches``, ``records`` and ``tokens`` this process's loop received, the seconds it
        waited inside ``next()`` (``data_wait_s``, ``data_wait_share``), the readers' counters,
        and per mixed stream ``tokens/<name>``, ``records/<name>``, ``weight/<name>``.

        >>> writer.write_scalars(step, loader.metrics())
        """
        return self._meter.metrics()

    # -- state -----------------------------------------------------------------------

    def state_dict(self) -> dict:
        """What the training loop has consumed, on every process: small, JSON-able, topology-free.

        Under multi-process JAX this gathers every process's part, so every process must call
        it at the same step; every process then gets the same dict, and processes that made
        other ``set_weights`` calls since the last ``state_dict()`` are named in an
        :class:`~tidal.ArgumentError`. The layout is ``tidal.DataLoader``'s
        (:mod:`tidal.state.schema`): ranks are JAX processes.
        """
        return self._ledger.snapshot(_allgather_json if jax.process_count() > 1 else None)

    def set_weights(self, weights: Mapping[str, float]) -> None:
        """Set the mixture's weights (``{stream: weight}``; streams left out: 0) from the next batch
        on, kept in ``state_dict()``: as :meth:`tidal.DataLoader.set_weights` (the readers restart
        from the last batch consumed). Call it on every process after the same number of batches
        with the same weights: it is no collective, and the next ``state_dict()`` (which gathers
        every process's calls) names the processes that differ in an :class:`~tidal.ArgumentError`."""
        self._ledger.set_weights(live.for_streams(self.dataset.stage.mixed_streams(), weights))
        if self._early is not None:  # started under the old weights: again, under these
            self._start_early()

    def load_state_dict(self, state: dict) -> None:
        """Continue, at the next ``iter()``, exactly after the last batch consumed when ``state``
        was saved: batch for batch on the same number of processes and workers, and with no
        record lost or repeated within the epoch on another. A state that is not one, or not
        this dataset's, is a :class:`~tidal.StateError` naming the key. With ``start_early``, the
        readers start from there now (those started before stop)."""
        self._ledger.load(state)
        self.close()
        self._start_early()


class LoaderIterator(Iterator[dict]):
    """One pass of a :class:`Loader`: its readers, its prefetch thread, and the batches in order.

    Dropped before its end, its threads and processes stop on their own (nothing they hold
    refers back to it); ``close()`` stops them and waits. Started ``early`` (before ``iter()``),
    it holds its loader weakly until ``iter()`` adopts it, so a loader dropped unused stops it.
    """

    def __init__(self, loader: Loader, ranks: World, together: bool, at: Start, early: bool = False):
        self._held: Loader | None = None if early else loader
        self._weak = weakref.ref(loader)
        self._ranks = ranks
        self._together = together
        self._done = False
        self._start(at, early)

    @property
    def _loader(self) -> Loader:
        loader = self._held if self._held is not None else self._weak()
        assert loader is not None  # (adopted before its first batch, while the loader lives)
        return loader

    def adopt(self, loader: Loader, together: bool) -> None:
        """``iter()`` takes this pass, started early: from now on it holds its loader, and what
        its readers counted goes to the loader's metrics."""
        self._held, self._together = loader, together
        self._counts.adopt()
        if self._taken is not None:
            self._taken.take()  # its readers report the bad data they meet from now on

    def _start(self, at: Start, early: bool = False, reports: Reports | None = None) -> None:
        """The readers from ``at``'s reader states, under its weights. ``early``, with neither
        readers nor prefetching in the background, the first batch is made in a thread now.
        ``reports``: what the readers they replace in this pass reported (``set_weights``)."""
        loader = self._loader
        self._reports = reports if reports is not None else fresh_reports()
        self.start = at
        self._changes = at.changes
        process = loader._num_workers > 0 and loader._worker_type == "process"
        self._taken = (Taken(multiprocessing.get_context("spawn") if process else None)) if early else None
        self._pool = Pool(
            loader.dataset,
            self._ranks,
            at.readers,
            at.first_epoch,
            at.origin,
            workers=loader._num_workers,
            worker_type=loader._worker_type,
            widen=int32_ids,
            weights=at.weights,
            taken=self._taken if loader._num_workers else None,
            reports=self._reports,
            first=at.next_worker,
        )
        split = shared_rows(loader.dataset.stage, loader._workers)
        sharding = loader._sharding if loader._sharding is not None else data_sharding()
        globalize = functools.partial(Loader._globalize, sharding=sharding, batch_size=loader.batch_size)
        self._counts = _Counts(loader._meter, held=early)
        made: Generator[tuple[list, int, dict]] = _made(
            self._pool, loader._workers, at.next_worker, globalize, split, self._counts
        )
        if self._taken is not None and not loader._num_workers:  # read in the thread that runs this
            made = reporting_when_taken(made, self._taken)
        self._source: Ahead[tuple[list, int, dict]] | HeadStart[tuple[list, int, dict]] | Generator = made
        if loader._prefetch:
            self._source = Ahead(made, loader._prefetch, "tidal-jax-prefetch")
        elif early and not loader._num_workers:
            self._source = HeadStart(made, 1, "tidal-jax-head-start")

    def __next__(self) -> dict:
        if self._done:
            raise StopIteration
        meter = self._loader._meter
        asked = meter.start()
        if self._changes != self._loader._ledger.changes:  # set_weights: read on from what the loop received
            self._source.close()
            self._pool.close()
            before, reports = self._reports, self._reports.gathered()  # reported, not to be reported again
            meter.new_pass(reopened=True, reported=len(reports.before) - len(before.before))
            self._start(self._loader._ledger.start(self._ranks), reports=reports)
        try:
            parts, tokens, batch = next(self._source)
        except StopIteration:
            if self._together:
                _every_process_has(False)  # the step the others are asking about
            self._end()
            raise
        except BaseException:
            self.close()
            raise
        if self._together and not _every_process_has(True):
            self._end()  # another process ran out: this pass ends here for all
            raise StopIteration
        ledger = self._loader._ledger
        for i, (w, reader, _) in enumerate(parts):  # one part, or one of every worker (continuous rows)
            ledger.consume(w, reader, tokens if i == 0 else 0, int(i == 0))
        meter.received([(w, mark) for w, _, mark in parts], time.perf_counter() - asked)
        return batch

    def _end(self) -> None:
        self.close()
        self._loader._ledger.pass_ended()

    def close(self) -> None:
        """Stop this pass's readers and prefetching; the loader keeps what was consumed."""
        if self._done:
            return
        self._done = True
        self._source.close()
        self._pool.close()

    def abandon(self) -> None:
        """Stop this pass, started early for a start that no longer holds, without waiting:
        reader processes are killed now, threads end after the batch they are making."""
        if self._done:
            return
        self._done = True
        self._counts.drop()  # its threads may count on a while: not into the loader's metrics
        if self._taken is not None:
            self._taken.drop()  # a reader waiting to report bad data ends, reporting nothing
        if isinstance(self._source, Ahead):
            self._source.stop()
        else:
            self._source.close()
        self._pool.close(wait=False)


def _jax_runs() -> bool:
    """Whether JAX's backends run or ``jax.distributed`` is initialized: the processes can be
    asked for then without starting the backends (``jax.distributed.initialize`` refuses to run
    after)."""
    ready = getattr(jax.distributed, "is_initialized", None)
    if ready is not None and ready():
        return True
    bridge = sys.modules.get("jax._src.xla_bridge")
    up = getattr(bridge, "backends_are_initialized", None)
    return bool(up is not None and up())


class _Counts:
    """Where a pass's readers' counters go: the loader's meter, or, for a pass started early,
    held until ``iter()`` adopts it (its meter starts a new pass then) and dropped if it does not."""

    def __init__(self, meter: Meter, held: bool):
        self._meter = meter
        self._held: dict[int, dict] | None = {} if held else None
        self._dropped = False
        self._lock = threading.Lock()

    def bundle(self, worker: int, stats: dict) -> None:
        with self._lock:
            if self._dropped:
                return
            if self._held is not None:
                self._held[worker] = stats
            else:
                self._meter.bundle(worker, stats)

    def adopt(self) -> None:
        with self._lock:
            for worker, stats in (self._held or {}).items():
                self._meter.bundle(worker, stats)
            self._held = None

    def drop(self) -> None:
        with self._lock:
            self._dropped = True


def _made(
    pool: Pool, workers: int, start: int, globalize: Any, split: bool = False, counts: _Counts | Meter | None = None
) -> Generator[tuple[list, int, dict]]:
    """``([(worker, reader state after it, mark)], tokens, global batch)`` in round-robin order; with
    ``split`` (continuous rows over several workers), each batch one of every worker's side by side."""
    items = round_robin(pool.fetch, workers, start, counts.bundle if counts is not None else None)
    for group in steps(items, workers) if split else ([item] for item in items):
        if counts is not None:
            for w, bundle, _ in group:
                counts.bundle(w, bundle.stats)
        parts = [bundle.item(j) for _, bundle, j in group]
        batch = side_by_side(parts, np.concatenate) if split else parts[0]
        ids = batch.get("input_ids") if isinstance(batch, dict) else None
        tokens = int(ids.size) if isinstance(ids, np.ndarray) else 0
        yield [(w, bundle.states[j], bundle.marks[j]) for w, bundle, j in group], tokens, globalize(batch)


def _every_process_has(batch: bool) -> bool:
    """Whether every JAX process has a next batch (an all-gather of one flag)."""
    flags = multihost_utils.process_allgather(np.array([int(batch)], np.int32))
    return bool(np.min(flags))


def _allgather_json(value: Any) -> list[Any]:
    """``value`` of every JAX process, in process order (as JSON bytes: sizes, then padded bytes)."""
    data = np.frombuffer(json.dumps(value).encode(), np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.array([data.size], np.int32))).reshape(-1)
    padded = np.zeros(int(sizes.max()), np.uint8)
    padded[: data.size] = data
    every = np.asarray(multihost_utils.process_allgather(padded))
    return [json.loads(bytes(every[p, : sizes[p]])) for p in range(len(sizes))]
