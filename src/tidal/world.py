"""Where this process sits: rank and world size, DataLoader worker and worker count.

This is the only module that decides the topology (the variables themselves are read in
:mod:`tidal.env`). It is read when iteration starts, never when a dataset is built, because a
dataset is often built before ``torch.distributed.init_process_group`` runs or before
DataLoader workers exist. Under JAX a rank is a JAX process.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from tidal import env
from tidal.errors import ArgumentError


@dataclass(frozen=True)
class World:
    """A frozen topology: ``rank`` of ``world_size`` processes, ``worker`` of ``num_workers``.

    ``num_workers`` is at least 1: a process with no DataLoader workers is its own worker 0.
    ``lane`` of ``lanes``: one of the rows a reader streams side by side (continuous batch
    rows, :mod:`tidal.stages.continuous`); each lane reads a share of its own, so the data is
    split over ranks x workers x lanes. A reader that is not split into rows is its own lane 0.
    """

    rank: int = 0
    world_size: int = 1
    worker: int = 0
    num_workers: int = 1
    lane: int = 0
    lanes: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ArgumentError(f"rank {self.rank} is outside world size {self.world_size}")
        if not 0 <= self.worker < self.num_workers:
            raise ArgumentError(f"worker {self.worker} is outside {self.num_workers} workers")
        if not 0 <= self.lane < self.lanes:
            raise ArgumentError(f"lane {self.lane} is outside {self.lanes} lanes")

    @property
    def consumers(self) -> int:
        """How many independent readers share the data: ranks times workers times lanes."""
        return self.world_size * self.num_workers * self.lanes

    @property
    def consumer(self) -> int:
        """This reader's index among all of them: rank-major, then worker, then lane."""
        return (self.rank * self.num_workers + self.worker) * self.lanes + self.lane

    def with_worker(self, worker: int, num_workers: int) -> World:
        return World(self.rank, self.world_size, worker, max(1, num_workers))

    def with_lane(self, lane: int, lanes: int) -> World:
        """Lane ``lane`` of ``lanes`` of this reader (which must not be split into lanes already)."""
        if self.lanes != 1:
            raise ArgumentError(f"this reader is already split into {self.lanes} lanes")
        return World(self.rank, self.world_size, self.worker, self.num_workers, lane, lanes)

    @staticmethod
    def ranks() -> World:
        """Rank and world size: from ``torch.distributed`` when initialized, else from JAX when it
        runs as several processes (the rank is ``jax.process_index()``), else RANK/WORLD_SIZE."""
        torch = sys.modules.get("torch")  # never import torch just to find out it is unused
        if torch is not None:
            dist = torch.distributed
            if dist.is_available() and dist.is_initialized():
                return World(dist.get_rank(), dist.get_world_size())
        processes = _jax_processes()
        if processes is not None:
            return World(*processes)
        found = env.ranks()
        return World(*found) if found is not None else World()

    @staticmethod
    def settled() -> World | None:
        """The ranks :meth:`ranks` reads, where they can be known before iteration starts; None
        where a process group not yet initialized may say otherwise (a launcher's variables,
        ``LOCAL_RANK`` or SLURM's or MPI's tasks, without ``RANK``/``WORLD_SIZE``). A loader starts
        reading early only as these ranks, and starts afresh if :meth:`ranks` says otherwise when
        it is iterated (a process group initialized since, from a rank of its own)."""
        torch = sys.modules.get("torch")
        if torch is not None:
            dist = torch.distributed
            if dist.is_available() and dist.is_initialized():
                return World.ranks()
        if _jax_processes() is not None or env.ranks() is not None or not env.one_of_several():
            return World.ranks()
        return None

    @staticmethod
    def current() -> World:
        """The full topology of the calling process, DataLoader worker included: the reader it
        runs (see :func:`runs_reader`)."""
        world = World.ranks()
        torch = sys.modules.get("torch")
        if torch is not None:
            info = torch.utils.data.get_worker_info()
            if info is not None:
                return world.with_worker(info.id if _reader is None else _reader, info.num_workers)
        return world


_reader: int | None = None  # the reader this DataLoader worker process runs, where tidal's loader started it


def runs_reader(worker: int) -> None:
    """This DataLoader worker process runs reader ``worker`` of its rank, not necessarily torch's
    worker id: torch asks its workers for batches from its worker 0, a resumed loop from the reader
    it continues with, so tidal's loader starts that reader in torch's worker 0 (:mod:`tidal.loader`)."""
    global _reader
    _reader = worker


def _jax_processes() -> tuple[int, int] | None:
    """``(jax.process_index(), jax.process_count())`` when JAX runs as several processes, else None.

    JAX is asked only when it is imported already, and only once ``jax.distributed.initialize``
    has run or its backends are up (as on TPU pods): asking earlier would start its backends,
    after which ``jax.distributed.initialize`` refuses to run.
    """
    jax = sys.modules.get("jax")
    if jax is None:
        return None
    distributed = getattr(jax, "distributed", None)
    ready = getattr(distributed, "is_initialized", None)
    started = ready is not None and ready()
    if not started:
        bridge = sys.modules.get("jax._src.xla_bridge")
        up = getattr(bridge, "backends_are_initialized", None)
        started = up is not None and up()
    if not started:
        return None
    count = jax.process_count()
    return (jax.process_index(), count) if count > 1 else None
