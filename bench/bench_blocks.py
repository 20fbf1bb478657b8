#!/usr/bin/env python3
"""What a shuffle block costs: peak memory on large documents, and the first batch with many workers.

- **Memory in document size.** The shared generator's documents (``gen_corpus.py``, seed 1234) are
  joined 32 at a time into "books" of ~100 KB, 16 JSONL files. One process reads them shuffled,
  batch 8, for ``--records`` records; its peak RSS is compared with ``shuffle(block_bytes=...)`` at
  its default (128 MiB) and with the bound off (``block_bytes=1 << 50``: the 16,384-record blocks
  of before).
- **First batch with many workers.** The same generator's documents as Parquet (10,000 rows per
  row group), shuffled, batch 8, through ``tidal.DataLoader`` with 2, 4 and 8 workers (fork,
  spawn, forkserver): seconds from process start to the first batch, workers warming up in turn
  (the default) and all at once (``TIDAL_WARMUP_WORKERS=64``).

Every measurement is a fresh process; configurations are interleaved, repetition by repetition,
and medians printed with the load average.

    .venv/bin/python bench/bench_blocks.py                  # 3 repeats
    .venv/bin/python bench/bench_blocks.py --repeats 1      # a quick look
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

MEMORY = r"""
import json, resource, sys
import tidal
root, bound, records = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ds = tidal.Dataset(root).shuffle(seed=0, block_bytes=bound).batch(8)
n = 0
for batch in ds:
    n += len(batch["id"])
    if n >= records:
        break
print(json.dumps({"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

FIRST = r"""
import json, os, sys, time
def main():
    t0 = float(sys.argv[1])
    import torch, tidal
    root, workers, context = sys.argv[2], int(sys.argv[3]), sys.argv[4]
    loader = tidal.DataLoader(tidal.Dataset(root).shuffle(seed=0).batch(8), num_workers=workers,
                              multiprocessing_context=context)
    it = iter(loader)
    next(it)
    print(json.dumps({"first_batch_s": time.time() - t0}), flush=True)
    it.close()
if __name__ == "__main__":
    main()
"""


def prepare(root: Path, script: Path) -> None:
    if (root / "done").exists():
        return
    import pyarrow as pa
    import pyarrow.parquet as pq

    subprocess.run(
        [sys.executable, str(script), str(root / "jsonl"), "--total-gb", "0.6", "--seed", "1234"], check=True
    )
    (root / "parquet").mkdir(exist_ok=True)
    (root / "books").mkdir(exist_ok=True)
    docs = []
    for i, path in enumerate(sorted(glob.glob(str(root / "jsonl" / "*.jsonl")))):
        with open(path) as f:
            recs = [json.loads(line) for line in f]
        pq.write_table(pa.Table.from_pylist(recs), root / "parquet" / f"part-{i}.parquet", row_group_size=10_000)
        docs += [r["text"] for r in recs]
    books = [" ".join(docs[i : i + 32]) for i in range(0, len(docs), 32)]
    step = len(books) // 16 + 1
    for k in range(16):
        with open(root / "books" / f"part-{k:02d}.jsonl", "w") as f:
            for j, text in enumerate(books[k * step : (k + 1) * step]):
                f.write(json.dumps({"id": k * step + j, "text": text}) + "\n")
    (root / "done").write_text("ok")


def run(code: str, *args: str, env: dict | None = None) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
    )
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(REPO / "bench-data" / "blocks"))
    ap.add_argument("--corpus-script", default=str(REPO.parent / "shared" / "bench" / "gen_corpus.py"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--records", type=int, default=2000, help="books read per memory measurement")
    args = ap.parse_args()
    root = Path(args.data)
    prepare(root, Path(args.corpus_script))
    books = sorted(glob.glob(str(root / "books" / "*.jsonl")))
    mean = sum(os.path.getsize(f) for f in books) / sum(Path(f).read_bytes().count(b"\n") for f in books)
    memory = {"block_bytes default (128 MiB)": 128 << 20, "bound off (16,384 records)": 1 << 50}
    first = [(w, "fork", gate) for w in (2, 4, 8) for gate in (True, False) if gate or w > 2]
    first += [
        (2, "spawn", True),
        (8, "spawn", True),
        (8, "spawn", False),
        (2, "forkserver", True),
        (8, "forkserver", True),
        (8, "forkserver", False),
    ]
    mem_runs: dict[str, list[float]] = {k: [] for k in memory}
    first_runs: dict[tuple, list[float]] = {k: [] for k in first}
    load0 = os.getloadavg()[0]
    for _ in range(args.repeats):
        for name, bound in memory.items():
            mem_runs[name].append(run(MEMORY, str(root / "books"), str(bound), str(args.records))["peak_rss_mb"])
        for w, c, gate in first:
            env = {} if gate else {"TIDAL_WARMUP_WORKERS": "64"}
            got = run(FIRST, repr(time.time()), str(root / "parquet"), str(w), c, env=env)
            first_runs[(w, c, gate)].append(got["first_batch_s"])
    load1 = os.getloadavg()[0]
    print(f"medians of {args.repeats}; load average {load0:.2f} -> {load1:.2f}")
    print(f"peak RSS, one process, shuffled books of {mean / 1e3:.0f} KB on average, {args.records} read:")
    for name, values in mem_runs.items():
        print(f"  {name:<34}{statistics.median(values):>8.0f} MB   {values}")
    print("first batch from process start, Parquet, shuffled, batch 8 (s):")
    for (w, c, gate), values in first_runs.items():
        name = f"{w} workers, {c}, {'in turn' if gate else 'all at once'}"
        print(f"  {name:<34}{statistics.median(values):>8.2f}     {[round(v, 2) for v in values]}")


if __name__ == "__main__":
    main()
