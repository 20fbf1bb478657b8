"""``tidal.DataLoader``: a torch DataLoader over a tidal dataset, with exact state.

Workers do not send batches one by one but *bundles* of consecutive batches, each column
stacked into one numpy array and each text column packed into one UTF-8 buffer
(:mod:`tidal.transport.bundles`, shared with :mod:`tidal.jax`). The buffers are pickled inline rather
than put in torch shared memory: creating a shared-memory segment costs milliseconds per
tensor, more than copying megabytes through the pipe.

The main process yields batches round-robin over workers (worker 0, 1, ..., again 0),
skipping workers that have finished, whatever the bundle sizes. Each batch carries its
worker's state after it, so ``state_dict()`` is exactly what the training loop consumed
however far the workers have run ahead: per worker, the position after its last consumed
batch, and which worker is next. Bundles never leave this module: what the loader yields,
and what its ``dataset`` yields to any other loader built around it, are plain batches.

With ``prefetch_to_device=N`` the next N batches are made and copied to the device in a
background thread (from pinned memory, on a side stream, on CUDA); each carries the state
after it, which counts only when the batch reaches the training loop.

``set_weights`` (a mixture's weights, live) restarts the workers from the state after the
last batch the loop received, so no batch read ahead under the old weights is served.

The workers start when the loader is built and again when it is given a state
(``start_early``, :meth:`DataLoader._start_early`), not at the first ``iter()``: the first
batches are on their way while the script restores its model. ``iter()`` takes that start only
if it is where it would start itself: the same ranks (read again then) and the same position
and weights; else it drops it (its workers killed at once) and starts afresh.

The one module over 500 lines, by choice: it is one object, whose parts (starting its workers,
early or not, the round robin over them, its state, ``set_weights``, its metrics) share its ledger
and its pass; what stands alone already lives elsewhere (:mod:`tidal.transport`,
:mod:`tidal.state`, :mod:`tidal.metrics`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import multiprocessing
import os
import sys
import threading
import time
import weakref
from collections.abc import Iterator, Mapping
from types import FrameType
from typing import Any, NamedTuple, NoReturn

from tidal.errors import missing

try:
    import torch
    import torch.utils.data
except ImportError as exc:
    raise missing("torch", "tidal.DataLoader", exc, "torch") from None

from tidal import env
from tidal.dataset import Dataset
from tidal.devices import accelerate_device, arrived, copied_ahead, to_device
from tidal.errors import ArgumentError, TidalError
from tidal.metrics import Mark, Meter
from tidal.stages import weights as live
from tidal.stages.continuous import shared_rows
from tidal.stages.policy import Reports, fresh_reports, hold_reports, reports_kept
from tidal.state import schema
from tidal.state.ledger import Ledger, Start
from tidal.transport import orphans, rings, spawn_turns, warmup
from tidal.transport.bundles import Bundle, bundles, check_pickles, round_robin, side_by_side
from tidal.transport.pool import Ahead, HeadStart, Taken, reporting_when_taken
from tidal.transport.recycle import RECYCLED
from tidal.transport.torch import TorchBundle, abandon, as_tensors, widen
from tidal.world import World, runs_reader

_log = logging.getLogger("tidal")


class _WorkerStream(torch.utils.data.IterableDataset):
    """What each worker (or the main process, with no workers) iterates.

    For :class:`DataLoader` it yields bundles (``bundled`` is set while its workers start);
    for any other loader built around it (Accelerate rebuilds loaders from their
    ``dataset``) it yields plain batches.
    """

    def __init__(self, dataset: Dataset):
        self.dataset = dataset
        self.ranks = World()
        self.states: list[dict | None] = [None]
        self.first_epoch = 0
        self.origin: dict | None = None
        self.weights: dict | None = None  # set by set_weights
        self.bundled = False
        self.rings: list[str] = []  # each worker's segment of shared memory (tidal.transport.rings); none: the pipe
        self.slots = 0  # slots in each
        self.warmup: warmup.WarmupGate | None = None  # the order workers make their first batch in; None: one worker
        self.first = 0  # the reader torch's worker 0 runs (see __iter__)
        self.loop: int | None = None  # the process starting the workers now, which they outlive no longer
        self.head_start = 0  # no workers, started early: the first bundles made in a thread from now on
        self.taken: Taken | None = None  # started early: reports of bad data wait until iter() takes the pass
        self.reports: Reports | None = None  # the bad records the pass's readers reported (see set_weights)

    def __iter__(self) -> Iterator[Any]:
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if self.bundled:
            # torch asks its workers for batches from worker 0, the loop from the reader it continues
            # with: torch's worker 0 runs that reader, so that the first batch waits on no other
            worker = (worker + self.first) % workers
            if info is not None:
                runs_reader(worker)
        world = self.ranks.with_worker(worker, workers)
        state = self.states[worker] if self.bundled and worker < len(self.states) else None
        where = schema.reader_where(world.rank, worker)
        origin = self.origin if self.bundled else None

        def reader() -> Any:
            with reports_kept(self.reports if self.bundled else None, process=info is not None and self.bundled):
                return self.dataset.iterator(world, state, self.first_epoch, origin, where, self.weights)

        if info is not None and self.loop is not None:  # (tidal.transport.orphans)
            orphans.exit_with(self.loop)
        if info is not None and self.bundled:
            hold_reports(self.taken, process=True)
        if info is not None and self.bundled and self.warmup is not None:
            # a worker waiting for its turn to warm up makes its reader when it comes: not while
            # the workers before it, and the training process forking the rest, want the cores
            return self.warmup.gated(lambda: self._bundles(reader(), worker, pack=True), worker)
        it = reader()
        if self.bundled:
            made = self._bundles(it, worker, pack=info is not None)  # packing only pays across processes
            if info is None:
                if self.taken is not None:
                    made = reporting_when_taken(made, self.taken)
                return HeadStart(made, self.head_start) if self.head_start else made
            return made
        return (as_tensors(item) for item in it)

    def _bundles(self, it: Any, worker: int, pack: bool) -> Iterator[Bundle | _WorkerError]:
        if pack and worker < len(self.rings):
            rings.ring(self.rings[worker], self.slots)  # mapped now, and its name unlinked (see tidal.transport.rings)
            kind = functools.partial(TorchBundle, ring=(self.rings[worker], self.slots))
            return _carried(bundles(it, worker, pack, widen, kind=kind, max_bytes=rings.SLOT_BYTES * 3 // 4), worker)
        made = bundles(it, worker, pack, widen, kind=TorchBundle)
        return _carried(made, worker) if pack else made


class _WorkerError:
    """A tidal error raised in a worker process, carried to the training process as data and
    raised there as it is, its message first: torch would wrap it in "Caught ... in DataLoader
    worker process N" and a traceback, the message last."""

    def __init__(self, error: TidalError, worker: int):
        self.error, self.worker = error, worker

    def raise_(self) -> NoReturn:
        self.error.add_note(f"(raised in DataLoader worker {self.worker})")
        raise self.error


def _carried(made: Iterator[Bundle], worker: int) -> Iterator[Bundle | _WorkerError]:
    try:
        yield from made
    except TidalError as exc:
        yield _WorkerError(exc, worker)


def describe(stats: dict) -> str:
    """One line of :meth:`DataLoader.stats` for a log."""
    parts = [
        f"{stats['batches']} batches",
        f"{stats['batches_per_s']:.1f} batches/s",
        f"data wait {100 * stats['wait_share']:.1f}%",
    ]
    if stats["tokens"]:
        parts.insert(2, f"{stats['tokens_per_s'] / 1e3:.1f}k tokens/s")
    for key in ("skipped", "bytes_downloaded", "cache_hits", "retries"):
        if stats.get(key):
            parts.append(f"{key.replace('_', ' ')} {stats[key]}")
    return "tidal: " + ", ".join(parts)


def _identity(x: Any) -> Any:
    return x


def _held_by_lightning(loader: DataLoader) -> int:
    """Batches Lightning's fit loop has fetched from ``loader`` but not trained on yet.

    Lightning fetches batches ahead of training (to tell the last one of an epoch) and asks
    stateful loaders for ``state_dict()`` from its fit loop when it saves a checkpoint, so
    the loader has yielded more batches than were trained on. Those batches are found on the
    fit loop's data fetcher, which is on the stack of that call.
    """
    if "lightning.pytorch" not in sys.modules and "pytorch_lightning" not in sys.modules:
        return 0
    frame: FrameType | None = sys._getframe(2)
    for _ in range(16):
        if frame is None:
            return 0
        fetcher = getattr(frame.f_locals.get("self"), "_data_fetcher", None)
        combined = getattr(fetcher, "_combined_loader", None)
        if combined is not None and any(x is loader for x in getattr(combined, "flattened", ())):
            return len(getattr(fetcher, "batches", ()))
        frame = frame.f_back
    return 0


def _distributed() -> bool:
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized()


def _all_gather(local: Any) -> list[Any]:
    """Every rank's ``local`` (the ledger's part of a state), in rank order (:func:`_gather_json`)."""
    return _gather_json(local)


def _gather_json(value: Any) -> list[Any]:
    """Every rank's ``value`` (plain data), in rank order, as JSON bytes (their sizes, then the
    bytes padded to the longest), as ``tidal.jax`` gathers them: never ``all_gather_object``,
    whose pickle would run what another process sent."""
    dist = torch.distributed
    nccl = dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
    data = torch.frombuffer(bytearray(json.dumps(value).encode()), dtype=torch.uint8)
    size = torch.tensor([data.numel()], dtype=torch.int64, device=device)
    sizes = [torch.empty_like(size) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, size)
    padded = torch.zeros(max(int(s.item()) for s in sizes), dtype=torch.uint8, device=device)
    padded[: data.numel()] = data.to(device)
    every = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(every, padded)
    return [json.loads(bytes(t[: int(s.item())].cpu().numpy())) for t, s in zip(every, sizes, strict=True)]


def _every_rank_has(batch: bool) -> bool:
    """Whether every rank has a next batch (a MIN all_reduce of one flag)."""
    dist = torch.distributed
    cuda = dist.get_backend() == "nccl"
    flag = torch.tensor([int(batch)], device=torch.device("cuda", torch.cuda.current_device()) if cuda else "cpu")
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


class DataLoader(torch.utils.data.DataLoader):
    """A torch DataLoader over a tidal :class:`~tidal.Dataset`, with exact, small state.

    >>> loader = tidal.DataLoader(ds.shuffle(seed=0).repeat().batch(8), num_workers=2)
    >>> for step, batch in enumerate(loader):
    ...     if step % 1000 == 0:
    ...         json.dump(loader.state_dict(), open("data_state.json", "w"))
    >>> loader.load_state_dict(json.load(open("data_state.json")))  # in a new process

    Batches are made by the dataset (``.batch(n)``); ``batch_size=n`` here is a shortcut
    for it. Numeric numpy columns arrive as tensors (unsigned token ids as int64), other
    columns as lists. ``device``: where batches go (default: the CPU, or the device of an
    HF Accelerate ``Accelerator`` set up in this process). ``prefetch_to_device=N``: make
    the next ``N`` batches and copy them to the device in a background thread while the loop
    trains (on CUDA from pinned memory, on a side stream); the state still counts only the
    batches the loop received.

    >>> loader = tidal.DataLoader(ds, num_workers=4, device="cuda", prefetch_to_device=2)

    ``loader.stats()`` says what the loader did and how long the loop waited for it;
    ``log_every=S`` also logs a line of it at most once every ``S`` seconds of wall-clock time
    (seconds, not batches or steps; ``log_every=60``: a line a minute), written as a batch is
    handed to the loop, so a loop that waits longer logs less often (logger ``tidal``, level
    INFO; None, the default: never).

    ``start_early`` (default: True, or ``TIDAL_START_EARLY=0``'s False): start the workers and
    their first batches now, and again at ``load_state_dict``, not at the first ``iter()``, so that
    the time the script spends restoring its model hides the first batch. This happens only where
    the ranks can be known before iteration (a process group initialized, ``RANK``/``WORLD_SIZE``
    set, or no launcher's variables: one process); ``iter()`` reads them again and starts afresh
    where they, the position or the weights differ, so the batches are always those of a loader
    started when iterated. A loader that is never iterated (an eval loader a trainer builds
    ahead) holds its workers and their first batches until it is dropped: ``start_early=False``.

    Other keyword arguments go to ``torch.utils.data.DataLoader``,
    ``multiprocessing_context="spawn"`` included.
    """

    # HF Accelerate: prepare() would rebuild this loader around its dataset and split an
    # already split stream again; it returns loaders marked prepared as they are. This loader
    # splits the data over ranks itself, places batches on Accelerate's device, and
    # save_state()/load_state() save and restore its state_dict().
    _is_accelerate_prepared = True
    use_stateful_dataloader = True

    def __init__(
        self,
        dataset: Dataset,
        num_workers: int = 0,
        *,
        device: Any = None,
        prefetch_to_device: int = 0,
        log_every: float | None = None,
        start_early: bool | None = None,
        **kwargs: Any,
    ):
        if not isinstance(dataset, Dataset):
            raise ArgumentError(f"tidal.DataLoader takes a tidal.Dataset, not {type(dataset).__name__}")
        if not isinstance(prefetch_to_device, int) or prefetch_to_device < 0:
            raise ArgumentError(f"prefetch_to_device must be a non-negative int, not {prefetch_to_device!r}")
        if start_early is not None and not isinstance(start_early, bool):
            raise ArgumentError(f"start_early must be True, False or None (TIDAL_START_EARLY), not {start_early!r}")
        batch_size = kwargs.pop("batch_size", None)
        drop_last = kwargs.pop("drop_last", False)
        if batch_size is not None:
            if dataset.batched:
                raise ArgumentError("the dataset is already batched; drop batch_size= or the .batch() call")
            dataset = dataset.batch(batch_size, drop_last=drop_last)
        for unsupported in ("sampler", "batch_sampler", "shuffle", "collate_fn"):
            if kwargs.get(unsupported) not in (None, False):
                raise ArgumentError(f"{unsupported}= does not apply: tidal's dataset shuffles and batches itself")
            kwargs.pop(unsupported, None)
        self.tidal_dataset = dataset
        self._stream = _WorkerStream(dataset)
        self._workers = max(1, num_workers)
        self._device = torch.device(device) if device is not None else None
        self._prefetch = prefetch_to_device
        self._copy_stream: Any = None  # the CUDA stream prefetched batches are copied on
        self._ledger = Ledger(dataset, self._workers)  # what the training loop consumed, and the state
        self._meter = Meter(dataset.stage)  # what the loop received, for metrics() and stats()
        self._log_every = log_every
        self._logged = 0.0
        self._split = shared_rows(dataset.stage, self._workers)  # continuous rows: a batch is a part of every worker's
        self._early_on = env.start_early() if start_early is None else start_early
        self._early: _Early | None = None  # the workers started before iter() asked
        self._reports_carried: Reports | None = None  # set_weights: what the readers being replaced reported
        super().__init__(self._stream, batch_size=None, num_workers=num_workers, collate_fn=_identity, **kwargs)
        self._start_early()

    @classmethod
    def from_config(cls, config: Any, **kwargs: Any) -> DataLoader:
        """A loader over the dataset a config describes (:meth:`tidal.Dataset.from_config`), with
        the settings of its ``loader`` section (``num_workers``, ``pin_memory``, ``device``, ...);
        ``kwargs`` override them.

        >>> loader = tidal.DataLoader.from_config("pipeline.yaml", num_workers=8)
        """
        from tidal import config as schema

        data = schema.load(config)
        return cls(Dataset.from_config(data), **{**schema.loader_settings(data), **kwargs})

    def __getstate__(self) -> dict:  # a copy (pickled, deepcopied) starts its workers when iterated
        return {**self.__dict__, "_early": None}

    def stats(self) -> dict:
        """This rank's counters since its first batch: batches, tokens, seconds, throughput, the
        time the training loop waited on data and its share, and every reader's own counters
        summed (records, rows read, skipped records and where, bytes downloaded, cache hits,
        retries, records and tokens per mixed stream), as of each reader's latest bundle.

        >>> loader.stats()["wait_share"]    # 0.02: the loop waited on data 2% of the time
        """
        meter = self._meter
        seconds = meter.seconds()
        out: dict[str, Any] = {
            "batches": meter.batches,
            "tokens": meter.tokens,
            "seconds": round(seconds, 3),
            "batches_per_s": meter.batches / seconds if seconds else 0.0,
            "tokens_per_s": meter.tokens / seconds if seconds else 0.0,
            "wait_s": round(meter.wait_s, 3),
            "wait_share": meter.wait_s / seconds if seconds else 0.0,
        }
        readers = meter.readers()
        for internal in ("passed", "items", "weights_in_force"):  # positions, items read ahead, weights: not counts
            readers.pop(internal, None)
        out.update({k: v for k, v in readers.items() if k not in out})
        return out

    def metrics(self) -> dict[str, float | int]:
        """This rank's metrics as a flat dict of numbers, for a training log (see :mod:`tidal.metrics`):
        ``batches``, ``records`` and ``tokens`` (non-padding) the loop received, ``data_wait_s``
        (seconds it waited inside ``next()``) and ``data_wait_share`` (of the wall time since it
        first asked), the readers' ``bytes_read``, ``retries``, ``cache_hits``, ``skipped``, and
        under a mixture ``tokens/<stream>``, ``records/<stream>`` and ``weight/<stream>``.
        Reading it resets nothing; it counts this process's run (from a resume, not the whole run).

        >>> wandb.log(loader.metrics(), step=step)
        """
        return self._meter.metrics()

    def state_dict(self) -> dict:
        """What the training loop has consumed, on every rank: small, JSON-able, topology-free.

        Under ``torch.distributed`` this gathers the state of all ranks, so every rank must
        call it at the same step (as with any collective); every rank then gets the same
        dict. It also compares the ``set_weights`` calls every rank made since the last
        ``state_dict()``: ranks that made other calls (other weights, or after another number
        of batches) are named in an :class:`~tidal.ArgumentError`, raised on every rank. Without
        it (``RANK``/``WORLD_SIZE`` only), it covers this rank alone: combine the ranks' states
        with :func:`tidal.state.merge` for an elastic restore.
        """
        held = _held_by_lightning(self) * (self._workers if self._split else 1)  # not trained on: not consumed
        return self._ledger.snapshot(_all_gather if _distributed() else None, rewind=held)

    def set_weights(self, weights: Mapping[str, float]) -> None:
        """Set the mixture's weights (``{stream: weight}``, relative; streams left out: 0), from
        the next batch the loop gets on. Kept in ``state_dict()``, so a resumed run goes on with them.

        >>> loader.set_weights({"web": 0.5, "code": 0.5})

        The workers restart from the state after the last batch received (batches they read ahead
        under the old weights are dropped), so the order stays a pure function of the seed, the
        position and the weights set. Under ``pack()`` the row in progress goes on with its
        document and the next documents are drawn under the new weights (``strategy="best_fit"``:
        once the rows of its buffer in progress are served; see ``docs/mixing.md``). Call it on
        every rank after the same number of batches with the same weights: it is no collective (a
        rank a step behind would hang the others), so the next ``state_dict()``, which gathers
        every rank's calls, checks it and names the ranks that differ in an
        :class:`~tidal.ArgumentError`. A dataset without
        ``tidal.mix``, unknown names, negative or all-zero weights are an :class:`~tidal.ArgumentError`.
        """
        self._ledger.set_weights(live.for_streams(self.tidal_dataset.stage.mixed_streams(), weights))
        if self._early is not None:  # started under the old weights: again, under these
            self._start_early()

    def load_state_dict(self, state: dict) -> None:
        """Continue, at the next ``iter()``, exactly after the last batch consumed when ``state``
        was saved: batch for batch on the same topology, and with no record lost or repeated
        within the epoch on another (see :mod:`tidal.state.elastic`). A state that is not one,
        or not this dataset's, is a :class:`~tidal.StateError` naming the key. With
        ``start_early``, the workers start reading from there now (those started before stop)."""
        self._ledger.load(state)
        self._drop_early()
        if getattr(self, "_iterator", None) is not None:  # persistent workers hold the old position
            self._iterator._shutdown_workers()  # type: ignore[union-attr]
            self._iterator = None
        self._start_early()

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        ranks = World.ranks()
        ledger = self._ledger
        reopened = ledger.pending is not None or any(r is not None for r in ledger.readers)
        ledger.restore(ranks)
        self._meter.new_pass(reopened)
        self._stream.ranks = ranks
        self._stream.first_epoch = ledger.first_epoch()
        self._stream.origin = ledger.origin
        changes = ledger.changes
        bundles = self._take_early(ledger.start(ranks)) if self._early is not None else None
        if bundles is None:
            self._check_pickles()
            bundles = self._start()
        device = self._device or accelerate_device()
        together = ranks.world_size > 1 and _distributed() and self.tidal_dataset.may_end_unevenly()
        return self._round_robin(bundles, device, together, changes)

    def _start_early(self) -> None:
        """Start the workers now from where the next ``iter()`` will continue (see ``start_early``),
        where the ranks can be known now. Anything that fails here is left to ``iter()``, which
        raises it where it always did. A subclass whose readers are not torch's workers
        (``tidal.ray``'s actors) starts them when iterated."""
        self._drop_early()
        if not self._early_on or type(self)._start is not DataLoader._start:
            return
        try:
            ranks = World.settled()
            if ranks is None:
                return
            at = self._ledger.start(ranks)
            self._check_pickles()
            stream = self._stream
            stream.ranks, stream.first_epoch, stream.origin = at.ranks, at.first_epoch, at.origin
            # (the context asked only with workers: asking fixes the default start method)
            taken = Taken((self.multiprocessing_context or multiprocessing.get_context()) if self.num_workers else None)
            with _rng_kept(self.generator):
                bundles, made = self._launch(at.readers, at.weights, at.next_worker, head_start=2, taken=taken)
        except Exception as exc:
            _log.debug("tidal: the workers start when iterated: %s", exc)
            return
        self._early = _Early(at, bundles, weakref.finalize(self, _abandoned, bundles, made, taken), taken)

    def _take_early(self, at: Start) -> Iterator[Bundle] | None:
        """The workers started early, if they started from ``at`` (else they are stopped)."""
        early, self._early = self._early, None
        if early is None or early.start != at:
            if early is not None:
                self._drop(early)
            return None
        early.dropped.detach()
        if early.taken is not None:
            early.taken.take()  # its readers report the bad data they meet from now on
        torch.empty((), dtype=torch.int64).random_(generator=self.generator)  # iter()'s draw, kept in order
        return early.bundles

    def _drop_early(self) -> None:
        early, self._early = self._early, None
        if early is not None:
            self._drop(early)

    def _drop(self, early: _Early) -> None:
        """Stop a pass started early; another starts in its place, which need not wait for the
        system to free what its killed workers held (the finalizer, at the loader's end, waits)."""
        found = early.dropped.detach()
        if found is not None:
            _, stop, args, kwargs = found
            if stop is _abandoned:  # (a subclass's readers, tidal.ray's actors, stop their own way)
                kwargs = {**kwargs, "wait": False}
            stop(*args, **kwargs)
        if getattr(self, "_iterator", None) is early.bundles:  # persistent workers
            self._iterator = None

    def _start(self) -> Iterator[Bundle]:
        """Torch's iterator over the workers, each started from the ledger's reader state."""
        ledger = self._ledger
        return self._launch(ledger.readers, ledger.weights, ledger.next_worker)[0]

    def _launch(
        self,
        readers: list[dict | None],
        weights: dict | None,
        first: int,
        head_start: int = 0,
        taken: Taken | None = None,
    ) -> tuple[Iterator[Bundle], list[str]]:
        """Torch's iterator over the workers, worker ``w`` started from ``readers[w]`` under
        ``weights``, worker ``first`` first; and the shared memory made for them. ``head_start``:
        with no workers, the first bundles made in a thread from now on; ``taken``: a pass
        started early, whose readers report bad data once it is taken."""
        self._stream.states = readers
        self._stream.taken = taken
        # a restart within the pass (set_weights) carries what the readers it replaces reported
        carried = getattr(self, "_reports_carried", None)
        self._reports_carried = None
        if carried is None:
            old = self._stream.reports
            if old is not None:
                old.clear()
            carried = fresh_reports()
        self._stream.reports = carried
        self._stream.weights = weights
        if self.persistent_workers and getattr(self, "_iterator", None) is not None:
            self._iterator._shutdown_workers()  # type: ignore[union-attr]
            self._iterator = None  # the workers must start from this state
        self._stream.bundled = True  # for the workers (or the main-process reader) started now
        self._stream.loop = os.getpid()
        # torch asks a worker for about prefetch_factor results ahead: a ring holds those and one more
        self._stream.slots = (self.prefetch_factor or 2) + 1
        made = (
            rings.make_rings(self.num_workers, self._stream.slots) if self.num_workers and env.shared_memory() else None
        )
        self._stream.rings = made or []
        if self.num_workers:
            warmup.preload_readers(self.multiprocessing_context)
        gate = self._stream.warmup = warmup.start_gate(self.multiprocessing_context, self.num_workers, first)
        self._stream.first = first
        self._stream.head_start = head_start
        given = self.multiprocessing_context
        # (asked only with workers: asking fixes the default start method, as starting them does)
        method = (given or multiprocessing).get_start_method() if gate is not None else ""
        try:
            with spawn_turns.started_in_turn(gate, method, self.num_workers) as in_turn:
                if in_turn is not None:  # torch's workers spawned, more than the cores: sent their work in turn
                    self.multiprocessing_context = in_turn
                bundles = super().__iter__()
        except BaseException:
            rings.release(made or [])
            raise
        finally:
            if self.multiprocessing_context is not given:
                self.multiprocessing_context = given
            self._stream.bundled = False
            self._stream.rings = []
            self._stream.warmup = None
            self._stream.first = 0
            self._stream.loop = None  # a loader rebuilt from the stream (Accelerate) starts workers of its own
            self._stream.head_start = 0
            self._stream.taken = None
        if made:  # the workers' rings live as long as the workers: until torch's iterator goes
            weakref.finalize(bundles, rings.release, made)
        if gate is not None:  # so does the gate: spawned workers open its semaphore as they start
            weakref.finalize(bundles, _kept, gate)
        if taken is not None:  # and the events of a pass started early, for the same reason
            weakref.finalize(bundles, _kept, taken)
        return bundles, made or []

    def _check_pickles(self) -> None:
        """Workers started with spawn or forkserver receive the dataset pickled: say which
        function does not pickle, instead of torch's error from inside the worker start."""
        if self.num_workers == 0:
            return
        context = self.multiprocessing_context
        method = context.get_start_method() if context is not None else multiprocessing.get_start_method()
        if method == "fork":
            return
        check_pickles(self.tidal_dataset.stage, f"DataLoader workers started with {method!r}")

    def _round_robin(
        self, bundles: Iterator[Bundle], device: torch.device | None, together: bool, changes: int
    ) -> Iterator[Any]:
        """Batches in worker order. ``together``: ranks end the pass on the same step (one
        all_reduce per batch: does every rank have one?), so DDP never waits on a rank that ran out.
        ``changes``: the weights the workers started with; set again, the workers restart."""
        n = self._workers
        non_blocking = bool(self.pin_memory)
        ahead = self._prefetch > 0
        ledger = self._ledger
        made = self._make(bundles, n, ledger.next_worker, device if ahead else None)
        source: Iterator[tuple[int, dict, int, Any, Any, Mark]] = (
            Ahead(made, self._prefetch, "tidal-prefetch-to-device") if ahead else made
        )
        stopped = False
        parts: list[Any] = []  # continuous rows over several workers: this step's part of each
        clock = time.perf_counter
        meter = self._meter
        # held here: a generator dropped at interpreter exit runs after module globals are gone
        close, trim = _close, RECYCLED.trim
        if meter.started is None:
            self._logged = meter.start()
        asked = clock()  # when the training loop last asked for a batch
        marks: list[tuple[int, Mark]] = []  # what the batch (or each worker's part of it) holds
        try:
            while True:
                if ledger.changes != changes:  # set_weights: read on from what the loop received
                    changes = ledger.changes
                    close(source)
                    self._stop_workers(bundles)
                    reports = self._stream.reports  # what the readers reported: not again, nor counted
                    carried = reports.gathered() if reports is not None else None
                    made_before = len(carried.before) - len(reports.before) if carried and reports else None
                    self._reports_carried = carried
                    meter.new_pass(reopened=True, reported=made_before)
                    bundles = self._start()
                    made = self._make(bundles, n, ledger.next_worker, device if ahead else None)
                    source = Ahead(made, self._prefetch, "tidal-prefetch-to-device") if ahead else made
                try:
                    w, reader, tokens, item, copied, mark = next(source)
                except StopIteration:
                    break
                if self._split and w != len(parts):
                    break  # a worker ended: no whole step is left (see tidal.transport.bundles.steps)
                batches = int(not self._split or w == n - 1)
                ledger.consume(w, reader, tokens, batches)
                marks.append((w, mark))
                if ahead:
                    item = arrived(item, copied, device)
                else:
                    item = item if device is None else to_device(item, device, non_blocking)
                if self._split:
                    parts.append(item)
                    if len(parts) < n:
                        continue
                    item, parts = side_by_side(parts, torch.cat), []
                if together and not _every_rank_has(True):
                    stopped = True  # another rank ran out: this pass ends here for all (what this
                    break  # one consumed of it does not count: a pass's end starts the next afresh)
                meter.received(marks, clock() - asked)
                marks = []
                yield item
                asked = clock()
                if self._log_every is not None and asked - self._logged >= self._log_every:
                    self._logged = asked
                    _log.info("%s", describe(self.stats()))
        except BaseException:  # an error, or the loop dropped this iterator: nothing will read on
            close(source)  # first the thread that reads from the workers: it would wait on them forever
            self._stop_workers(bundles)
            raise
        finally:
            close(source)
            trim()  # the copies of bundles nothing holds any more: back to the system
        if not stopped:
            if together:
                _every_rank_has(False)  # the step the others are asking about
            for _ in bundles:  # let torch see every worker finish
                pass
        ledger.pass_ended()

    def _stop_workers(self, bundles: Iterator[Bundle]) -> None:
        """Stop torch's worker processes now. Left to torch's ``__del__``, an iterator caught in a
        reference cycle (an exception's traceback holds it) is collected after its queues were
        closed, and each worker then waits out torch's 5 s join instead of being told to stop."""
        stop = getattr(bundles, "_shutdown_workers", None)
        if stop is not None:
            stop()
        if getattr(self, "_iterator", None) is bundles:  # persistent workers: start afresh next time
            self._iterator = None

    def _make(
        self, bundles: Iterator[Bundle], n: int, start: int, device: torch.device | None
    ) -> Iterator[tuple[int, dict, int, Any, Any, Mark]]:
        """``(worker, reader state after it, tokens, batch, copy event, mark)`` in round-robin
        order; with ``device`` (prefetching), the batch is already copied there."""

        asked = getattr(bundles, "fetch", None)  # readers asked by number (tidal.ray's actors), not torch's

        def fetch(w: int) -> Bundle:
            got = asked(w) if asked is not None else next(bundles)
            if isinstance(got, _WorkerError):
                got.raise_()
            return got

        for w, bundle, j in round_robin(fetch, n, start, self._meter.bundle):
            self._meter.bundle(bundle.worker, bundle.stats)
            item = bundle.item(j)
            tokens = 0
            if isinstance(item, dict) and isinstance(item.get("input_ids"), torch.Tensor):
                tokens = item["input_ids"].numel()
            copied = None
            if device is not None:
                item, copied = self._copy(item, device)
            yield w, bundle.states[j], tokens, item, copied, bundle.marks[j]

    def _copy(self, item: Any, device: torch.device) -> tuple[Any, Any]:
        """``item`` on ``device``, copied ahead from a background thread (see :func:`copied_ahead`)."""
        if device.type == "cuda" and self._copy_stream is None:
            self._copy_stream = torch.cuda.Stream(device)
        return copied_ahead(item, device, self._copy_stream)


def _kept(_: Any) -> None:
    """What a finalizer calls with what it kept alive until then."""


class _Early(NamedTuple):
    """Workers started before ``iter()`` asked: where from, torch's iterator over them, and what
    stops them at once (called when dropped, or when the loader goes, or at exit)."""

    start: Start
    bundles: Iterator[Bundle]
    dropped: weakref.finalize
    taken: Taken | None = None  # set when iter() takes it: its readers report bad data from then on


def _abandoned(bundles: Iterator[Bundle], made: list[str], taken: Taken | None = None, wait: bool = True) -> None:
    """Stop a pass started early. ``wait=False``: its killed workers are joined, and their shared
    memory released, in a thread (another pass starts in its place meanwhile)."""
    if taken is not None:
        taken.drop()  # a reader in a thread waiting to report ends, reporting nothing
    killed = abandon(bundles)
    if wait:
        _reap(killed, made)
    else:
        # not a daemon: a script that ends at once still releases the rings (it waits ~20 ms)
        threading.Thread(target=_reap, args=(killed, made), name="tidal-reap").start()


def _reap(workers: list[Any], made: list[str]) -> None:
    for worker in workers:
        worker.join()
    rings.release(made)


@contextlib.contextmanager
def _rng_kept(generator: torch.Generator | None) -> Iterator[None]:
    """Torch's random state as it was: a torch iterator draws its workers' seed from it as it is
    made, and one made early must not move the draws of the script's model building."""
    state = generator.get_state() if generator is not None else torch.random.get_rng_state()
    try:
        yield
    finally:
        if generator is not None:
            generator.set_state(state)
        else:
            torch.random.set_rng_state(state)


def _close(source: Iterator[Any]) -> None:
    """Stop a read-ahead thread (again: closing twice is nothing)."""
    try:
        if isinstance(source, Ahead):
            source.close()
    except Exception:
        pass
