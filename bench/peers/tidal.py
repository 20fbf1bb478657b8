"""tidal itself, on two copies: the generator's JSONL as it is, and Parquet (which HF reads too). Its index of each
copy is built once, before any measurement, so that none of them pays for it."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common import log

from peers.base import DATA_VERSION, Copy, Peer
from peers.s3 import s3_options

if TYPE_CHECKING:
    from peers.spec import Spec

COLUMNS = ["id", "text"]


def write_parquet(files: list[str], out: str, shard_mb: float, row_group: int) -> dict[str, Any]:
    """One Parquet file per JSONL shard, ``row_group`` rows per row group, snappy."""
    import pyarrow.json as pj
    import pyarrow.parquet as pq

    t0 = time.perf_counter()
    os.makedirs(out)
    for f in files:
        table = pj.read_json(f, pj.ReadOptions(block_size=16 << 20)).select(COLUMNS)
        pq.write_table(table, os.path.join(out, Path(f).stem + ".parquet"), row_group_size=row_group)
    return {"seconds": time.perf_counter() - t0, "tool": f"pyarrow, {row_group:,} rows per row group"}


def parquet_params(args: argparse.Namespace) -> dict[str, Any]:
    return {"row_group": args.row_group, "compression": "snappy", "version": DATA_VERSION}


JSONL = Copy("jsonl", "*.jsonl")
PARQUET = Copy("parquet", "*.parquet", parquet_params, write_parquet)
COPIES = (JSONL, PARQUET)
COPY_OF = {"tidal-parquet": PARQUET, "tidal-jsonl": JSONL}


def loader(spec: Spec, tokens: bool = False) -> Any:
    import tidal

    if spec.url:  # the objects as the store has them, through tidal's shard cache in ``spec.cache``
        from tidal.storage import Storage

        storage = Storage(options=s3_options(spec), cache_dir=os.path.join(spec.cache, "tidal"))
        src = f"{spec.url}/{COPY_OF[spec.loader].pattern}"
        ds = tidal.Dataset(src, columns=COLUMNS, storage=storage)
    else:
        ds = tidal.Dataset(spec.root, columns=COLUMNS)
    ds = ds.shuffle(seed=spec.seed).repeat()
    if tokens:
        ds = ds.tokenize(spec.tokenizer).pack(spec.seq_len)
    return tidal.DataLoader(ds.batch(spec.batch), num_workers=spec.workers)


def tokens_loader(spec: Spec) -> Any:
    return loader(spec, tokens=True)


PEERS = (
    Peer(
        "tidal-parquet", PARQUET, loader, tokens_loader, resumable=True,
        how="tidal.Dataset('s3://bench/parquet/*.parquet', storage=tidal.storage.Storage(options={endpoint_url, key, secret, region}, cache_dir=...))",
    ),
    Peer("tidal-jsonl", JSONL, loader, tokens_loader, resumable=True, how="the same with 's3://bench/jsonl/*.jsonl'"),
)  # fmt: skip


def warm_index(root: Path) -> dict[str, float]:
    """Open both of tidal's copies once in a child, so that no measurement builds tidal's index."""
    code = (
        "import json, sys, time, tidal\n"
        "out = {}\n"
        "for d in sys.argv[1:]:\n"
        "    t0 = time.perf_counter(); tidal.Dataset(d, columns=['id', 'text']); out[d] = time.perf_counter() - t0\n"
        "print(json.dumps(out))\n"
    )
    dirs = {fmt: str(root / fmt) for fmt in ("jsonl", "parquet")}
    proc = subprocess.run([sys.executable, "-c", code, *dirs.values()], capture_output=True, text=True)
    if proc.returncode != 0:
        log(f"tidal could not open the corpus: {proc.stderr.strip()[-500:]}")
        return {}
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    return {fmt: round(got[d], 2) for fmt, d in dirs.items()}
