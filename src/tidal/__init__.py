"""tidal: stream training data larger than memory into PyTorch and JAX training.

>>> import tidal
>>> ds = tidal.Dataset("data/*.parquet", columns=["text"]).shuffle(seed=0).repeat().batch(8)
>>> loader = tidal.DataLoader(ds, num_workers=2)     # a torch DataLoader with state_dict()
>>> loader = tidal.jax.Loader(ds)                    # or global jax.Arrays, without torch
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tidal.dataset import Dataset, mix
from tidal.errors import (
    ArgumentError,
    ConfigError,
    FormatError,
    MissingDependency,
    RecordError,
    SchemaError,
    SourceError,
    StateError,
    StorageError,
    TidalError,
    Untraceable,
)
from tidal.provenance import trace
from tidal.sources.indexing import index
from tidal.sources.shards import Shard, Shards
from tidal.stages.mix import Cosine, Linear, Piecewise
from tidal.world import World

if TYPE_CHECKING:
    from tidal.loader import DataLoader

__all__ = [
    "ArgumentError",
    "ConfigError",
    "Cosine",
    "DataLoader",
    "Dataset",
    "FormatError",
    "Linear",
    "MissingDependency",
    "Piecewise",
    "RecordError",
    "SchemaError",
    "Shard",
    "Shards",
    "SourceError",
    "StateError",
    "StorageError",
    "TidalError",
    "Untraceable",
    "World",
    "index",
    "mix",
    "trace",
]

from tidal.version import __version__ as __version__


def __getattr__(name: str) -> Any:
    if name == "DataLoader":  # imports torch: only when asked for
        from tidal.loader import DataLoader

        return DataLoader
    # tidal.jax imports JAX: only when asked for (tidal.ray's DataLoader, Ray); tidal.testing and
    # tidal.verify, the checks; tidal.integrations, the callbacks
    if name in ("jax", "ray", "testing", "verify", "integrations"):
        import importlib

        return importlib.import_module(f"tidal.{name}")
    raise AttributeError(f"module 'tidal' has no attribute {name!r}")
