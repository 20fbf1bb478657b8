"""Source trees side by side on one directory of text records: the first batch from ``iter()``,
records/s after it and peak RSS over ``import torch, tidal``, with 0 and N DataLoader workers
(shuffled, ``--batch`` 8, columns ``id`` and ``text``), each in a fresh process, the trees interleaved
repetition by repetition. Compares a git worktree of an older commit with this one:

    PYTHONPATH=src python bench/bench_first.py --data /path/jsonl --trees before=/work/wt-base/src,after=src

Prints a median (min-max) per configuration and the load average before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

CHILD = r"""
import os, resource, sys, time
import torch, tidal
data, workers, batches, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6
base = rss()
ds = tidal.Dataset(data, columns=["id", "text"]).shuffle(seed=1)
t0 = time.perf_counter()
it = iter(tidal.DataLoader(ds.batch(size), num_workers=workers))
next(it)
t1 = time.perf_counter()
n = 0
for _ in it:
    n += 1
    if n >= batches:
        break
t2 = time.perf_counter()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3 - base
print(t1 - t0, n * size / (t2 - t1), peak)
sys.stdout.flush()
os._exit(0)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="a directory of shards with columns id and text")
    ap.add_argument("--trees", default="tidal=src", help="name=src,... (default: this tree's src)")
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    ap.add_argument("--batch", type=int, default=8, help="records a batch")
    ap.add_argument("--batches", type=int, default=15000, help="batches timed after the first")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    trees = dict(t.split("=", 1) for t in args.trees.split(","))
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    got: dict[tuple[str, int], list[list[float]]] = {}
    for _ in range(args.repeats):
        for workers in args.workers:
            for name, src in trees.items():
                env = {**os.environ, "PYTHONPATH": src}
                cmd = [sys.executable, "-c", CHILD, args.data, str(workers), str(args.batches), str(args.batch)]
                out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
                if out.returncode != 0:
                    raise SystemExit(f"child failed: {out.stderr[-2000:]}")
                got.setdefault((name, workers), []).append([float(x) for x in out.stdout.split()])
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    print("tree       workers  first batch, s          records/s                peak RSS over import, MB (1 process)")
    for (name, workers), runs in got.items():
        cells = []
        for j, fmt in ((0, "{:.3f}"), (1, "{:,.0f}"), (2, "{:.0f}")):
            values = [r[j] for r in runs]
            median = statistics.median(values)
            cells.append(f"{fmt.format(median)} ({fmt.format(min(values))}-{fmt.format(max(values))})")
        print(f"{name:10} {workers:7}  {cells[0]:22}  {cells[1]:23}  {cells[2] if workers == 0 else ''}")


if __name__ == "__main__":
    main()
