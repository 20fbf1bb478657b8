"""``tidal.ray``: tidal's readers as Ray actors on a cluster's CPUs, feeding the training processes.

>>> import tidal.ray
>>> loader = tidal.ray.DataLoader(ds, readers=16, reader_options={"num_cpus": 2})

``tidal.ray.DataLoader`` yields the batches ``tidal.DataLoader(ds, num_workers=16)`` yields,
with the same state; a reader that dies is replaced from the ledger (see ``docs/ray.md``).
Importing this package needs neither Ray nor torch; ``tidal.ray.DataLoader`` imports both, a
missing one being a :class:`~tidal.MissingDependency` naming its ``pip install``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tidal.ray.loader import DataLoader

__all__ = ["DataLoader"]


def __getattr__(name: str) -> Any:
    if name == "DataLoader":  # imports torch and Ray: only when asked for
        from tidal.ray.loader import DataLoader

        return DataLoader
    raise AttributeError(f"module 'tidal.ray' has no attribute {name!r}")
