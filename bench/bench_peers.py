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

This file is the driver: the flags, then prepare, run and report. Each peer and each part of the harness is a
module of ``peers/`` (its docstring maps them).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from peers import LOADERS
from peers.corpus import convert, prepare
from peers.harness import REPO, RESULT
from peers.plan import DEFAULT_WORKLOADS, WORKLOADS, run_all, subset
from peers.workloads import child


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


def main() -> None:
    args = parse_args()
    if args.child is not None:
        child(args.child)
        return
    if args.convert:
        fmt, src, out = args.convert
        print(RESULT + json.dumps(convert(fmt, src, out, args.shard_mb, args.row_group)), flush=True)
        return
    run(args)


def run(args: argparse.Namespace) -> None:
    """Prepare the corpus, run every measurement, and report. The report's modules are imported here: a child
    (``--child``) runs this file too, and its start-up is part of the first batch it times."""
    from peers.report import header, plot, tidal_commit, versions
    from peers.sections import sections
    from peers.tables import tally

    loaders = subset(args.loaders, LOADERS, "loader")
    workloads = set(subset(args.workloads, WORKLOADS, "workload"))
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
        try:
            plot(res, loaders, workloads, args.threads, args.plot)
            print(f"plot: {args.plot}")
        except ImportError as exc:  # matplotlib is not in the dev environment's lock
            print(
                f"no plot: {exc.name or exc} is not installed (pip install matplotlib); the JSON and tables are written"
            )


if __name__ == "__main__":
    main()
