"""Source trees side by side on one directory of text records: the first batch, records/s after it
and peak RSS over ``import torch, tidal``, with 0 and N DataLoader workers started by fork,
forkserver or spawn (shuffled, ``--batch`` 8, columns ``id`` and ``text``), each in a fresh
process, the trees interleaved repetition by repetition. Compares a git worktree of an older
commit with this one:

    PYTHONPATH=src python bench/bench_first.py --data /path/jsonl --trees before=/work/wt-base/src,after=src
    PYTHONPATH=src python bench/bench_first.py --data /path/jsonl --workers 2 8 --contexts fork forkserver spawn
    PYTHONPATH=src python bench/bench_first.py --data /path/jsonl --pause 2 --resume 0.1 0.9

Each measurement: ``import torch, tidal`` (timed: ``import``), the loader built (a resume: given the
state saved at that fraction of the epoch by an earlier process), ``--pause`` seconds of the
training script's own work (restoring its model), then ``next()``: ``first`` is the time from
building the loader to the first batch, ``next`` the time the loop waited inside that ``next()``
(what starting the workers when the loader is built hides). Prints a median (min-max) per
configuration and the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import os, resource, sys, time
t0 = time.perf_counter()
import torch, tidal
imported = time.perf_counter() - t0
data, workers, batches, size, context, pause, state = sys.argv[1:8]
workers, batches, size, pause = int(workers), int(batches), int(size), float(pause)
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6
base = rss()
ds = tidal.Dataset(data, columns=["id", "text"]).shuffle(seed=1)
kwargs = {"multiprocessing_context": context} if workers else {}
t0 = time.perf_counter()
loader = tidal.DataLoader(ds.batch(size), num_workers=workers, **kwargs)
if state != "-":
    import json
    loader.load_state_dict(json.load(open(state)))
time.sleep(pause)  # the training script restores its model
t1 = time.perf_counter()
it = iter(loader)
next(it)
t2 = time.perf_counter()
n = 0
for _ in it:
    n += 1
    if n >= batches:
        break
t3 = time.perf_counter()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3 - base
print(imported, t2 - t0 - pause, t2 - t1, n * size / (t3 - t2) if n else 0.0, peak)
sys.stdout.flush()
os._exit(0)
"""

SAVE = r"""
import itertools, json, sys
import tidal
data, size, fraction, out = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
ds = tidal.Dataset(data, columns=["id", "text"]).shuffle(seed=1).batch(size)
loader = tidal.DataLoader(ds, num_workers=2, start_early=False)
steps = int(fraction * ds.num_records / size)
for _ in itertools.islice(loader, steps):
    pass
json.dump(loader.state_dict(), open(out, "w"))
"""

COLUMNS = (
    ("import", "{:.3f}"),
    ("first", "{:.3f}"),
    ("next", "{:.4f}"),
    ("records/s", "{:,.0f}"),
    ("RSS MB", "{:.0f}"),
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="a directory of shards with columns id and text")
    ap.add_argument("--trees", default="tidal=src", help="name=src,... (default: this tree's src)")
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    ap.add_argument("--contexts", nargs="+", default=["fork"], help="start methods of the workers")
    ap.add_argument("--pause", type=float, default=0.0, help="seconds between building the loader and next()")
    ap.add_argument("--resume", type=float, nargs="*", default=[], help="also resume from these fractions")
    ap.add_argument("--batch", type=int, default=8, help="records a batch")
    ap.add_argument("--batches", type=int, default=15000, help="batches timed after the first")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    trees = dict(t.split("=", 1) for t in args.trees.split(","))
    scratch = tempfile.mkdtemp(prefix="bench-first-")
    states = {("-", name): "-" for name in trees}
    for fraction in args.resume:  # saved once per tree, by a process of its own
        for name, src in trees.items():
            path = os.path.join(scratch, f"{name}-{fraction}.json")
            cmd = [sys.executable, "-c", SAVE, args.data, str(args.batch), str(fraction), path]
            subprocess.run(cmd, env={**os.environ, "PYTHONPATH": src}, check=True, timeout=1800)
            states[(str(fraction), name)] = path
    starts = ["-", *map(str, args.resume)]
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    got: dict[tuple, list[list[float]]] = {}
    for _ in range(args.repeats):
        for start in starts:
            for workers in args.workers:
                for context in args.contexts if workers else ["-"]:
                    for name, src in trees.items():
                        env = {**os.environ, "PYTHONPATH": src}
                        state = states[(start, name)]
                        cmd = [sys.executable, "-c", CHILD, args.data, str(workers), str(args.batches)]
                        cmd += [str(args.batch), context, str(args.pause), state]
                        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
                        if out.returncode != 0:
                            raise SystemExit(f"child failed: {out.stderr[-2000:]}")
                        key = (name, start, workers, context)
                        got.setdefault(key, []).append([float(x) for x in out.stdout.split()])
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    print(f"pause {args.pause} s between the loader's build and next(); first: build to first batch, less the pause")
    print("tree       resume  workers  context     " + "".join(f"{c:26}" for c, _ in COLUMNS))
    for (name, start, workers, context), runs in got.items():
        cells = []
        for j, (_, fmt) in enumerate(COLUMNS):
            values = [r[j] for r in runs]
            median = statistics.median(values)
            cells.append(f"{fmt.format(median)} ({fmt.format(min(values))}-{fmt.format(max(values))})")
        print(f"{name:10} {start:6}  {workers:7}  {context:10}  " + "".join(f"{c:26}" for c in cells))
    print(json.dumps({"tree,resume,workers,context": {",".join(map(str, k)): v for k, v in got.items()}}))


if __name__ == "__main__":
    main()
