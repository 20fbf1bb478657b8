"""LitData: ``litdata.optimize`` chunks, read by its ``StreamingDataset`` and ``StreamingDataLoader``."""

from __future__ import annotations

import argparse
import os
import time
from typing import TYPE_CHECKING, Any

from common import read_jsonl

from peers.base import DATA_VERSION, Copy, Peer
from peers.packing import packed

if TYPE_CHECKING:
    from peers.spec import Spec


def write(files: list[str], out: str, shard_mb: float, row_group: int) -> dict[str, Any]:
    """``optimize`` with 2 workers; it sets the start method to spawn for good, hence a process of its own."""
    import litdata

    t0 = time.perf_counter()
    litdata.optimize(
        fn=read_jsonl, inputs=files, output_dir=out, chunk_bytes=int(shard_mb * 1e6), num_workers=2, mode="overwrite"
    )
    return {"seconds": time.perf_counter() - t0, "tool": "litdata.optimize, 2 workers"}


def params(args: argparse.Namespace) -> dict[str, Any]:
    return {"shard_mb": args.shard_mb, "version": DATA_VERSION, "workers": 2}


COPY = Copy("litdata", "*.bin", params, write)
COPIES = (COPY,)


def records(spec: Spec) -> Any:
    from litdata import StreamingDataset

    if spec.url:  # storage_options are boto3 client arguments; the credentials come from the environment
        from litdata.streaming import downloader

        # LitData GETs chunks with obstore, whose client options it fixes without allow_http: obstore would refuse
        # the server's http:// endpoint (real S3 is https). Allowed here, so LitData reads the server as tidal does.
        downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = True
        cache = os.path.join(spec.cache, "litdata")
        options = {"endpoint_url": spec.endpoint}
        return StreamingDataset(spec.url, cache_dir=cache, storage_options=options, shuffle=True, seed=spec.seed)
    return StreamingDataset(spec.root, shuffle=True, seed=spec.seed)


def loader(spec: Spec) -> Any:
    from litdata import StreamingDataLoader

    return StreamingDataLoader(records(spec), batch_size=spec.batch, num_workers=spec.workers)


PEERS = (
    Peer(
        "litdata", COPY, loader, packed(records), resumable=True,
        how="litdata.StreamingDataset('s3://bench/litdata', cache_dir=..., storage_options={'endpoint_url': ...})",
    ),
)  # fmt: skip
