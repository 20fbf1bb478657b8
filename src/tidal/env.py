"""Every environment variable tidal reads, read here and only when asked, never at import.

- ``RANK`` / ``WORLD_SIZE``: the rank and world size torchrun sets, used when
  ``torch.distributed`` is not initialized (see :mod:`tidal.world`).
- ``TIDAL_CACHE_DIR``, else ``XDG_CACHE_HOME``: where tidal keeps shard indexes it cannot
  write beside the data, and the shard cache of remote datasets.
- ``LOCAL_WORLD_SIZE`` (torchrun) and ``RAYON_NUM_THREADS``: how many threads each tokenizer
  may use, so that ranks x DataLoader workers x tokenizer threads do not exceed the cores; and
  how many readers of the machine share its shard cache.
- ``TIDAL_SHARED_MEMORY=0``: DataLoader workers send batches through a pipe, not through
  shared memory (:mod:`tidal.transport.rings`).
- ``TIDAL_WARMUP_WORKERS``: how many DataLoader workers of a rank make their first batch at
  once (:mod:`tidal.transport.warmup`; default: the rank's share of the cores).
- ``TIDAL_START_EARLY=0``: loaders start reading when iterated, not when built or given a state
  (the default of their ``start_early=``; see :mod:`tidal.transport.early`).
- ``LOCAL_RANK``, ``SLURM_NTASKS``, ``OMPI_COMM_WORLD_SIZE``, ``PMI_SIZE``: a launcher started
  this process as one of several; without ``RANK``/``WORLD_SIZE`` its rank is known only once its
  process group is, so a loader does not start reading before it is iterated.
"""

from __future__ import annotations

import os
from pathlib import Path

from tidal.errors import ConfigError


def ranks() -> tuple[int, int] | None:
    """``(RANK, WORLD_SIZE)`` when both are set, else None; malformed values are an error that names them."""
    rank, size = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if rank is None or size is None:
        return None
    try:
        r, n = int(rank), int(size)
    except ValueError:
        raise ConfigError(f"RANK={rank!r} and WORLD_SIZE={size!r} must be integers") from None
    if not 0 <= r < n:
        raise ConfigError(f"RANK={r} is outside WORLD_SIZE={n}")
    return r, n


def one_of_several() -> bool:
    """Whether a launcher's variables say this process is one of several (torchrun's
    ``LOCAL_RANK``; SLURM, Open MPI or PMI tasks above 1), whatever ``RANK`` says."""
    if os.environ.get("LOCAL_RANK", "").strip():
        return True
    for name in ("SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        value = os.environ.get(name, "").strip()
        if value.isdigit() and int(value) > 1:
            return True
    return False


def start_early() -> bool:
    """Whether loaders start reading when built or given a state (not ``TIDAL_START_EARLY=0``)."""
    return os.environ.get("TIDAL_START_EARLY", "1").strip().lower() not in ("0", "false", "no", "off")


def share_tokenizer_threads(workers: int) -> None:
    """Give the tokenizer of each of this machine's readers its share of the cores.

    HF ``tokenizers`` runs a thread pool as large as the machine unless ``RAYON_NUM_THREADS``
    says otherwise; with several DataLoader workers (and ranks) each running one, threads
    outnumber cores and every one of them slows down. Set once, before the pool starts (its
    first batch); a value the user set is kept.
    """
    readers = workers * local_ranks()
    if readers > 1 and "RAYON_NUM_THREADS" not in os.environ:
        os.environ["RAYON_NUM_THREADS"] = str(max(1, _cores() // readers))


REMOTE_READ_THREADS = 8  # a reader's threads for remote files, whatever the cores


def read_threads(workers: int = 1, remote: bool = False) -> int:
    """Threads a reader decodes a block's files with (Parquet, Arrow), reading the next block in
    them while the loop takes this one: the rank's share of the cores (``LOCAL_WORLD_SIZE`` ranks
    on a machine share them) split over its ``workers``, at most 4 and at least 1; for ``remote``
    files, :data:`REMOTE_READ_THREADS`: their ranged GETs wait on the network, not on the cores
    (one connection brings tens of MB/s, a block needs a row group of each of its files).
    ``TIDAL_READ_THREADS=N`` sets it; ``=1`` gives 0: the reader's own thread, nothing read ahead."""
    given = os.environ.get("TIDAL_READ_THREADS", "").strip()
    if given:
        if not given.isdigit() or int(given) < 1:
            raise ConfigError(f"TIDAL_READ_THREADS must be a positive integer, not {given!r}")
        return int(given) if int(given) > 1 else 0
    if remote:
        return REMOTE_READ_THREADS
    return max(1, min(4, _cores() // (local_ranks() * max(1, workers))))


def warmup_workers() -> int:
    """``TIDAL_WARMUP_WORKERS``, else the rank's share of the cores: the DataLoader workers of a
    rank that make their first batch side by side."""
    given = os.environ.get("TIDAL_WARMUP_WORKERS", "").strip()
    if given:
        if not given.isdigit() or int(given) < 1:
            raise ConfigError(f"TIDAL_WARMUP_WORKERS must be a positive integer, not {given!r}")
        return int(given)
    return max(1, _cores() // local_ranks())


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def local_ranks() -> int:
    """``LOCAL_WORLD_SIZE``: the ranks of this machine (torchrun sets it), 1 where unset."""
    local = os.environ.get("LOCAL_WORLD_SIZE", "1")
    return int(local) if local.isdigit() and int(local) > 0 else 1


def shared_memory() -> bool:
    """Whether DataLoader workers may send batches through shared memory (not ``TIDAL_SHARED_MEMORY=0``)."""
    return os.environ.get("TIDAL_SHARED_MEMORY", "1").strip() not in ("0", "false", "no", "off")


def cache_dir() -> Path:
    """tidal's cache directory: ``$TIDAL_CACHE_DIR``, else ``$XDG_CACHE_HOME/tidal``, else ``~/.cache/tidal``."""
    if os.environ.get("TIDAL_CACHE_DIR"):
        return Path(os.environ["TIDAL_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tidal"
