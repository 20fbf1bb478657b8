"""Every environment variable tidal reads, read here and only when asked, never at import.

- ``RANK`` / ``WORLD_SIZE``: the rank and world size torchrun sets, used when
  ``torch.distributed`` is not initialized (see :mod:`tidal.world`).
- ``TIDAL_CACHE_DIR``, else ``XDG_CACHE_HOME``: where tidal keeps shard indexes it cannot
  write beside the data, and the shard cache of remote datasets.
"""

from __future__ import annotations

import os
from pathlib import Path

from tidal.errors import TidalError


def ranks() -> tuple[int, int] | None:
    """``(RANK, WORLD_SIZE)`` when both are set, else None; malformed values are an error that names them."""
    rank, size = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if rank is None or size is None:
        return None
    try:
        r, n = int(rank), int(size)
    except ValueError:
        raise TidalError(f"RANK={rank!r} and WORLD_SIZE={size!r} must be integers") from None
    if not 0 <= r < n:
        raise TidalError(f"RANK={r} is outside WORLD_SIZE={n}")
    return r, n


def cache_dir() -> Path:
    """tidal's cache directory: ``$TIDAL_CACHE_DIR``, else ``$XDG_CACHE_HOME/tidal``, else ``~/.cache/tidal``."""
    if os.environ.get("TIDAL_CACHE_DIR"):
        return Path(os.environ["TIDAL_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tidal"
