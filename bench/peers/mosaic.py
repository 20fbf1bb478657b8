"""Mosaic ``streaming``: MDS shards written by ``MDSWriter``, read by its ``StreamingDataset`` and
``StreamingDataLoader``."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from typing import TYPE_CHECKING, Any

from common import read_jsonl

from peers.base import DATA_VERSION, Copy, Peer
from peers.packing import packed

if TYPE_CHECKING:
    from peers.spec import Spec


def mosaic() -> Any:
    """Mosaic ``streaming.base``. ``import streaming`` also imports its vision datasets, hence torchvision, which
    does not import beside this project's CPU torch; ``streaming.base`` needs none of it, so where the package
    fails to import whole, it is registered as a bare package and its ``base`` submodule imported alone."""
    import importlib
    import importlib.util
    import types

    try:
        import streaming

        return streaming.base
    except (ImportError, RuntimeError):
        spec = importlib.util.find_spec("streaming")
        if spec is None or spec.submodule_search_locations is None:
            raise
        for name in [m for m in sys.modules if m == "streaming" or m.startswith("streaming.")]:
            del sys.modules[name]
        package = types.ModuleType("streaming")
        package.__path__ = list(spec.submodule_search_locations)
        package.__spec__ = spec
        sys.modules["streaming"] = package
        return importlib.import_module("streaming.base")


def write(files: list[str], out: str, shard_mb: float, row_group: int) -> dict[str, Any]:
    """Columns ``int64`` and ``str``, ``shard_mb`` MB shards, in one process."""
    writer_cls = mosaic().MDSWriter
    t0 = time.perf_counter()
    with writer_cls(out=out, columns={"id": "int64", "text": "str"}, size_limit=int(shard_mb * 1e6)) as writer:
        for f in files:
            for rec in read_jsonl(f):
                writer.write(rec)
    return {"seconds": time.perf_counter() - t0, "tool": "streaming.MDSWriter, 1 process"}


def params(args: argparse.Namespace) -> dict[str, Any]:
    return {"shard_mb": args.shard_mb, "version": DATA_VERSION}


COPY = Copy("mds", "*.mds", params, write)
COPIES = (COPY,)


def records(spec: Spec) -> Any:
    base = mosaic()
    with contextlib.suppress(Exception):  # shared memory a killed run left behind
        base.util.clean_stale_shared_memory()
    if spec.url:  # Mosaic's S3 client takes its endpoint from $S3_ENDPOINT_URL, which the parent set
        local = os.path.join(spec.cache, "mosaic")
        return base.StreamingDataset(
            remote=spec.url, local=local, shuffle=True, shuffle_seed=spec.seed, batch_size=spec.batch
        )
    return base.StreamingDataset(local=spec.root, shuffle=True, shuffle_seed=spec.seed, batch_size=spec.batch)


def loader(spec: Spec) -> Any:
    return mosaic().StreamingDataLoader(records(spec), batch_size=spec.batch, num_workers=spec.workers)


PEERS = (
    Peer(
        "mosaic", COPY, loader, packed(records), resumable=True,
        how="streaming.base.StreamingDataset(remote='s3://bench/mds', local=...), $S3_ENDPOINT_URL",
    ),
)  # fmt: skip
