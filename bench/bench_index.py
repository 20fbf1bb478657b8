"""The index at scale: a directory of many small shards, indexed once, then reopened.

Large corpora come as tens of thousands of files, and a job has thousands of readers, each of
which opens the dataset. For a directory of ``--files`` small JSONL shards this measures, each
in a fresh process (imports done before the clock starts): building the index the first time,
reopening the dataset once the index exists (what every rank does), the first record after
reopening, and the dataset as a spawned DataLoader worker receives it (its pickle's size and
the time to load it). Medians of ``--repeats``, with the load average.

    .venv/bin/python bench/bench_index.py                    # 100,000 shards
    .venv/bin/python bench/bench_index.py --files 1000000 --reopen-only   # a million (4 GB of disk; 3 min to write)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

CHILD = r"""
import json, pickle, sys, time
import tidal
root, what = sys.argv[1], sys.argv[2]
t = time.perf_counter()
ds = tidal.Dataset(root)
opened = time.perf_counter() - t
out = {"open_s": opened, "shards": len(ds.shards)}
if what == "reopen":
    t = time.perf_counter()
    next(iter(ds))
    out["first_record_s"] = time.perf_counter() - t
    t = time.perf_counter()
    data = pickle.dumps(ds)
    out["pickle_s"] = time.perf_counter() - t
    out["pickle_mb"] = len(data) / 1e6
    t = time.perf_counter()
    pickle.loads(data)
    out["unpickle_s"] = time.perf_counter() - t
print(json.dumps(out))
"""


def make(root: Path, files: int) -> None:
    marker = root / "DONE"
    if marker.exists() and marker.read_text() == str(files):
        return
    print(f"writing {files:,} shards under {root} ...", flush=True)
    root.mkdir(parents=True, exist_ok=True)
    per_dir = 10_000  # as corpora are laid out: a directory level, not a million names in one
    for i in range(files):
        d = root / f"d{i // per_dir:04d}"
        if i % per_dir == 0:
            d.mkdir(exist_ok=True)
        (d / f"part-{i:07d}.jsonl").write_text(f'{{"id": {2 * i}, "text": "a"}}\n{{"id": {2 * i + 1}, "text": "b"}}\n')
    marker.write_text(str(files))


def child(root: Path, what: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(root), what], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="bench-data/index")
    ap.add_argument("--files", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--reopen-only", action="store_true", help="build the index once (if missing), time only reopening")
    args = ap.parse_args()
    root = Path(args.data) / f"n{args.files}"
    make(root, args.files)
    index = root / ".tidal-index.json"
    load = os.getloadavg()[0]
    builds, reopens = [], []
    for _ in range(args.repeats):  # build and reopen alternate, so a busy spell touches both
        if not args.reopen_only or not index.exists():
            index.unlink(missing_ok=True)
            builds.append(child(root, "build"))
        reopens.append(child(root, "reopen"))
    size = index.stat().st_size / 1e6

    def med(rows: list[dict], key: str) -> str:
        values = [r[key] for r in rows]
        if not values:
            return "not run (--reopen-only, the index existed)"
        return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"

    print(f"{args.files:,} shards, index {size:.1f} MB; load average {load:.2f} -> {os.getloadavg()[0]:.2f}")
    print(f"  build the index, s:            {med(builds, 'open_s')}")
    print(f"  reopen (index exists), s:      {med(reopens, 'open_s')}")
    print(f"  first record after reopen, s:  {med(reopens, 'first_record_s')}")
    print(
        f"  pickle for a spawned worker:   {reopens[0]['pickle_mb']:.1f} MB, dumps {med(reopens, 'pickle_s')} s, loads {med(reopens, 'unpickle_s')} s"
    )


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"({time.time() - t0:.0f} s)")
