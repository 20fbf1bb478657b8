"""``tidal.ray.DataLoader``: ``tidal.DataLoader`` whose workers are Ray actors on a cluster.

A reader is a worker that lives elsewhere: reader ``w`` of rank ``r`` reads the share worker
``w`` of rank ``r`` reads under ``tidal.DataLoader(ds, num_workers=readers)``, from the same
reader state, and sends the same bundles (:mod:`tidal.transport.actors`). Everything past the
bundles is ``tidal.DataLoader``'s own code, inherited: the round robin over readers, the
ledger (the state after the last batch the loop received from each reader), ``state_dict()``
and its gather over ranks, ``set_weights``, ``metrics()``, ``device=`` and
``prefetch_to_device=``. So the batches are those of the local loader, batch for batch, and a
state moves between the two in both directions, elastically.

The ledger lives in the training process: a reader holds no state anyone needs after it dies,
and its replacement starts from the state after the last batch received from it.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from tidal.dataset import Dataset
from tidal.errors import ArgumentError, needs
from tidal.loader import DataLoader as LocalLoader
from tidal.loader import _Early
from tidal.stages.continuous import shared_rows
from tidal.stages.policy import HeldReports, Reports
from tidal.state.ledger import Ledger
from tidal.transport.actors import FIXED_OPTIONS, Actors, Session, remote_reader
from tidal.transport.bundles import Bundle, check_pickles, numeric, prepare
from tidal.transport.torch import TorchBundle
from tidal.world import World

_log = logging.getLogger("tidal")
_ray = needs("ray", "tidal.ray.DataLoader", "ray")

# keyword arguments of tidal.DataLoader that mean something here; the rest are torch's worker settings
_LOADER_KWARGS = ("batch_size", "drop_last", "pin_memory", "start_early")


def _writable(value: np.ndarray) -> np.ndarray:
    """An array out of Ray's object store (read-only) as a tensor may hold it: token ids as int64
    (a copy anyway), others copied only if read-only."""
    if value.dtype in (np.uint16, np.uint32):
        return value.astype(np.int64)
    return value if value.flags.writeable else value.copy()


def as_torch(bundle: Bundle) -> TorchBundle:
    """A bundle from a Ray reader as the bundles of ``tidal.DataLoader``'s workers arrive: batches
    of tensors (int64 token ids), text as lists."""
    new = TorchBundle.__new__(TorchBundle)
    new.__dict__.update(bundle.__dict__)
    new.pack, new.ring, new.wide = True, None, set()
    if bundle.columns is not None:
        new.columns = {
            k: _writable(v) if numeric(v) else [prepare(x, _writable) for x in v] if isinstance(v, list) else v
            for k, v in bundle.columns.items()
        }
    else:
        new.items = [prepare(item, _writable) for item in bundle.items or []]
    return new


class _ActorReports(HeldReports):
    """The bad records a pass's Ray readers reported: each actor keeps its own (the training
    machine's folder of :class:`~tidal.stages.policy.Reports` is out of other nodes' reach), and
    :meth:`gathered` asks the live ones (``set_weights``: the loop has stopped fetching)."""

    def __init__(self, actors: Actors, before: frozenset[tuple[str, int, str, int]]):
        super().__init__(before)
        self._actors = actors

    def gathered(self) -> Reports:
        return HeldReports(self._actors.reported())


class DataLoader(LocalLoader):
    """A ``tidal.DataLoader`` whose ``readers`` workers run as Ray actors on the cluster this
    process is connected to (``ray.init(address=...)``; else ``ray.init()``'s: ``RAY_ADDRESS``'s
    cluster, or a local one).

    >>> ray.init(address="auto")
    >>> loader = tidal.ray.DataLoader(ds, readers=16, reader_options={"num_cpus": 2})
    >>> for step, batch in enumerate(loader):   # the batches of tidal.DataLoader(ds, num_workers=16)
    ...     if step % 1000 == 0:
    ...         save(loader.state_dict())        # the same state: loads into either loader

    ``reader_options``: Ray actor options of every reader (``num_cpus``, default 1;
    ``memory``, ``resources``, ``scheduling_strategy``, ``runtime_env``, ...), to size them and
    place them near the data. ``prefetch``: batches a reader makes at most ahead of those the
    training process has taken. ``reader_timeout``: seconds a reader may take to send its next
    batches (its first ones include starting the actor) before it is treated as dead.

    A reader that dies (its actor killed, its node lost, out of memory) or stops answering is
    replaced: a new actor goes on from the state after the last batch this process received
    from it, so no record is lost or repeated. ``loader.readers`` lists the actor handles.
    Under ``torch.distributed`` every rank starts its own ``readers`` readers, which read the
    shares its DataLoader workers would. ``device=``, ``prefetch_to_device=``, ``pin_memory=``,
    ``batch_size=``, ``log_every=``, ``start_early=`` are ``tidal.DataLoader``'s: the readers' actors
    start when the loader is built and are opened again when it is given a state (an actor takes
    seconds to start, which the script's model restore hides), where the ranks can be known then;
    they read when iterated.
    """

    def __init__(
        self,
        dataset: Dataset,
        readers: int = 1,
        *,
        reader_options: Mapping[str, Any] | None = None,
        prefetch: int = 8,
        reader_timeout: float = 300.0,
        device: Any = None,
        prefetch_to_device: int = 0,
        log_every: float | None = None,
        **kwargs: Any,
    ):
        if isinstance(readers, bool) or not isinstance(readers, int) or readers < 1:
            raise ArgumentError(f"readers must be a positive int, not {readers!r}")
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1:
            raise ArgumentError(f"prefetch must be a positive int (batches per reader), not {prefetch!r}")
        if isinstance(reader_timeout, bool) or not isinstance(reader_timeout, (int, float)) or not reader_timeout > 0:
            raise ArgumentError(f"reader_timeout must be a positive number of seconds, not {reader_timeout!r}")
        for key in kwargs:
            if key == "num_workers":
                raise ArgumentError("tidal.ray.DataLoader runs readers=, not num_workers= (they are Ray actors)")
            if key not in _LOADER_KWARGS:
                raise ArgumentError(f"{key}= does not apply to tidal.ray.DataLoader, whose readers are Ray actors")
        self._reader_options = _checked_options(reader_options)
        super().__init__(
            dataset, 0, device=device, prefetch_to_device=prefetch_to_device, log_every=log_every, **kwargs
        )
        # the readers are this loader's workers: the ledger and the round robin count them
        self._workers = readers
        self._ledger = Ledger(self.tidal_dataset, readers)
        self._split = shared_rows(self.tidal_dataset.stage, readers)
        self._prefetch_batches = prefetch
        self._reader_timeout = float(reader_timeout)
        self._actors: Actors | None = None
        self._start_early()  # now that the readers are counted

    @classmethod
    def from_config(cls, config: Any, **kwargs: Any) -> DataLoader:
        """A loader over the dataset a config describes, with its ``loader`` section's settings:
        its ``num_workers`` is the number of readers unless ``readers=`` is given, and the settings
        of torch's worker processes (``persistent_workers``, ``prefetch_factor``,
        ``multiprocessing_context``, ``timeout``, ``pin_memory_device``) are left out, so that one
        config serves both loaders."""
        from tidal import config as schema

        data = schema.load(config)
        settings = {**schema.loader_settings(data), **kwargs}
        workers = settings.pop("num_workers", None)
        if "readers" not in settings and workers:
            settings["readers"] = workers
        for torch_only in (
            "persistent_workers",
            "prefetch_factor",
            "multiprocessing_context",
            "timeout",
            "pin_memory_device",
        ):
            settings.pop(torch_only, None)
        return cls(Dataset.from_config(data), **settings)

    @property
    def readers(self) -> list[Any]:
        """The actor handles of this rank's readers, in reader order (a replaced reader's
        replacement in its place): those of the pass in progress, or started early for the next
        (``start_early``); empty before any started."""
        return self._actors.handles if self._actors is not None else []

    def _start(self) -> Session:
        """This rank's readers, each opened at the ledger's reader state."""
        torch.empty((), dtype=torch.int64).random_(generator=self.generator)  # torch's iterator's draw, as locally
        ledger = self._ledger
        carried, self._reports_carried = self._reports_carried, None  # set_weights: what the replaced reported
        return self._launch_actors(
            self._stream.ranks,
            ledger.readers,
            ledger.first_epoch(),
            ledger.origin,
            ledger.weights,
            reported=carried.before if carried is not None else frozenset(),
        )

    def _launch_actors(
        self,
        ranks: World,
        readers: list[dict | None],
        first_epoch: int,
        origin: dict | None,
        weights: dict | None,
        ask: bool = True,
        reported: frozenset[tuple[str, int, str, int]] = frozenset(),
    ) -> Session:
        """The readers opened for a pass: the actors of the last pass where they are (opened again,
        not started again: an actor takes seconds to start), else new ones. ``ask``: they read now.
        ``reported``: the bad records the readers they replace in the pass reported (``set_weights``)."""
        if self._actors is None or self._actors.closed:
            self._actors = Actors(
                self.tidal_dataset,
                readers=self._workers,
                options=self._reader_options,
                prefetch=self._prefetch_batches,
                timeout=self._reader_timeout,
                convert=self._as_torch,
            )
        session = self._actors.start(ranks, readers, first_epoch, origin, weights, ask, reported)
        self._stream.reports = _ActorReports(self._actors, reported)  # gathered by a set_weights restart
        return session

    def _start_early(self) -> None:
        """Start the readers' actors now, opened where the next ``iter()`` continues (``start_early``),
        where the ranks can be known now; ``iter()`` takes them only if that is where it would open
        them itself. They read when iterated: a pass dropped before (a state loaded since, other
        ranks) has read nothing, and reported no bad data. Anything that fails here is left to
        ``iter()``, which raises it."""
        self._drop_early()
        if not self._early_on or "_reader_timeout" not in self.__dict__:  # (tidal.DataLoader's __init__ calls it first)
            return
        try:
            ranks = World.settled()
            if ranks is None:
                return
            at = self._ledger.start(ranks)
            self._check_pickles()
            session = self._launch_actors(at.ranks, at.readers, at.first_epoch, at.origin, at.weights, ask=False)
        except Exception as exc:
            _log.debug("tidal.ray: the readers start when iterated: %s", exc)
            return
        self._early = _Early(at, session, weakref.finalize(self, session.park))

    def _as_torch(self, bundle: Bundle) -> TorchBundle:
        made = as_torch(bundle)
        return made.pin_memory() if self.pin_memory and torch.cuda.is_available() else made

    def _check_pickles(self) -> None:
        check_pickles(self.tidal_dataset.stage, "tidal.ray readers (Ray actors)")

    def close(self) -> None:
        """Stop this rank's readers now (a later ``iter()`` starts new ones). They live as long as
        the loader otherwise, idle between passes, as torch's ``persistent_workers``."""
        self._drop_early()
        if self._actors is not None:
            self._actors.close()
            self._actors = None


def _checked_options(options: Mapping[str, Any] | None) -> dict:
    """``reader_options`` as Ray takes them: an option tidal sets, or one Ray does not know, is an
    :class:`~tidal.ArgumentError` now, not when the readers start."""
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise ArgumentError(f"reader_options must be a dict of Ray actor options, not {type(options).__name__}")
    for key in options:
        if key in FIXED_OPTIONS:
            raise ArgumentError(
                f"reader_options[{key!r}]: tidal sets it (readers are replaced from the loader's state, "
                "not restarted by Ray, answer one call at a time, and live as long as the loader)"
            )
    try:
        remote_reader(_ray, dict(options))
    except (ValueError, TypeError) as exc:
        raise ArgumentError(f"reader_options: {exc}") from None
    return dict(options)
