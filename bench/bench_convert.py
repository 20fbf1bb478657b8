#!/usr/bin/env python3
"""Conversion throughput: ``tidal convert`` (local, 1 and 2 workers, and Ray) next to LitData's ``optimize``
and Mosaic's ``MDSWriter``, on the same JSON lines corpus.

The corpus comes from the shared generator (``gen_corpus.py``, the one PEERS.md was measured on: Zipf words,
log-normal document lengths around 3 KB) and is cached under ``--data``. Every tool converts the same
``.jsonl`` files, records ``{"id", "text"}``, into its own format:

- ``tidal-1``, ``tidal-2``: ``tidal.convert.convert(src, dst, to="parquet", workers=n)`` (Parquet, zstd, hashed);
- ``tidal-ray``: the same on a local Ray of 2 CPUs, timed after ``ray.init`` (its start is printed apart);
- ``litdata-1``, ``litdata-2``: ``litdata.optimize`` with a function that parses each file's lines;
- ``mds``: Mosaic ``MDSWriter`` in one process (it has no parallel writer), columns ``int64`` and ``str``.

Every tool writes files of about ``--shard-size`` (default 32 MB: tidal's ``shard_size``, LitData's
``chunk_bytes``, MDS's ``size_limit``); neither peer compresses by default, tidal's Parquet is zstd.

Each measurement runs in a fresh Python process and times the conversion alone (imports and interpreter
start excluded). The configurations run interleaved, rep by rep, ``--repeats`` times (default 3); figures are
medians, in MB/s of input JSON lines (1 MB = 1e6 bytes), with ratios against ``tidal-1``.

    .venv/bin/python bench/bench_convert.py                  # 0.5 GB corpus, 3 interleaved repeats
    .venv/bin/python bench/bench_convert.py --quick          # a tiny corpus: checks that everything runs
    .venv/bin/python bench/bench_convert.py --only tidal-1,mds --repeats 5

Absolute figures drift between runs on shared machines: compare the ratios of one run, on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import read_jsonl

REPO = Path(__file__).resolve().parent.parent
CONFIGS = ("tidal-1", "tidal-2", "tidal-ray", "litdata-1", "litdata-2", "mds")


def prepare(args: argparse.Namespace) -> Path:
    """The generator's JSONL corpus under ``--data``, made once per set of parameters."""
    script = Path(args.corpus_script)
    if not script.is_file():
        sys.exit(f"corpus generator not found: {script} (pass --corpus-script)")
    params = {"total_gb": args.total_gb, "shards": args.shards, "seed": args.seed}
    root = Path(args.data) / f"jsonl-{args.total_gb}gb-{args.shards}-{args.seed}"
    manifest = root / "manifest.json"
    if manifest.is_file() and json.loads(manifest.read_text()) == params:
        return root
    shutil.rmtree(root, ignore_errors=True)
    print(f"generating the corpus into {root} ...", file=sys.stderr, flush=True)
    subprocess.run(
        [
            sys.executable,
            str(script),
            str(root),
            "--total-gb",
            str(args.total_gb),
            "--shards",
            str(args.shards),
            "--seed",
            str(args.seed),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    manifest.write_text(json.dumps(params))
    return root


# -- one measurement, in its own process -------------------------------------------------------------------


def measure(config: str, src: Path, out: Path, shard_size: str) -> dict[str, float]:
    """Convert ``src`` into ``out`` with ``config``, output files of ``shard_size``; seconds of the conversion alone."""
    files = sorted(str(p) for p in src.glob("*.jsonl"))
    extra: dict[str, float] = {}
    if config.startswith("tidal"):
        import importlib.util

        from tidal.convert import convert

        if importlib.util.find_spec("pandas") is not None:
            import pandas  # noqa: F401 - pyarrow imports it on the first list of Python values: an import, not conversion

        if config == "tidal-ray":
            import ray

            t0 = time.perf_counter()
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
            extra["ray_start_s"] = time.perf_counter() - t0
        workers = 2 if config != "tidal-1" else 1
        t0 = time.perf_counter()
        engine = "ray" if config == "tidal-ray" else "local"
        convert(files, out, to="parquet", workers=workers, engine=engine, shard_size=shard_size, progress=False)
        seconds = time.perf_counter() - t0
        if config == "tidal-ray":
            ray.shutdown()
    elif config.startswith("litdata"):
        import litdata

        t0 = time.perf_counter()
        litdata.optimize(
            fn=read_jsonl,
            inputs=files,
            output_dir=str(out),
            chunk_bytes=shard_size,
            num_workers=int(config[-1]),
            mode="overwrite",
        )
        seconds = time.perf_counter() - t0
    elif config == "mds":
        sys.path.insert(0, str(REPO / "tests"))
        from conftest import mds_writer

        writer_cls = mds_writer()
        t0 = time.perf_counter()
        with writer_cls(out=str(out), columns={"id": "int64", "text": "str"}, size_limit=shard_size.lower()) as writer:
            for path in files:
                for rec in read_jsonl(path):
                    writer.write(rec)
        seconds = time.perf_counter() - t0
    else:
        raise SystemExit(f"unknown configuration {config!r}; known: {', '.join(CONFIGS)}")
    out_bytes = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    return {"seconds": seconds, "out_bytes": out_bytes, **extra}


def run_one(config: str, src: Path, scratch: Path, shard_size: str) -> dict[str, float]:
    """``measure`` in a fresh process; its output directory removed afterwards."""
    out = scratch / config
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--measure", config, str(src), str(out), shard_size],
        env=env,
        capture_output=True,
        text=True,
    )
    shutil.rmtree(out, ignore_errors=True)
    if proc.returncode != 0:
        raise SystemExit(f"{config} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(REPO / "bench-data" / "convert"), help="where the corpus is cached")
    ap.add_argument("--corpus-script", default=str(REPO.parent / "shared" / "bench" / "gen_corpus.py"))
    ap.add_argument("--total-gb", type=float, default=0.5)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--repeats", type=int, default=3, help="interleaved runs of every configuration (medians)")
    ap.add_argument("--only", default=",".join(CONFIGS), help=f"comma-separated configurations ({', '.join(CONFIGS)})")
    ap.add_argument("--quick", action="store_true", help="a tiny corpus (about 1 MB): only checks that everything runs")
    ap.add_argument("--json", default=None, help="also write every figure to this file")
    ap.add_argument(
        "--shard-size", default="32MB", help="output files of about this size, for every tool (default 32MB)"
    )
    ap.add_argument("--measure", nargs=4, metavar=("CONFIG", "SRC", "OUT", "SIZE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        config, src, out, size = args.measure
        print(json.dumps(measure(config, Path(src), Path(out), size)))
        return
    if args.quick:
        args.total_gb, args.shards = 0.001, 2  # about 1 MB
        args.shard_size = "1MB"
    configs = [c.strip() for c in args.only.split(",") if c.strip()]
    src = prepare(args)
    in_bytes = sum(p.stat().st_size for p in src.glob("*.jsonl"))
    scratch = Path(args.data) / "out"
    scratch.mkdir(parents=True, exist_ok=True)
    print(
        f"corpus: {src} ({in_bytes / 1e6:.1f} MB of JSON lines); {args.repeats} interleaved runs; {os.cpu_count()} CPUs"
    )
    runs: dict[str, list[dict[str, float]]] = {c: [] for c in configs}
    for rep in range(args.repeats):
        for config in configs:
            got = run_one(config, src, scratch, args.shard_size)
            runs[config].append(got)
            print(
                f"  run {rep + 1} {config:<10} {got['seconds']:7.2f} s  {in_bytes / 1e6 / got['seconds']:7.1f} MB/s",
                flush=True,
            )
    shutil.rmtree(scratch, ignore_errors=True)
    medians = {c: statistics.median(r["seconds"] for r in runs[c]) for c in configs}
    base = medians.get("tidal-1")
    print(f"\n{'configuration':<12} {'median s':>9} {'MB/s':>8} {'output MB':>10} {'speed vs tidal-1':>17}")
    for c in configs:
        rate = in_bytes / 1e6 / medians[c]
        ratio = f"{base / medians[c]:.2f}x" if base else "-"
        out_mb = statistics.median(r["out_bytes"] for r in runs[c]) / 1e6
        print(f"{c:<12} {medians[c]:>9.2f} {rate:>8.1f} {out_mb:>10.1f} {ratio:>17}")
    if "tidal-ray" in runs:
        print(
            f"(Ray's own start, not counted above: {statistics.median(r['ray_start_s'] for r in runs['tidal-ray']):.1f} s)"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"input_bytes": in_bytes, "runs": runs, "median_s": medians}, indent=1))


if __name__ == "__main__":
    main()
