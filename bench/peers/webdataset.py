"""WebDataset: tar shards of ``KEY.txt`` and ``KEY.id`` written by ``ShardWriter``, read by ``WebDataset`` through
``WebLoader``."""

from __future__ import annotations

import argparse
import os
import time
from typing import TYPE_CHECKING, Any

from common import read_jsonl

from peers.base import DATA_VERSION, Copy, Peer
from peers.packing import packed
from peers.s3 import s3_options

if TYPE_CHECKING:
    from peers.spec import Spec


def write(files: list[str], out: str, shard_mb: float, row_group: int) -> dict[str, Any]:
    """``shard_mb`` MB of payload per tar, in one process."""
    import webdataset as wds

    t0 = time.perf_counter()
    os.makedirs(out)
    with wds.ShardWriter(os.path.join(out, "shard-%05d.tar"), maxsize=int(shard_mb * 1e6), verbose=0) as writer:
        for f in files:
            for rec in read_jsonl(f):
                writer.write({"__key__": f"{rec['id']:010d}", "txt": rec["text"], "id": str(rec["id"]).encode()})
    return {"seconds": time.perf_counter() - t0, "tool": "webdataset.ShardWriter, 1 process"}


def params(args: argparse.Namespace) -> dict[str, Any]:
    return {"shard_mb": args.shard_mb, "version": DATA_VERSION}


COPY = Copy("wds", "*.tar", params, write)
COPIES = (COPY,)


def record(sample: dict[str, Any]) -> dict[str, Any]:
    """A decoded tar sample as the record the others yield."""
    return {"id": int(sample["id"]), "text": sample["txt"]}


def s3_open(options: dict[str, Any], url: str, mode: str = "rb", bufsize: int = 8192, **kw: Any) -> Any:
    """WebDataset's opener of ``s3://`` URLs (its ``gopen`` has none): the object streamed through fsspec (s3fs)."""
    import fsspec

    return fsspec.open(url, mode, **options).open()


def records(spec: Spec, batch: int = 0) -> Any:
    import webdataset as wds

    if spec.url:  # the shards listed on the server; an s3 opener in gopen's table of schemes (it has none)
        import functools
        import importlib

        import fsspec

        options = s3_options(spec)
        fs = fsspec.filesystem("s3", **options)
        urls = sorted(f"s3://{p}" for p in fs.glob(f"{spec.url[len('s3://') :]}/{COPY.pattern}"))
        gopen = importlib.import_module("webdataset.gopen")  # the module: ``wds.gopen`` is its function
        gopen.gopen_schemes["s3"] = functools.partial(s3_open, options)
    else:
        urls = COPY.files(spec.root)
    ds = wds.WebDataset(urls, shardshuffle=len(urls), detshuffle=True, seed=spec.seed, empty_check=False)
    ds = ds.shuffle(1000, seed=spec.seed).decode().map(record)
    return ds.batched(batch) if batch else ds


def loader(spec: Spec) -> Any:
    import webdataset as wds

    return wds.WebLoader(records(spec, spec.batch), batch_size=None, num_workers=spec.workers)


PEERS = (
    Peer(
        "webdataset", COPY, loader, packed(records),
        how="wds.WebDataset([s3://bench/wds/*.tar listed with s3fs]), gopen_schemes['s3'] = fsspec.open (s3fs)",
    ),
)  # fmt: skip
