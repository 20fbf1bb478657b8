#!/usr/bin/env python3
"""tidal next to its peers (LitData, Mosaic ``streaming``, WebDataset, HF ``datasets``) in one run, on one corpus.

The corpus comes from the shared generator (``gen_corpus.py``, the one PEERS.md was measured on) and is cached
under ``--data`` with every peer's native copy of it: Parquet (tidal and HF), LitData ``optimize`` chunks, Mosaic
MDS shards and WebDataset tar shards, each converted once, in its own process, its time kept in ``manifest.json``.
tidal reads the generator's JSONL as it is and the Parquet copy.

Workloads (``--workloads``), all shuffled, every measurement in a fresh Python process, every repetition running
every configuration once in a rotating order (interleaved), medians and ranges of ``--repeats``:

- ``text``: records/s after the first batch, 1 process batch 8, 2 workers batch 8 and batch 256;
- ``tokens``: tokenize + pack into (8, 2048) rows, tokens/s, 1 process and 2 workers, next to raw ``encode_batch``;
- ``first``: the first batch from process start (2 workers, batch 8), next to ``python -c "import torch, tidal"``;
- ``resume``: ``load_state_dict`` to the first batch after 10% and 90% of an epoch, and whether it is exact;
- ``rss``: peak RSS (and USS) of the whole process tree during the text runs with 0 and 2 workers;
- ``limits``: the page-cache read rate of every format's files, and raw ``encode_batch`` on 1 and 2 threads;
- ``s3``: records/s (1 process and 2 workers, batch 8) with every loader's copy uploaded to moto's
  S3 server on 127.0.0.1 and read from there, each run with a fresh, empty local cache; the server's log counts
  each run's GETs.

    .venv/bin/python bench/bench_peers.py                    # 0.6 GB corpus, 8 s per measurement, 3 repeats
    .venv/bin/python bench/bench_peers.py --quick            # ~0.03 GB, 2 s, 1 repeat: only checks that it runs
    .venv/bin/python bench/bench_peers.py --loaders tidal-parquet,litdata --workloads text,rss --json out.json
    .venv/bin/python bench/bench_peers.py --workloads s3  # every loader reading its copy from moto's S3 server
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import math
import os
import pickle
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from common import EOS, batch_ids, corpus_texts, load_json, log, read_jsonl, resume_points, sha1, train_tokenizer

REPO = Path(__file__).resolve().parent.parent
COLUMNS = ["id", "text"]
RESULT = "RESULT "  # prefix of the line a child prints its figures on
DATA_VERSION = 1
LOADERS = ("tidal-parquet", "tidal-jsonl", "litdata", "mosaic", "webdataset", "hf")
TIDAL = ("tidal-parquet", "tidal-jsonl")
RESUMABLE = ("tidal-parquet", "tidal-jsonl", "litdata", "mosaic")  # the ones with state_dict()
WORKLOADS = ("text", "tokens", "first", "resume", "rss", "limits", "s3")
DEFAULT_WORKLOADS = WORKLOADS  # s3 included: the server holds every copy in memory (3.6 GB for the 0.6 GB corpus)
# the copy of the corpus each loader reads (a sub-directory of the corpus directory), and its data files
FORMAT_OF = {
    "tidal-parquet": "parquet",
    "tidal-jsonl": "jsonl",
    "litdata": "litdata",
    "mosaic": "mds",
    "webdataset": "wds",
    "hf": "parquet",
}
DATA_FILES = {"jsonl": "*.jsonl", "parquet": "*.parquet", "litdata": "*.bin", "mds": "*.mds", "wds": "*.tar"}
TEXT_RUNS = ((0, 8), (2, 8), (2, 256))  # (workers, batch)
S3_RUNS = ((0, 8), (2, 8))  # (workers, batch) of the s3 workload
S3_BUCKET = "bench"
# what the children of the s3 workload find in their environment, and nothing else of AWS's: fake credentials
S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
FRACTIONS = (0.1, 0.9)
J = TypeVar("J")  # a job of a plan (this script's, or bench_shaped.py's)
RAW_METHODS = ("encode_batch", "encode_batch_fast")


# ----------------------------------------------------------------------------------------------------------------
# the corpus and each peer's copy of it


def corpus_dir(args: argparse.Namespace) -> Path:
    """One directory per corpus, so that ``--quick`` and the full run keep their caches side by side."""
    return Path(args.data) / f"{args.total_gb:g}gb-{args.shards}shards-seed{args.seed}"


def _files(root: Path | str, fmt: str) -> list[str]:
    return sorted(glob.glob(os.path.join(str(root), "**", DATA_FILES[fmt]), recursive=True))


def format_params(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """What each copy depends on besides the corpus: a change rebuilds that copy alone."""
    shard = {"shard_mb": args.shard_mb, "version": DATA_VERSION}
    return {
        "parquet": {"row_group": args.row_group, "compression": "snappy", "version": DATA_VERSION},
        "litdata": {**shard, "workers": 2},
        "mds": shard,
        "wds": shard,
    }


def prepare(args: argparse.Namespace, loaders: list[str], need_tokenizer: bool) -> dict[str, Any]:
    """Generate the corpus, convert it into every format and train the tokenizer, each once while its
    parameters hold; warm tidal's index of the JSONL and Parquet copies. Returns the manifest."""
    root = corpus_dir(args)
    script = Path(args.corpus_script)
    if not script.is_file():
        sys.exit(f"corpus generator not found: {script} (pass --corpus-script)")
    path = root / "manifest.json"
    manifest = load_json(path)
    corpus = {"generator_sha1": sha1(script), "total_gb": args.total_gb, "shards": args.shards, "seed": args.seed}
    if manifest.get("corpus") != corpus or not _files(root / "jsonl", "jsonl"):
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        manifest = {"corpus": corpus, **generate(script, root / "jsonl", args)}
        path.write_text(json.dumps(manifest, indent=1))
    needed = {FORMAT_OF[x] for x in loaders}
    for fmt, params in format_params(args).items():
        if fmt not in needed:
            continue
        done = manifest.setdefault("formats", {}).get(fmt, {})
        if done.get("params") != params or not _files(root / fmt, fmt):
            log(f"converting the corpus to {fmt} (once) ...")
            manifest["formats"][fmt] = {"params": params, **convert_in_child(fmt, root, args)}
            path.write_text(json.dumps(manifest, indent=1))
    if need_tokenizer:
        tok = root / f"tokenizer-{args.vocab}-{args.train_mb:g}mb.json"
        if manifest.get("tokenizer", {}).get("file") != tok.name or not tok.is_file():
            log(f"training a {args.vocab} byte-level BPE tokenizer on the first {args.train_mb:g} MB of text ...")
            t0 = time.perf_counter()
            train_tokenizer(_files(root / "jsonl", "jsonl"), tok, args.vocab, int(args.train_mb * 1e6))
            manifest["tokenizer"] = {"file": tok.name, "train_s": round(time.perf_counter() - t0, 1)}
            path.write_text(json.dumps(manifest, indent=1))
    index = warm_tidal_index(root)
    if "tidal_index_s" not in manifest:  # the first open after the corpus was made: tidal's one-off cost
        manifest["tidal_index_s"] = index
        path.write_text(json.dumps(manifest, indent=1))
    manifest["root"] = str(root)
    return manifest


def generate(script: Path, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The shared generator's JSONL shards, and what they hold."""
    log(f"generating the corpus into {out} ({args.total_gb:g} GB, {args.shards} shards, seed {args.seed}) ...")
    t0 = time.perf_counter()
    cmd = [sys.executable, str(script), str(out), "--total-gb", str(args.total_gb)]
    subprocess.run([*cmd, "--shards", str(args.shards), "--seed", str(args.seed)], check=True, stdout=sys.stderr)
    seconds = time.perf_counter() - t0
    records = nbytes = 0
    for f in _files(out, "jsonl"):
        data = Path(f).read_bytes()
        records += data.count(b"\n")
        nbytes += len(data)
    return {"generate_s": round(seconds, 1), "records": records, "jsonl_bytes": nbytes}


def convert_in_child(fmt: str, root: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Run one conversion in its own process: ``litdata.optimize`` sets the start method to spawn for good."""
    out = root / fmt
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--convert", fmt, str(root / "jsonl"), str(out)]
    cmd += ["--shard-mb", str(args.shard_mb), "--row-group", str(args.row_group)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT)]
    if proc.returncode != 0 or not lines:
        shutil.rmtree(out, ignore_errors=True)
        sys.exit(f"converting to {fmt} failed:\n{proc.stderr[-3000:]}")
    got = json.loads(lines[-1][len(RESULT) :])
    got["bytes"] = sum(os.path.getsize(f) for f in _files(out, fmt))
    got["files"] = len(_files(out, fmt))
    return dict(got)


def convert(fmt: str, src: str, out: str, shard_mb: float, row_group: int) -> dict[str, Any]:
    """Write one format from the JSONL shards; the seconds of the conversion alone (imports excluded)."""
    files = _files(src, "jsonl")
    limit = int(shard_mb * 1e6)
    if fmt == "parquet":
        import pyarrow.json as pj
        import pyarrow.parquet as pq

        t0 = time.perf_counter()
        os.makedirs(out)
        for f in files:
            table = pj.read_json(f, pj.ReadOptions(block_size=16 << 20)).select(COLUMNS)
            pq.write_table(table, os.path.join(out, Path(f).stem + ".parquet"), row_group_size=row_group)
        return {"seconds": time.perf_counter() - t0, "tool": f"pyarrow, {row_group:,} rows per row group"}
    if fmt == "litdata":
        import litdata

        t0 = time.perf_counter()
        litdata.optimize(
            fn=read_jsonl, inputs=files, output_dir=out, chunk_bytes=limit, num_workers=2, mode="overwrite"
        )
        return {"seconds": time.perf_counter() - t0, "tool": "litdata.optimize, 2 workers"}
    if fmt == "mds":
        writer_cls = mosaic().MDSWriter
        t0 = time.perf_counter()
        with writer_cls(out=out, columns={"id": "int64", "text": "str"}, size_limit=limit) as writer:
            for f in files:
                for rec in read_jsonl(f):
                    writer.write(rec)
        return {"seconds": time.perf_counter() - t0, "tool": "streaming.MDSWriter, 1 process"}
    if fmt == "wds":
        import webdataset as wds

        t0 = time.perf_counter()
        os.makedirs(out)
        with wds.ShardWriter(os.path.join(out, "shard-%05d.tar"), maxsize=limit, verbose=0) as writer:
            for f in files:
                for rec in read_jsonl(f):
                    writer.write({"__key__": f"{rec['id']:010d}", "txt": rec["text"], "id": str(rec["id"]).encode()})
        return {"seconds": time.perf_counter() - t0, "tool": "webdataset.ShardWriter, 1 process"}
    raise SystemExit(f"unknown format {fmt!r}")


def warm_tidal_index(root: Path) -> dict[str, float]:
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


# ----------------------------------------------------------------------------------------------------------------
# each loader, built the way its documentation shows


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


@dataclass
class Spec:
    """One measurement, run in a child process (``--child SPEC``)."""

    kind: str  # text | tokens | raw | import | cache | resume-save | resume-load
    loader: str = ""
    root: str = ""  # the directory of the loader's format (cache: the corpus directory)
    workers: int = 0
    batch: int = 8
    seconds: float = 0.0
    seed: int = 1
    tokenizer: str = ""
    seq_len: int = 2048
    threads: int = 0  # RAYON_NUM_THREADS in the child's environment; 0 leaves it unset
    raw_mb: float = 20.0
    method: str = "encode_batch"  # raw: which tokenizers method
    records: int = 0  # records of one epoch
    fractions: tuple[float, ...] = ()
    at: float = 0.0
    state_file: str = ""
    t_spawn: float = 0.0  # wall clock in the parent just before the child was started
    # the s3 workload: the URL of the loader's copy on the server (set: read from there, not from ``root``), the
    # server's endpoint, and a fresh, empty local directory for every cache the loader keeps
    url: str = ""
    endpoint: str = ""
    cache: str = ""


def s3_options(spec: Spec) -> dict[str, Any]:
    """s3fs-style ``storage_options`` that reach the server: its endpoint, and the (fake) credentials the parent put
    in this process's environment."""
    return {
        "key": os.environ["AWS_ACCESS_KEY_ID"],
        "secret": os.environ["AWS_SECRET_ACCESS_KEY"],
        "endpoint_url": spec.endpoint,
        "client_kwargs": {"region_name": os.environ["AWS_DEFAULT_REGION"]},
    }


def tidal_loader(spec: Spec, tokens: bool = False) -> Any:
    import tidal

    if spec.url:  # the objects as the store has them, through tidal's shard cache in ``spec.cache``
        from tidal.storage import Storage

        storage = Storage(options=s3_options(spec), cache_dir=os.path.join(spec.cache, "tidal"))
        src = f"{spec.url}/{DATA_FILES[FORMAT_OF[spec.loader]]}"
        ds = tidal.Dataset(src, columns=COLUMNS, storage=storage)
    else:
        ds = tidal.Dataset(spec.root, columns=COLUMNS)
    ds = ds.shuffle(seed=spec.seed).repeat()
    if tokens:
        ds = ds.tokenize(spec.tokenizer).pack(spec.seq_len)
    return tidal.DataLoader(ds.batch(spec.batch), num_workers=spec.workers)


def litdata_records(spec: Spec) -> Any:
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


def litdata_loader(spec: Spec) -> Any:
    from litdata import StreamingDataLoader

    return StreamingDataLoader(litdata_records(spec), batch_size=spec.batch, num_workers=spec.workers)


def mosaic_records(spec: Spec) -> Any:
    base = mosaic()
    with contextlib.suppress(Exception):  # shared memory a killed run left behind
        base.util.clean_stale_shared_memory()
    if spec.url:  # Mosaic's S3 client takes its endpoint from $S3_ENDPOINT_URL, which the parent set
        local = os.path.join(spec.cache, "mosaic")
        return base.StreamingDataset(
            remote=spec.url, local=local, shuffle=True, shuffle_seed=spec.seed, batch_size=spec.batch
        )
    return base.StreamingDataset(local=spec.root, shuffle=True, shuffle_seed=spec.seed, batch_size=spec.batch)


def mosaic_loader(spec: Spec) -> Any:
    return mosaic().StreamingDataLoader(mosaic_records(spec), batch_size=spec.batch, num_workers=spec.workers)


def wds_record(sample: dict[str, Any]) -> dict[str, Any]:
    """A decoded tar sample as the record the others yield."""
    return {"id": int(sample["id"]), "text": sample["txt"]}


def wds_s3_open(options: dict[str, Any], url: str, mode: str = "rb", bufsize: int = 8192, **kw: Any) -> Any:
    """WebDataset's opener of ``s3://`` URLs (its ``gopen`` has none): the object streamed through fsspec (s3fs)."""
    import fsspec

    return fsspec.open(url, mode, **options).open()


def wds_records(spec: Spec, batch: int = 0) -> Any:
    import webdataset as wds

    if spec.url:  # the shards listed on the server; an s3 opener in gopen's table of schemes (it has none)
        import functools
        import importlib

        import fsspec

        options = s3_options(spec)
        fs = fsspec.filesystem("s3", **options)
        urls = sorted(f"s3://{p}" for p in fs.glob(f"{spec.url[len('s3://') :]}/{DATA_FILES['wds']}"))
        gopen = importlib.import_module("webdataset.gopen")  # the module: ``wds.gopen`` is its function
        gopen.gopen_schemes["s3"] = functools.partial(wds_s3_open, options)
    else:
        urls = _files(spec.root, "wds")
    ds = wds.WebDataset(urls, shardshuffle=len(urls), detshuffle=True, seed=spec.seed, empty_check=False)
    ds = ds.shuffle(1000, seed=spec.seed).decode().map(wds_record)
    return ds.batched(batch) if batch else ds


def wds_loader(spec: Spec) -> Any:
    import webdataset as wds

    return wds.WebLoader(wds_records(spec, spec.batch), batch_size=None, num_workers=spec.workers)


def hf_records(spec: Spec) -> Any:
    from datasets import load_dataset

    if spec.url:  # a glob of the objects; storage_options go to fsspec (s3fs), the credentials from the environment
        files: Any = f"{spec.url}/{DATA_FILES['parquet']}"
        options = {"endpoint_url": spec.endpoint}
        ds = load_dataset("parquet", data_files=files, streaming=True, split="train", storage_options=options)
        return ds.shuffle(seed=spec.seed, buffer_size=1000)
    files = _files(spec.root, "parquet")
    ds = load_dataset("parquet", data_files=files, streaming=True, split="train")
    return ds.shuffle(seed=spec.seed, buffer_size=1000)


def hf_loader(spec: Spec) -> Any:
    from torch.utils.data import DataLoader

    return DataLoader(hf_records(spec), batch_size=spec.batch, num_workers=spec.workers)


TEXT_LOADERS: dict[str, Callable[[Spec], Any]] = {
    "tidal-parquet": tidal_loader,
    "tidal-jsonl": tidal_loader,
    "litdata": litdata_loader,
    "mosaic": mosaic_loader,
    "webdataset": wds_loader,
    "hf": hf_loader,
}
RECORD_STREAMS: dict[str, Callable[[Spec], Any]] = {
    "litdata": litdata_records,
    "mosaic": mosaic_records,
    "webdataset": wds_records,
    "hf": hf_records,
}


def forever(loader: Any, tidal_side: bool) -> Iterator[Any]:
    """Batches without end: tidal repeats by itself; a peer's loader is iterated again, epoch after epoch."""
    if tidal_side:
        yield from loader
        return
    while True:
        n = 0
        for batch in loader:
            n += 1
            yield batch
        if n == 0:
            raise RuntimeError("the loader yielded no batch in an epoch")


def packed_tokens(records: Any, tokenizer: str, seq_len: int, batch: int) -> Any:
    """The same tokenize + pack for every peer: documents taken 64 at a time from the peer's record stream,
    ``encode_batch`` + one EOS each, the token stream cut into full rows of ``seq_len``, ``batch`` rows at a
    time. An IterableDataset, so that it runs in the DataLoader workers next to the peer's own reading."""
    import numpy as np
    import torch
    from torch.utils.data import IterableDataset

    class Packed(IterableDataset):
        def __iter__(self) -> Iterator[torch.Tensor]:
            from tokenizers import Tokenizer

            tok = Tokenizer.from_file(tokenizer)
            eos = np.array([tok.token_to_id(EOS)], dtype=np.int64)
            need = seq_len * batch
            pending: list[np.ndarray] = []
            have = 0
            texts: list[str] = []
            for sample in forever(records, False):
                texts.append(sample["text"])
                if len(texts) < 64:
                    continue
                for enc in tok.encode_batch(texts, add_special_tokens=False):
                    pending += [np.asarray(enc.ids, dtype=np.int64), eos]
                    have += len(enc.ids) + 1
                texts = []
                while have >= need:
                    flat = np.concatenate(pending)
                    yield torch.from_numpy(flat[:need].reshape(batch, seq_len))
                    pending, have = [flat[need:]], len(flat) - need

    return Packed()


def tokens_loader(spec: Spec) -> Any:
    if spec.loader in TIDAL:
        return tidal_loader(spec, tokens=True)
    from torch.utils.data import DataLoader

    ds = packed_tokens(RECORD_STREAMS[spec.loader](spec), spec.tokenizer, spec.seq_len, spec.batch)
    return DataLoader(ds, batch_size=None, num_workers=spec.workers)


# ----------------------------------------------------------------------------------------------------------------
# the children


def _rows(batch: Any) -> int:
    ids = batch["input_ids"] if isinstance(batch, dict) else batch
    return int(ids.shape[0])


def _steady(
    it: Iterator[Any], seconds: float, count: Callable[[Any], int], marks: list[tuple[float, int]] | None = None
) -> tuple[int, float]:
    """Units counted over ``seconds`` of batches (the first one already taken), and the time it took.
    ``marks``: a list to append ``(wall clock, units so far)`` to every 0.1 s and at the end."""
    n = 0
    wall0, t0 = time.time(), time.perf_counter()
    now = last = t0
    while now - t0 < seconds:
        n += count(next(it))
        now = time.perf_counter()
        if marks is not None and now - last >= 0.1:
            marks.append((wall0 + now - t0, n))
            last = now
    if marks is not None:
        marks.append((wall0 + now - t0, n))
    return n, now - t0


def child_stream(spec: Spec) -> dict[str, Any]:
    """text or tokens: the first batch, then ``seconds`` of steady state."""
    t0 = time.perf_counter()
    tokens = spec.kind == "tokens"
    loader = tokens_loader(spec) if tokens else TEXT_LOADERS[spec.loader](spec)
    t1 = time.perf_counter()
    it = forever(loader, spec.loader in TIDAL)
    next(it)
    t2 = time.perf_counter()
    first_wall = time.time()
    marks = [(first_wall, 0)] if spec.url else None  # from S3: when each record came, for bench_shaped.py
    if tokens:
        n, elapsed = _steady(it, spec.seconds, lambda b: _rows(b) * spec.seq_len, marks)
    else:
        n, elapsed = _steady(it, spec.seconds, lambda b: len(b["id"]), marks)
    out: dict[str, Any] = {
        "units": n,
        "seconds": elapsed,
        "rate": n / elapsed if elapsed > 0 else math.nan,
        "setup_s": t1 - t0,
        "first_batch_from_iter_s": t2 - t1,
        "first_batch_from_start_s": first_wall - spec.t_spawn,
    }
    if marks is not None:
        out["timeline"] = marks
    return {**out, "_keep": it}


def child_raw(spec: Spec) -> dict[str, Any]:
    """Raw ``encode_batch`` (or ``encode_batch_fast``, no offsets: what tidal calls) on texts already in memory,
    256 at a time, for ``seconds``: the tokenizer's limit."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(spec.tokenizer)
    encode = getattr(tok, spec.method)
    texts = list(corpus_texts(_files(spec.root, "jsonl"), int(spec.raw_mb * 1e6)))
    tokens = docs = 0
    t0 = now = time.perf_counter()
    while now - t0 < spec.seconds:
        for i in range(0, len(texts), 256):
            chunk = texts[i : i + 256]
            tokens += sum(len(e.ids) for e in encode(chunk, add_special_tokens=False)) + len(chunk)
            docs += len(chunk)
            now = time.perf_counter()
            if now - t0 >= spec.seconds:
                break
    return {"units": tokens, "docs": docs, "seconds": now - t0, "rate": tokens / (now - t0)}


def child_cache(spec: Spec) -> dict[str, Any]:
    """Every format's data files read whole twice; the second pass, from the page cache, is timed."""
    buf = bytearray(8 << 20)
    out: dict[str, Any] = {}
    for fmt in DATA_FILES:
        files = _files(os.path.join(spec.root, fmt), fmt)
        if not files:
            continue
        for _ in range(2):
            nbytes = 0
            t0 = time.perf_counter()
            for f in files:
                with open(f, "rb", buffering=0) as fh:
                    while n := fh.readinto(buf):
                        nbytes += n
            seconds = time.perf_counter() - t0
        out[fmt] = {"bytes": nbytes, "seconds": seconds, "gb_per_s": nbytes / seconds / 1e9}
    return out


def child_resume_save(spec: Spec) -> dict[str, Any]:
    """Consume each fraction of an epoch, save the loader's ``state_dict()`` and the ids of the batch that follows."""
    loader = TEXT_LOADERS[spec.loader](spec)
    saved, it = resume_points(loader, spec.records, spec.batch, spec.fractions, batch_ids, pickle.dumps)
    Path(spec.state_file).write_bytes(pickle.dumps(saved))
    return {"points": {k: {**v, "state": None} for k, v in saved.items()}, "_keep": it}


def child_resume_load(spec: Spec) -> dict[str, Any]:
    """A new loader in a new process: ``load_state_dict``, then the first batch, timed and checked."""
    loader = TEXT_LOADERS[spec.loader](spec)
    point = pickle.loads(Path(spec.state_file).read_bytes())[str(spec.at)]
    t0 = time.perf_counter()
    loader.load_state_dict(point["state"])
    it = iter(loader)
    first = next(it)
    t1 = time.perf_counter()
    wall = time.time()
    return {
        "first_batch_after_load_s": t1 - t0,
        "first_batch_from_start_s": wall - spec.t_spawn,
        "exact": batch_ids(first) == point["expected_ids"],
        "consumed_records": point["consumed_records"],
        "state_bytes": point["state_bytes"],
        "_keep": it,
    }


CHILDREN: dict[str, Callable[[Spec], dict[str, Any]]] = {
    "text": child_stream,
    "tokens": child_stream,
    "raw": child_raw,
    "cache": child_cache,
    "resume-save": child_resume_save,
    "resume-load": child_resume_load,
}


def child(spec_json: str) -> None:
    """Run one measurement and print its figures. Then leave: a loader's workers that do not stop within 20 s
    (some peers' shutdown waits on threads) are not this measurement's business, so the process exits anyway."""
    raw = json.loads(spec_json)
    raw["fractions"] = tuple(raw.get("fractions", ()))
    spec = Spec(**raw)
    out = CHILDREN[spec.kind](spec)
    keep = out.pop("_keep", None)  # the iterator, alive until the figures are out: its workers stop after
    print(RESULT + json.dumps(out), flush=True)
    watchdog = threading.Timer(20.0, os._exit, args=(0,))
    watchdog.daemon = True
    watchdog.start()
    del keep


# ----------------------------------------------------------------------------------------------------------------
# running a child: its figures, and the memory of its process tree sampled from /proc


def tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (DataLoader workers, their helpers)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{p}/task"):
                with contextlib.suppress(OSError, ValueError), open(f"/proc/{p}/task/{tid}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
    return out


def tree_memory(pid: int) -> tuple[int, int]:
    """RSS and USS (private pages) of the process tree, summed over its processes, in bytes."""
    rss = uss = 0
    for p in tree(pid):
        with contextlib.suppress(OSError, ValueError), open(f"/proc/{p}/smaps_rollup") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name == "Rss":
                    rss += int(rest.split()[0]) * 1024
                elif name in ("Private_Clean", "Private_Dirty"):
                    uss += int(rest.split()[0]) * 1024
    return rss, uss


_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Failure|Timeout)\b")


def _last_line(text: str) -> str:
    """The line that says why a child failed: the last exception line of a traceback (``Type: message`` at the start
    of a line; what follows it may be a multi-line message or a library's debug dump), else the last line."""
    lines = [ln.rstrip() for ln in text.strip().splitlines() if ln.strip()]
    raised = [ln for ln in lines if _EXCEPTION.match(ln)]
    return (raised or lines or [""])[-1].strip()[:400]


def run_child(spec: Spec, timeout: float) -> dict[str, Any]:
    """One measurement in a fresh process group; its tree's memory sampled every 0.2 s. A failure or a hang is
    returned as ``{"error": ...}``: one cell of the report, never the end of the run."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    env.pop("RAYON_NUM_THREADS", None)
    if spec.threads:
        env["RAYON_NUM_THREADS"] = str(spec.threads)
    if spec.url:
        env = s3_env(spec, env)
    if spec.kind == "import":
        code = f"import torch, tidal, json, time; print({RESULT!r} + json.dumps({{'t': time.time()}}))"
        cmd = [sys.executable, "-c", code]
    else:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", ""]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        spec.t_spawn = time.time()
        if spec.kind != "import":
            cmd[-1] = json.dumps(asdict(spec))
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, text=True, start_new_session=True)
        peak_rss = peak_uss = 0
        timed_out = False
        while proc.poll() is None:
            rss, uss = tree_memory(proc.pid)
            peak_rss, peak_uss = max(peak_rss, rss), max(peak_uss, uss)
            if time.time() - spec.t_spawn > timeout:
                timed_out = True
                with contextlib.suppress(OSError):
                    os.killpg(proc.pid, 9)
                proc.wait()
                break
            time.sleep(0.2)
        with contextlib.suppress(OSError):  # workers the child left behind
            os.killpg(proc.pid, 9)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    lines = [ln for ln in stdout.splitlines() if ln.startswith(RESULT)]
    if not lines:
        why = f"timed out after {timeout:.0f} s" if timed_out else f"exit {proc.returncode}"
        last = _last_line(stderr)
        log(f"    failed ({why}): {stderr.strip()[-2000:]}")
        return {"error": f"failed: {last or why}" + (f" ({why})" if timed_out and last else "")}
    got = dict(json.loads(lines[-1][len(RESULT) :]))
    if spec.kind == "import":
        got = {"first_batch_from_start_s": got["t"] - spec.t_spawn}
    got["peak_rss_gb"], got["peak_uss_gb"] = peak_rss / 1e9, peak_uss / 1e9
    return got


# ----------------------------------------------------------------------------------------------------------------
# the s3 workload's server: moto on 127.0.0.1, the copies uploaded to it, its log of every request it served


def s3_env(spec: Spec, env: dict[str, str]) -> dict[str, str]:
    """``env`` for a child reading from the server: without this machine's AWS settings (its variables, config and
    credential files), with fake credentials, Mosaic's endpoint variable, and every cache directory a loader may
    fall back on inside the run's fresh ``spec.cache``."""
    out = {k: v for k, v in env.items() if not k.startswith("AWS_") and k != "S3_ENDPOINT_URL"}
    nowhere = os.path.join(spec.cache, "no-aws-config")
    out |= S3_ENV | {"AWS_CONFIG_FILE": nowhere, "AWS_SHARED_CREDENTIALS_FILE": nowhere}
    out["S3_ENDPOINT_URL"] = spec.endpoint  # read by Mosaic's S3 downloader alone
    for name, sub in (("TIDAL_CACHE_DIR", "tidal-home"), ("HF_HOME", "hf"), ("XDG_CACHE_HOME", "xdg")):
        out[name] = os.path.join(spec.cache, sub)
    return out


@contextlib.contextmanager
def s3_server(root: Path, loaders: list[str]) -> Iterator[dict[str, Any]]:
    """moto's S3 server (the tests' ``S3Server``) on a free port of 127.0.0.1, its request log (werkzeug's, one line
    per request) in a file, and each loader's copy uploaded to ``s3://bench/<format>/``: every file of it but
    dot-files (tidal's index of the local copy stays behind, so tidal indexes the objects as any store has them).
    Yields the endpoint, the URL of each format, the log's path and what was uploaded."""
    sys.path.insert(0, str(REPO / "tests"))  # the S3 server helper the tests use, as bench_s3.py does
    from s3_server import S3Server

    with tempfile.TemporaryDirectory(prefix="tidal-bench-s3-") as tmp:
        log_path = Path(tmp) / "moto.log"

        class LoggedS3Server(S3Server):
            def _spawn(self, args: list[str]) -> None:  # the server's stderr (its request log) to a file
                with open(log_path, "ab") as f:
                    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
                    self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=f, env=env)

        with LoggedS3Server() as s3:
            client = s3.client
            client.create_bucket(Bucket=S3_BUCKET)
            t0 = time.perf_counter()
            urls, uploaded = {}, {}
            for fmt in sorted({FORMAT_OF[x] for x in loaders}):
                local = root / fmt
                files = [p for p in sorted(local.rglob("*")) if p.is_file() and not p.name.startswith(".")]
                for path in files:
                    with open(path, "rb") as body:  # streamed from the file: S3Server.put would keep every byte
                        client.put_object(
                            Bucket=S3_BUCKET, Key=f"{fmt}/{path.relative_to(local).as_posix()}", Body=body
                        )
                urls[fmt] = f"s3://{S3_BUCKET}/{fmt}"
                uploaded[fmt] = {"objects": len(files), "bytes": sum(p.stat().st_size for p in files)}
            upload_s = time.perf_counter() - t0
            mb = sum(u["bytes"] for u in uploaded.values()) / 1e6
            log(f"moto S3 server at {s3.endpoint}: {mb:,.0f} MB uploaded in {upload_s:.1f} s")
            yield {
                "endpoint": s3.endpoint,
                "urls": urls,
                "log": str(log_path),
                "uploaded": uploaded,
                "upload_s": upload_s,
            }


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_REQUEST = re.compile(r'"([A-Z]+) (\S+) HTTP/[0-9.]+" (\d{3})')


def server_requests(log_path: str, start: int) -> dict[str, int]:
    """The requests the server logged from byte ``start`` of its log on (the measurements run one at a time, so
    these are one run's): GETs, all requests, and those answered with an error status."""
    with open(log_path, "rb") as f:
        f.seek(start)
        text = f.read().decode(errors="replace")
    methods: Counter[str] = Counter()
    errors = 0
    for line in _ANSI.sub("", text).splitlines():
        m = _REQUEST.search(line)
        if m and not m.group(2).startswith("/moto-api"):
            methods[m.group(1)] += 1
            errors += int(m.group(3)) >= 400
    return {"server_gets": methods["GET"], "server_requests": methods.total(), "server_errors": errors}


def run_s3_child(spec: Spec, timeout: float, server: dict[str, Any], base: Path) -> dict[str, Any]:
    """One s3 measurement with a fresh, empty cache directory, which is removed after it: the run's figures, the
    requests the server logged meanwhile and how much the loader had downloaded into its cache by the end."""
    base.mkdir(parents=True, exist_ok=True)
    cache = tempfile.mkdtemp(prefix="run-", dir=base)
    start = os.path.getsize(server["log"])
    try:
        got = run_child(replace(spec, cache=cache), timeout)
        requests = server_requests(server["log"], start)
        cached = sum(p.stat().st_size for p in Path(cache).rglob("*") if p.is_file() and not p.is_symlink())
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    if "error" in got:  # the run's cache directory, a long path that says nothing, shortened
        got["error"] = got["error"].replace(cache, "<cache>")
    else:  # the cold set-up counted too: every record (the first batch's included) over the whole run
        got["rate_from_start"] = (got["units"] + spec.batch) / (got["first_batch_from_start_s"] + got["seconds"])
    return {**got, **requests, "cache_mb": cached / 1e6}


# ----------------------------------------------------------------------------------------------------------------
# the plan: every measurement, named


@dataclass
class Job:
    name: str
    workload: str
    loader: str
    spec: Spec
    label: str = ""
    meta: dict[str, Any] = field(default_factory=dict)


def text_name(loader: str, workers: int, batch: int) -> str:
    return f"text {loader} w{workers} b{batch}"


def raw_name(method: str, threads: int) -> str:
    return f"raw {method} t{threads}"


def s3_name(loader: str, workers: int, batch: int) -> str:
    return f"s3 {loader} w{workers} b{batch}"


def plan(
    args: argparse.Namespace,
    manifest: dict[str, Any],
    loaders: list[str],
    workloads: set[str],
    server: dict[str, Any] | None = None,
) -> list[Job]:
    """The measurements each repetition runs once, in this order, rotated from one repetition to the next.
    ``server``: the s3 workload's server (:func:`s3_server`)."""
    root = Path(manifest["root"])
    tok = str(root / manifest["tokenizer"]["file"]) if "tokenizer" in manifest else ""
    jobs: list[Job] = []

    def spec(loader: str, kind: str, **kw: Any) -> Spec:
        return Spec(kind=kind, loader=loader, root=str(root / FORMAT_OF[loader]), seed=args.shuffle_seed, **kw)

    text_runs = set(TEXT_RUNS) if "text" in workloads else set()
    if "rss" in workloads:
        text_runs |= {(0, 8), (2, 8)}
    for loader in loaders:
        for w, b in sorted(text_runs):
            s = spec(loader, "text", workers=w, batch=b, seconds=args.seconds)
            jobs.append(Job(text_name(loader, w, b), "text", loader, s, meta={"workers": w, "batch": b}))
    if "tokens" in workloads:
        for loader in loaders:
            for w in (0, 2):
                threads = max(1, args.threads // max(1, w))
                s = spec(loader, "tokens", workers=w, batch=8, seconds=args.seconds, tokenizer=tok, threads=threads)
                jobs.append(Job(f"tokens {loader} w{w}", "tokens", loader, s, meta={"workers": w, "threads": threads}))
    if "tokens" in workloads or "limits" in workloads:
        for method in RAW_METHODS:
            for t in sorted({1, args.threads}):
                s = Spec(kind="raw", root=str(root / "jsonl"), seconds=args.seconds, tokenizer=tok, threads=t)
                s.raw_mb, s.method = args.raw_mb, method
                jobs.append(Job(raw_name(method, t), "raw", "", s, meta={"threads": t, "method": method}))
    if "first" in workloads:
        jobs.append(Job("first import", "first", "import", Spec(kind="import")))
        for loader in loaders:
            s = spec(loader, "text", workers=2, batch=8, seconds=0.0)
            jobs.append(Job(f"first {loader}", "first", loader, s))
    if "limits" in workloads:
        jobs.append(Job("cache", "limits", "", Spec(kind="cache", root=str(root))))
    if "s3" in workloads and server is not None:
        for loader in loaders:
            for w, b in S3_RUNS:
                url, endpoint = server["urls"][FORMAT_OF[loader]], server["endpoint"]
                s = spec(loader, "text", workers=w, batch=b, seconds=args.seconds, url=url, endpoint=endpoint)
                jobs.append(Job(s3_name(loader, w, b), "s3", loader, s, meta={"workers": w, "batch": b}))
    return jobs


def resume_jobs(args: argparse.Namespace, manifest: dict[str, Any], loaders: list[str]) -> dict[str, Spec]:
    """One state-saving run per loader with ``state_dict()``, before the repetitions."""
    root = Path(manifest["root"])
    out = {}
    for loader in loaders:
        if loader in RESUMABLE:
            out[loader] = Spec(
                kind="resume-save", loader=loader, root=str(root / FORMAT_OF[loader]), workers=2, batch=8,
                seed=args.shuffle_seed, records=manifest["records"], fractions=FRACTIONS,
                state_file=str(root / f"resume-{loader}.pickle"),
            )  # fmt: skip
    return out


def rotated(jobs: list[J], rep: int, repeats: int) -> list[J]:
    """Repetition ``rep`` starts ``rep / repeats`` of the way down the list, so that no configuration always
    runs first, or right after the same one, when the machine's load changes over the run."""
    k = (rep * len(jobs)) // max(1, repeats)
    return jobs[k:] + jobs[:k]


def run_all(args: argparse.Namespace, manifest: dict[str, Any], loaders: list[str], workloads: set[str]) -> dict:
    with contextlib.ExitStack() as stack:
        server = None
        if "s3" in workloads:
            log("s3: starting moto's S3 server on 127.0.0.1 and uploading every loader's copy ...")
            server = stack.enter_context(s3_server(Path(manifest["root"]), loaders))
        return _run_all(args, manifest, loaders, workloads, server)


def _run_all(
    args: argparse.Namespace,
    manifest: dict[str, Any],
    loaders: list[str],
    workloads: set[str],
    server: dict[str, Any] | None,
) -> dict:
    jobs = plan(args, manifest, loaders, workloads, server)
    caches = Path(manifest["root"]) / "s3-cache"  # the s3 runs' fresh cache directories, one at a time
    shutil.rmtree(caches, ignore_errors=True)
    saves: dict[str, Any] = {}
    if "resume" in workloads:
        for loader, s in resume_jobs(args, manifest, loaders).items():
            log(f"resume {loader}: consuming {' and '.join(f'{f:.0%}' for f in FRACTIONS)} of an epoch ...")
            saves[loader] = run_child(s, args.resume_timeout)
            if "error" in saves[loader]:
                continue
            for at in FRACTIONS:
                load = Spec(**{**asdict(s), "kind": "resume-load", "at": at, "fractions": ()})
                jobs.append(Job(f"resume {loader} {at}", "resume", loader, load, meta={"at": at}))
    runs: dict[str, list[dict[str, Any]]] = {j.name: [] for j in jobs}
    timeout = args.timeout + args.seconds
    for rep in range(args.repeats):
        order = rotated(jobs, rep, args.repeats)
        for i, job in enumerate(order):
            log(f"[{rep + 1}/{args.repeats} {i + 1}/{len(order)}] {job.name} ...")
            if job.workload == "s3" and server is not None:
                runs[job.name].append(run_s3_child(job.spec, timeout, server, caches))
            else:
                runs[job.name].append(run_child(job.spec, timeout))
    shutil.rmtree(caches, ignore_errors=True)
    out = {
        "jobs": {j.name: {"workload": j.workload, "loader": j.loader, **j.meta, "spec": asdict(j.spec)} for j in jobs},
        "runs": runs,
        "resume_save": saves,
    }
    if server is not None:
        out["s3"] = {k: v for k, v in server.items() if k != "log"}
    return out


# ----------------------------------------------------------------------------------------------------------------
# summaries, targets and tables


def _values(runs: list[dict[str, Any]], key: str) -> list[float]:
    return [float(r[key]) for r in runs if "error" not in r and isinstance(r.get(key), (int, float))]


def summary(runs: list[dict[str, Any]] | None, key: str) -> dict[str, Any]:
    """Median, min and max of one figure over the repetitions; the last error where none succeeded."""
    runs = runs or []
    vals = [v for v in _values(runs, key) if not math.isnan(v)]
    if not vals:
        errors = [r["error"] for r in runs if "error" in r]
        return {"error": errors[-1] if errors else "not run"}
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def _fmt(x: float, unit: str) -> str:
    if unit == "rate":  # three significant digits: 1.23M, 45.6k, 789
        for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k"), (1, "")):
            if abs(x) >= div or div == 1:
                v = x / div
                return f"{v:.{2 if abs(v) < 10 else 1 if abs(v) < 100 else 0}f}{suffix}"
    return f"{x:.2f}"


def cell(s: dict[str, Any], unit: str) -> str:
    """``median (min-max)``, or the error."""
    if "error" in s:
        return s["error"]
    if s["n"] == 1 or s["min"] == s["max"]:
        return _fmt(s["median"], unit)
    return f"{_fmt(s['median'], unit)} ({_fmt(s['min'], unit)}-{_fmt(s['max'], unit)})"


def med(s: dict[str, Any]) -> float | None:
    return s.get("median")


def best(values: dict[str, float | None], lower: bool) -> tuple[str, float] | None:
    """The best peer's figure: the highest rate, or the lowest time or memory."""
    ok = {k: v for k, v in values.items() if v is not None and k not in TIDAL}
    if not ok:
        return None
    k = (min if lower else max)(ok, key=lambda n: ok[n])
    return k, ok[k]


def ratio_rows(figures: list[dict[str, float | None]], lower: bool, loaders: list[str]) -> list[list[str]]:
    """Rows "tidal-X ÷ best peer", one per tidal loader, one cell per column of ``figures``."""
    rows = []
    for t in (x for x in TIDAL if x in loaders):
        cells = []
        for col in figures:
            b, mine = best(col, lower), col.get(t)
            cells.append(f"{mine / b[1]:.2f}x ({b[0]})" if b and mine is not None and b[1] else "-")
        rows.append([f"{t} ÷ best peer", *cells])
    return rows


@dataclass
class Target:
    workload: str
    what: str
    figure: str
    met: bool | None

    def verdict(self) -> str:
        return "-" if self.met is None else ("met" if self.met else "missed")

    def line(self) -> str:
        return f"{self.verdict():>6}  {self.what}: {self.figure}"


@dataclass
class Table:
    title: str
    headers: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)  # printed under the table, beside its ratios

    def __post_init__(self) -> None:
        self.rows = [r + [""] * (len(self.headers) - len(r)) for r in self.rows]

    def text(self) -> str:
        widths = [
            max(len(h), *(len(r[i]) for r in self.rows)) if self.rows else len(h) for i, h in enumerate(self.headers)
        ]

        def line(cells: list[str]) -> str:
            return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

        out = [f"\n== {self.title} ==", line(self.headers), "  ".join("-" * w for w in widths)]
        out += [line(r) for r in self.rows] + [f"   {n}" for n in self.notes]
        return "\n".join(out + (["   targets:"] + [f"   {t.line()}" for t in self.targets] if self.targets else []))

    def markdown(self) -> str:
        out = [f"### {self.title}", "", "| " + " | ".join(self.headers) + " |", "|" + "---|" * len(self.headers)]
        out += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in self.rows]
        out += ["", *self.notes] if self.notes else []
        return "\n".join(
            out + (["", "Targets:", ""] + [f"- {t.line().strip()}" for t in self.targets] if self.targets else [])
        )


def _check(workload: str, what: str, mine: float | None, bound: float | None, lower: bool, unit: str) -> Target:
    """``mine`` against ``bound``: at most (``lower``) or at least; unknown where either is missing."""
    if mine is None or bound is None:
        return Target(workload, what, "a figure it needs failed or was not measured", None)
    met = mine <= bound if lower else mine >= bound
    return Target(workload, what, f"{_fmt(mine, unit)} (needs {'<=' if lower else '>='} {_fmt(bound, unit)})", met)


def text_section(r: dict, loaders: list[str]) -> tuple[Table, list[Target]]:
    runs = r["runs"]
    cols = [c for c in TEXT_RUNS if any(text_name(x, *c) in runs for x in loaders)]
    stats = {(x, c): summary(runs.get(text_name(x, *c)), "rate") for x in loaders for c in cols}
    rows = [[x, *(cell(stats[(x, c)], "rate") for c in cols)] for x in loaders]
    figures = [{x: med(stats[(x, c)]) for x in loaders} for c in cols]
    rows += ratio_rows(figures, False, loaders)
    table = Table(
        "text records/s, shuffled, steady state after the first batch",
        ["loader", *(f"{w} workers, batch {b}" if w else f"1 process, batch {b}" for w, b in cols)],
        rows,
        ["median (min-max) over the repetitions; records counted as the length of each batch's id column."],
    )
    fig = {c: figures[i] for i, c in enumerate(cols)}
    targets = []
    for t in (x for x in TIDAL if x in loaders):
        one = fig.get((0, 8), {}).get(t)
        lit = fig.get((0, 8), {}).get("litdata")
        targets.append(_check("text", f"{t} 1 process >= 1.5x LitData", one, lit and 1.5 * lit, False, "rate"))
        for w, b in ((2, 8), (2, 256)):
            mine = fig.get((w, b), {}).get(t)
            targets.append(_check("text", f"{t} 2 workers batch {b} >= 1.3x its own 1 process", mine, one and 1.3 * one, False, "rate"))  # fmt: skip
            top = best(fig.get((w, b), {}), False)
            what = f"{t} 2 workers batch {b} >= 2x the best peer ({top[0] if top else '-'})"
            targets.append(_check("text", what, mine, top and 2 * top[1], False, "rate"))
    return table, targets


def tokens_section(r: dict, loaders: list[str], threads: int) -> tuple[Table, list[Target]]:
    runs = r["runs"]
    stats = {(x, w): summary(runs.get(f"tokens {x} w{w}"), "rate") for x in loaders for w in (0, 2)}
    rows = [[x, *(cell(stats[(x, w)], "rate") for w in (0, 2))] for x in loaders]
    figures = [{x: med(stats[(x, w)]) for x in loaders} for w in (0, 2)]
    rows += ratio_rows(figures, False, loaders)
    limit = med(summary(runs.get(raw_name("encode_batch", threads)), "rate"))
    for t in (x for x in TIDAL if x in loaders):
        rows.append(
            [f"{t} ÷ raw encode_batch, {threads} threads"]
            + [f"{f[t] / limit:.2f}x" if f.get(t) and limit else "-" for f in figures]
        )
    rows += [[label, value] for label, value in raw_rows(r, threads)]
    table = Table(
        "tokenize + pack into (8, 2048) rows, tokens/s, shuffled",
        ["loader", f"1 process ({threads} tokenizer threads)", f"2 workers (1 thread each, {threads} in all)"],
        rows,
        [
            "tidal: .tokenize(tokenizer).pack(2048).batch(8) through tidal.DataLoader; each peer: its record stream",
            "(its shuffle on) in one IterableDataset that runs encode_batch on 64 documents at a time, appends EOS,",
            "and cuts the stream into full 2048-token rows, 8 rows a batch, through a torch DataLoader (batch_size=None).",
            "tokens = rows x 2048. raw: 256 texts at a time already in memory, + one EOS per document. The targets",
            "divide by encode_batch, which the peers' wrapper calls; tidal calls encode_batch_fast (no offsets).",
            "RAYON_NUM_THREADS is set for every configuration, so every row uses the same threads.",
        ],
    )
    targets = []
    for t in (x for x in TIDAL if x in loaders):
        for i, w in enumerate((0, 2)):
            what = f"{t} {'1 process' if not w else '2 workers'} >= 0.9x raw encode_batch, {threads} threads"
            targets.append(_check("tokens", what, figures[i].get(t), limit and 0.9 * limit, False, "rate"))
    return table, targets


def first_section(r: dict, loaders: list[str]) -> tuple[Table, list[Target]]:
    runs = r["runs"]
    base = summary(runs.get("first import"), "first_batch_from_start_s")
    stats = {x: summary(runs.get(f"first {x}"), "first_batch_from_start_s") for x in loaders}
    inner = {x: summary(runs.get(f"first {x}"), "first_batch_from_iter_s") for x in loaders}
    rows = [[x, cell(stats[x], "s"), cell(inner[x], "s")] for x in loaders]
    rows.append(['python -c "import torch, tidal"', cell(base, "s"), ""])
    rows += ratio_rows([{x: med(stats[x]) for x in loaders}], True, loaders)
    table = Table(
        "first batch, 2 workers, shuffled, batch 8 (seconds; lower is better)",
        ["loader", "from process start", "from iter()"],
        rows,
        ["from process start: from just before the parent starts the child process (imports included)."],
    )
    targets = []
    b = med(base)
    peer = best({x: med(stats[x]) for x in loaders}, True)
    for t in (x for x in TIDAL if x in loaders):
        mine = med(stats[t])
        targets.append(_check("first", f"{t} <= import baseline + 0.3 s", mine, b and b + 0.3, True, "s"))
        what = f"{t} before every peer ({peer[0] if peer else '-'} first)"
        targets.append(_check("first", what, mine, peer and peer[1], True, "s"))
    return table, targets


def resume_section(r: dict, loaders: list[str]) -> tuple[Table, list[Target]]:
    runs, saves = r["runs"], r["resume_save"]
    rows, at_load = [], {}
    for x in (x for x in loaders if x in RESUMABLE):
        save = saves.get(x, {"error": "not run"})
        for at in FRACTIONS:
            got = runs.get(f"resume {x} {at}")
            point = save.get("points", {}).get(str(at), {})
            load = summary(got, "first_batch_after_load_s")
            start = summary(got, "first_batch_from_start_s")
            exact = [g["exact"] for g in got or [] if "error" not in g]
            verdict = ("yes" if all(exact) else "NO") if exact else "-"
            at_load[(x, at)] = med(load) if exact and all(exact) else None
            consumed = f"{point['consumed_records']:,}" if point else save.get("error", "-")
            state = f"{point['state_bytes']:,}" if point else "-"
            rows.append([x, f"{at:.0%}", consumed, cell(load, "s"), cell(start, "s"), verdict, state])
    for at in FRACTIONS:
        for label, ratio in ratio_rows([{x: at_load.get((x, at)) for x in loaders}], True, loaders):
            rows.append([label, f"{at:.0%}", "", ratio])
    table = Table(
        "resume: state_dict() saved after 10% / 90% of an epoch (2 workers, shuffled, batch 8), loaded in a new process",
        ["loader", "at", "records consumed", "load_state_dict -> 1st batch, s", "from process start, s", "exact", "state bytes"],
        rows,
        [
            "exact: the first batch after load_state_dict has the ids of the batch the saving loader yielded next.",
            "÷ best peer: load_state_dict -> 1st batch (lower is better); an inexact resume counts as none.",
        ],
    )  # fmt: skip
    targets = []
    for t in (x for x in TIDAL if x in loaders):
        for at in FRACTIONS:
            what = f"{t} at {at:.0%} no slower than LitData"
            targets.append(_check("resume", what, at_load.get((t, at)), at_load.get(("litdata", at)), True, "s"))
        lo, hi = at_load.get((t, FRACTIONS[0])), at_load.get((t, FRACTIONS[-1]))
        targets.append(_check("resume", f"{t} flat: 90% <= 1.25x 10%", hi, lo and 1.25 * lo, True, "s"))
    return table, targets


def rss_section(r: dict, loaders: list[str]) -> tuple[Table, list[Target]]:
    runs = r["runs"]
    cols = [(0, 8), (2, 8)]
    rss = {(x, c): summary(runs.get(text_name(x, *c)), "peak_rss_gb") for x in loaders for c in cols}
    uss = {(x, c): summary(runs.get(text_name(x, *c)), "peak_uss_gb") for x in loaders for c in cols}
    rows = [[x, *(cell(d[(x, c)], "gb") for c in cols for d in (rss, uss))] for x in loaders]
    figures = [{x: med(d[(x, c)]) for x in loaders} for c in cols for d in (rss, uss)]
    rows += ratio_rows(figures, True, loaders)
    table = Table(
        "peak memory of the whole process tree (main + workers), GB, during the text runs (lower is better)",
        ["loader", "RSS, 1 process", "USS, 1 process", "RSS, 2 workers", "USS, 2 workers"],
        rows,
        [
            "Sampled from /proc/PID/smaps_rollup every 0.2 s by the parent, summed over the tree, peak over the run.",
            "RSS counts pages shared between processes (forked workers) once per process; USS only private pages.",
        ],
    )
    targets = []
    for t in (x for x in TIDAL if x in loaders):
        for i, name in ((0, "1 process"), (2, "2 workers")):
            lean = best(figures[i], True)
            what = f"{t} peak RSS, {name} <= the leanest peer ({lean[0] if lean else '-'})"
            targets.append(_check("rss", what, figures[i].get(t), lean and lean[1], True, "gb"))
    return table, targets


S3_HOW = {
    "tidal-parquet": "tidal.Dataset('s3://bench/parquet/*.parquet', storage=tidal.storage.Storage(options={endpoint_url, key, secret, region}, cache_dir=...))",
    "tidal-jsonl": "the same with 's3://bench/jsonl/*.jsonl'",
    "litdata": "litdata.StreamingDataset('s3://bench/litdata', cache_dir=..., storage_options={'endpoint_url': ...})",
    "mosaic": "streaming.base.StreamingDataset(remote='s3://bench/mds', local=...), $S3_ENDPOINT_URL",
    "webdataset": "wds.WebDataset([s3://bench/wds/*.tar listed with s3fs]), gopen_schemes['s3'] = fsspec.open (s3fs)",
    "hf": "load_dataset('parquet', data_files='s3://bench/parquet/*.parquet', streaming=True, storage_options={'endpoint_url': ...})",
}


def s3_section(r: dict, loaders: list[str]) -> tuple[Table, list[Target]]:
    runs = r["runs"]
    cols = [c for c in S3_RUNS if any(s3_name(x, *c) in runs for x in loaders)]
    stats = {(x, c): summary(runs.get(s3_name(x, *c)), "rate") for x in loaders for c in cols}

    def median_of(x: str, c: tuple[int, int], key: str, ok: bool = True) -> float | None:
        """The median of ``key`` over the runs (those that yielded figures, where ``ok``), counted for failed ones too."""
        got = [
            {k: v for k, v in g.items() if k != "error"}
            for g in runs.get(s3_name(x, *c)) or []
            if not ok or "error" not in g
        ]
        return med(summary(got, key))

    # a loader read the server where the server logged GETs during its runs that yielded figures
    silent = {x for x in loaders if any(median_of(x, c, "server_gets") == 0 for c in cols)}
    rows = []
    for x in loaders:
        cells = ["failed" if "error" in stats[(x, c)] else cell(stats[(x, c)], "rate") for c in cols]
        first = summary(runs.get(s3_name(x, *cols[0])) if cols else None, "first_batch_from_start_s")
        whole = summary(runs.get(s3_name(x, *cols[0])) if cols else None, "rate_from_start")
        gets = [median_of(x, c, "server_gets", ok=False) for c in cols]
        get_cells = " / ".join("-" if g is None else f"{g:,.0f}" for g in gets)
        mb = [median_of(x, c, "cache_mb", ok=False) for c in cols]
        mb_cells = " / ".join("-" if m is None else f"{m:,.1f}" for m in mb)
        errors = {c: stats[(x, c)]["error"].removeprefix("failed: ") for c in cols if "error" in stats[(x, c)]}
        if len(errors) == len(cols) and len({re.sub(r"[0-9.]+", "#", e) for e in errors.values()}) == 1:
            why = next(iter(errors.values()))  # the same failure every time (timings aside): once
        else:
            why = "; ".join(f"{w} workers: {e}" if w else f"1 process: {e}" for (w, _), e in errors.items())
        if x in silent:
            why = "no GET reached the server: left out of the ratios" + (f"; {why}" if why else "")
        start = [
            cell(first, "s") if "error" not in first else "-",
            cell(whole, "rate") if "error" not in whole else "-",
        ]
        rows.append([x, *cells, *start, get_cells, mb_cells, why])
    figures = [{x: None if x in silent else med(stats[(x, c)]) for x in loaders} for c in cols]
    rows += ratio_rows(figures, False, loaders)
    labels = [f"{w} workers, batch {b}" if w else f"1 process, batch {b}" for w, b in cols]
    up = r.get("s3", {})
    uploaded = ", ".join(
        f"{fmt} {u['objects']} objects, {u['bytes'] / 1e6:,.0f} MB" for fmt, u in up.get("uploaded", {}).items()
    )
    v = r.get("versions", {})
    table = Table(
        "from S3: every loader's copy on moto's S3 server (127.0.0.1), text records/s, shuffled, cold cache",
        [
            "loader",
            *labels,
            "1st batch from start, s (1 process)",
            "records/s from start (1 process)",
            "server GETs per run",
            "local cache, MB",
            "why it failed",
        ],
        rows,
        [
            f"moto {v.get('moto', '?')} server at {up.get('endpoint', '-')}, in its own process on this machine (its CPU "
            f"time is taken from the loaders'); the copies uploaded at the start ({up.get('upload_s', 0):.1f} s): "
            f"{uploaded or '-'}.",
            "Every run a fresh process with a fresh, empty local cache directory (removed after it), fake credentials in",
            "its environment only; records/s after the first batch, as in the text table. 1st batch from start: the cold",
            "set-up included (imports, listing, indexes, the first downloads); records/s from start: every record of the",
            "run over the time from process start, which counts what a loader downloads before its first batch (tidal",
            "fetches a line file whole to index it) as much as what it downloads after. server GETs per run: the GET",
            "requests the server logged during the run (medians, failed runs too; 1 process / 2 workers); local cache: what",
            "the loader had written to its cache directory by the end. A loader with no GET counted is left out of the",
            "ratios and targets.",
            *(f"{x}: {S3_HOW[x]}" for x in loaders),
            "LitData's obstore client is allowed plain http (its default client options refuse it; real S3 is https).",
        ],
    )
    targets = []
    for t in (x for x in TIDAL if x in loaders):
        for i, label in enumerate(labels):
            top = best(figures[i], False)
            what = (
                f"from S3 (moto on loopback): {t}, {label}, at least 1.2x the peers that read the same server "
                f"(best: {top[0] if top else '-'})"
            )
            targets.append(_check("s3", what, figures[i].get(t), top and 1.2 * top[1], False, "rate"))
    return table, targets


def raw_rows(r: dict, threads: int) -> list[tuple[str, str]]:
    """The raw tokenizer's figures: each method on 1 thread and on ``threads``."""
    return [
        (f"raw {m}, {t} thread{'s' if t > 1 else ''}", cell(summary(r["runs"].get(raw_name(m, t)), "rate"), "rate"))
        for m in RAW_METHODS
        for t in sorted({1, threads})
    ]


def limits_section(r: dict, threads: int) -> Table:
    runs = r["runs"].get("cache", [])
    rows = []
    for fmt in DATA_FILES:
        s = summary([g.get(fmt, g) for g in runs], "gb_per_s")
        sizes = [g[fmt]["bytes"] for g in runs if fmt in g]
        rows.append([f"page cache, {fmt} files", cell(s, "gb") + " GB/s", f"{sizes[0] / 1e6:,.0f} MB" if sizes else ""])
    rows += [[label, value + " tokens/s"] for label, value in raw_rows(r, threads)]
    return Table(
        "physical limits",
        ["what", "rate", "size"],
        rows,
        ["page cache: every data file of the format read whole twice in one process; the second pass is timed."],
    )


# ----------------------------------------------------------------------------------------------------------------
# the report, the JSON, the Markdown and the plot


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    pkgs = ("tidal", "mosaicml-streaming", "litdata", "datasets", "webdataset", "tokenizers", "torch", "pyarrow")
    for pkg in (*pkgs, "moto", "s3fs", "obstore", "boto3"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def tidal_commit() -> str:
    def git(*a: str) -> str:
        with contextlib.suppress(OSError):
            return subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True).stdout.strip()
        return ""

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    return commit + (" dirty (src/ has uncommitted changes)" if git("status", "--porcelain", "src") else "")


def conversions(manifest: dict[str, Any]) -> str:
    f = manifest.get("formats", {})

    def one(fmt: str) -> str:
        got = f.get(fmt)
        return (
            f"{got['seconds']:.1f} s ({got['tool']}; {got['bytes'] / 1e6:,.0f} MB in {got['files']} files)"
            if got
            else "-"
        )

    idx = manifest.get("tidal_index_s", {})
    return "\n".join(
        [
            "conversion of the corpus, once (s):",
            f"  tidal-jsonl: none needed (tidal's index, built on the first open: {idx.get('jsonl', '-')} s)",
            f"  tidal-parquet and hf, Parquet: {one('parquet')}",
            f"  litdata: {one('litdata')}",
            f"  mosaic, MDS: {one('mds')}",
            f"  webdataset, tar: {one('wds')}",
        ]
    )


def header(res: dict[str, Any], manifest: dict[str, Any], args: argparse.Namespace) -> str:
    v = res["versions"]
    load0, load1 = res["loadavg_start"], res["loadavg_end"]
    return "\n".join(
        [
            f"tidal {v['tidal']} at {res['commit']}; peers: mosaicml-streaming {v['mosaicml-streaming']}, "
            f"litdata {v['litdata']}, datasets {v['datasets']}, webdataset {v['webdataset']}; tokenizers "
            f"{v['tokenizers']}, torch {v['torch']}, pyarrow {v['pyarrow']}",
            f"machine: {res['cpus']} CPUs ({res['usable_cpus']} usable); load average {load0[0]:.2f} {load0[1]:.2f} "
            f"{load0[2]:.2f} at the start, {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f} at the end; whole run "
            f"{res['total_s']:.0f} s",
            f"corpus: gen_corpus.py --total-gb {args.total_gb:g} --shards {args.shards} --seed {args.seed}: "
            f"{manifest['records']:,} records, {manifest['jsonl_bytes'] / 1e6:,.0f} MB of JSONL ({manifest['root']})",
            f"each measurement a fresh process; {args.repeats} interleaved repetition(s), {args.seconds:g} s of steady "
            f"state each; shuffle seed {args.shuffle_seed}",
            conversions(manifest),
        ]
    )


def sections(
    res: dict[str, Any], loaders: list[str], workloads: set[str], threads: int
) -> tuple[list[Table], list[Target]]:
    tables, targets = [], []
    builders = [
        ("text", lambda: text_section(res, loaders)),
        ("tokens", lambda: tokens_section(res, loaders, threads)),
        ("first", lambda: first_section(res, loaders)),
        ("resume", lambda: resume_section(res, loaders)),
        ("rss", lambda: rss_section(res, loaders)),
        ("s3", lambda: s3_section(res, loaders)),
    ]
    for name, build in builders:
        if name in workloads:
            table, got = build()
            table.targets = got
            tables.append(table)
            targets += got
    if "limits" in workloads:
        tables.append(limits_section(res, threads))
    return tables, targets


def tally(targets: list[Target]) -> str:
    """One line: how many targets were met, missed, or could not be judged."""
    n = {v: sum(t.verdict() == v for t in targets) for v in ("met", "missed", "-")}
    return f"targets: {n['met']} met, {n['missed']} missed, {n['-']} not judged (a figure they need failed or was not measured)"


def plot(res: dict[str, Any], loaders: list[str], workloads: set[str], threads: int, path: str) -> None:
    """One panel per workload, bars per loader; a log scale where the bars differ by more than 20x."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = res["runs"]

    def m(name: str, key: str) -> float:
        return med(summary(runs.get(name), key)) or 0.0

    panels: list[tuple[str, list[str], dict[str, list[float]]]] = []
    if "text" in workloads:
        series = {f"{w}w b{b}": [m(text_name(x, w, b), "rate") for x in loaders] for w, b in TEXT_RUNS}
        panels.append(("text records/s", loaders, series))
    if "tokens" in workloads:
        series = {f"{w}w": [m(f"tokens {x} w{w}", "rate") for x in loaders] for w in (0, 2)}
        names = [*loaders, f"raw {threads}t"]
        for s in series.values():
            s.append(m(raw_name("encode_batch", threads), "rate"))
        panels.append(("tokenize + pack tokens/s", names, series))
    if "first" in workloads:
        series = {"s": [m(f"first {x}", "first_batch_from_start_s") for x in loaders]}
        series["s"].append(m("first import", "first_batch_from_start_s"))
        panels.append(("first batch from process start, s", [*loaders, "import"], series))
    if "resume" in workloads:
        rl = [x for x in loaders if x in RESUMABLE]
        series = {f"{at:.0%}": [m(f"resume {x} {at}", "first_batch_after_load_s") for x in rl] for at in FRACTIONS}
        panels.append(("resume: load_state_dict -> 1st batch, s", rl, series))
    if "rss" in workloads:
        series = {f"{w}w": [m(text_name(x, w, 8), "peak_rss_gb") for x in loaders] for w in (0, 2)}
        panels.append(("peak RSS of the process tree, GB", loaders, series))
    if "s3" in workloads:
        series = {f"{w}w b{b}": [m(s3_name(x, w, b), "rate") for x in loaders] for w, b in S3_RUNS}
        panels.append(("from S3 (moto, loopback), cold cache, records/s", loaders, series))
    if "limits" in workloads:
        got = res["runs"].get("cache", [])
        fmts = list(DATA_FILES)
        series = {"GB/s": [med(summary([g.get(f, {}) for g in got], "gb_per_s")) or 0.0 for f in fmts]}
        panels.append(("page cache read, GB/s", fmts, series))
    if not panels:
        return
    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 4.2 * rows), squeeze=False)
    for ax, (title, names, series) in zip(axes.flat, panels, strict=False):
        width = 0.8 / len(series)
        for i, (label, vals) in enumerate(series.items()):
            ax.bar([j + i * width for j in range(len(names))], vals, width, label=label)
        ax.set_xticks([j + width * (len(series) - 1) / 2 for j in range(len(names))], names, rotation=30, ha="right")
        ax.set_title(title, fontsize=10)
        positive = [v for vals in series.values() for v in vals if v > 0]
        if positive and max(positive) / min(positive) > 20:
            ax.set_yscale("log")
        if len(series) > 1:
            ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.suptitle(f"tidal {res['commit']} next to its peers ({res['cpus']} CPUs)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# ----------------------------------------------------------------------------------------------------------------
# the run


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--data", default=str(REPO / "bench-data" / "peers"), help="cache of the corpus and its copies")
    ap.add_argument("--corpus-script", default=str(REPO.parent / "shared" / "bench" / "gen_corpus.py"))
    ap.add_argument("--total-gb", type=float, default=None, help="corpus size in GB of JSONL (default 0.6)")
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1234, help="corpus seed (default 1234, as in PEERS.md)")
    ap.add_argument("--shuffle-seed", type=int, default=1)
    ap.add_argument("--row-group", type=int, default=10_000, help="Parquet rows per row group (default 10,000)")
    ap.add_argument("--shard-mb", type=float, default=None, help="LitData chunk, MDS and tar shard size (default 32)")
    ap.add_argument("--vocab", type=int, default=32_000)
    ap.add_argument("--train-mb", type=float, default=50.0, help="MB of text the tokenizer is trained on")
    ap.add_argument("--raw-mb", type=float, default=20.0, help="MB of text in memory for raw encode_batch")
    ap.add_argument("--threads", type=int, default=2, help="tokenizer threads of every tokens configuration")
    ap.add_argument("--seconds", type=float, default=None, help="steady state per measurement (default 8)")
    ap.add_argument("--repeats", type=int, default=None, help="interleaved repetitions (default 3)")
    ap.add_argument("--loaders", default=",".join(LOADERS), help=f"subset of {','.join(LOADERS)}")
    ap.add_argument(
        "--workloads",
        default=",".join(DEFAULT_WORKLOADS),
        help=f"subset of {','.join(WORKLOADS)} (default: all of them)",
    )
    ap.add_argument(
        "--timeout", type=float, default=120.0, help="seconds before a measurement is abandoned (+ --seconds)"
    )
    ap.add_argument("--resume-timeout", type=float, default=900.0, help="the same for each resume state-saving run")
    ap.add_argument("--quick", action="store_true", help="~0.03 GB corpus, 2 s, 1 repeat: checks that everything runs")
    ap.add_argument("--json", default=None, help="also write every figure to this file")
    ap.add_argument("--markdown", default=None, help="also write the tables as Markdown to this file")
    ap.add_argument("--plot", default=None, help="also draw the figures into this PNG")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--convert", nargs=3, metavar=("FORMAT", "SRC", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    quick = args.quick
    defaults = {"total_gb": 0.03 if quick else 0.6, "shard_mb": 2.0 if quick else 32.0}
    defaults |= {"seconds": 2.0 if quick else 8.0, "repeats": 1 if quick else 3}
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if quick:
        args.train_mb, args.raw_mb = min(args.train_mb, 10.0), min(args.raw_mb, 5.0)
    return args


def _subset(text: str, known: tuple[str, ...], what: str) -> list[str]:
    got = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in got if x not in known]
    if bad:
        sys.exit(f"unknown {what} {bad[0]!r}; known: {', '.join(known)}")
    return [x for x in known if x in got]


def main() -> None:
    args = parse_args()
    if args.child is not None:
        child(args.child)
        return
    if args.convert:
        fmt, src, out = args.convert
        print(RESULT + json.dumps(convert(fmt, src, out, args.shard_mb, args.row_group)), flush=True)
        return
    loaders = _subset(args.loaders, LOADERS, "loader")
    workloads = set(_subset(args.workloads, WORKLOADS, "workload"))
    t0 = time.perf_counter()
    load0 = os.getloadavg()
    manifest = prepare(args, loaders, need_tokenizer=bool(workloads & {"tokens", "limits"}))
    res: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "commit": tidal_commit(),
        "versions": versions(),
        "cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)),
        "loadavg_start": load0,
        "args": {k: v for k, v in vars(args).items() if k not in ("child", "convert")},
        "manifest": manifest,
        **run_all(args, manifest, loaders, workloads),
    }
    res["loadavg_end"] = os.getloadavg()
    res["total_s"] = time.perf_counter() - t0
    tables, targets = sections(res, loaders, workloads, args.threads)
    res["targets"] = [asdict(t) for t in targets]
    top = header(res, manifest, args)
    print(top + "\n" + "\n".join(t.text() for t in tables) + "\n\n" + tally(targets))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1, default=str))
        print(f"\nall figures: {args.json}")
    if args.markdown:
        body = "\n\n".join(t.markdown() for t in tables)
        Path(args.markdown).write_text(f"```\n{top}\n```\n\n{body}\n\n{tally(targets)}\n")
        print(f"tables: {args.markdown}")
    if args.plot:
        plot(res, loaders, workloads, args.threads, args.plot)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
