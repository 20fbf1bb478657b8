"""Resume: ``load_state_dict`` to the first batch in a new process, at points of an epoch.

For each data directory, a state is saved after each fraction of an epoch (2 workers, shuffled,
batch 8, by default); then each (tree, directory, fraction) is loaded in a fresh process, the
configurations interleaved repetition by repetition, and the first batch checked against the
one the saving run got next. ``--trees`` compares source trees (``name=path/to/src``), e.g.
a worktree of an older commit against this one:

    PYTHONPATH=src python bench/bench_resume.py --data /path/parquet /path/jsonl \\
        --trees before=/work/wt-base/src,after=src

Prints a median (min-max) per configuration and the load average before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import os, pickle, sys, time
import torch, tidal
mode, data, state, frac, workers, batch, columns = sys.argv[1:8]
ds = tidal.Dataset(data, columns=columns.split(",") if columns else None).shuffle(seed=1)
loader = tidal.DataLoader(ds.batch(int(batch)), num_workers=int(workers))
if mode == "save":
    it = iter(loader)
    for _ in range(int(ds.num_records * float(frac)) // int(batch)):
        next(it)
    saved = loader.state_dict()
    pickle.dump((saved, next(it)["id"].tolist()), open(state, "wb"))
else:
    saved, expected = pickle.load(open(state, "rb"))
    t0 = time.perf_counter()
    loader.load_state_dict(saved)
    first = next(iter(loader))
    print(time.perf_counter() - t0, first["id"].tolist() == expected)
sys.stdout.flush()
os._exit(0)
"""


def run(src: str, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": src}
    out = subprocess.run([sys.executable, "-c", CHILD, *args], env=env, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"child failed: {out.stderr[-2000:]}")
    return out.stdout.strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", nargs="+", required=True, help="directories of shards with an integer 'id' column")
    ap.add_argument("--trees", default="tidal=src", help="name=src,... (default: this tree's src)")
    ap.add_argument("--fractions", default="0.1,0.9")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--columns", default="id,text")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    trees = dict(t.split("=", 1) for t in args.trees.split(","))
    fractions = args.fractions.split(",")
    common = [str(args.workers), str(args.batch), args.columns]
    with tempfile.TemporaryDirectory() as tmp:
        states = {}
        first_src = next(iter(trees.values()))
        for data in args.data:
            for frac in fractions:
                states[data, frac] = str(Path(tmp) / f"{len(states)}.pkl")
                run(first_src, "save", data, states[data, frac], frac, *common)
        print(f"load average before: {os.getloadavg()[0]:.2f}")
        times: dict[tuple[str, str, str], list[float]] = {}
        for _ in range(args.repeats):
            for data in args.data:
                for frac in fractions:
                    for name, src in trees.items():
                        seconds, exact = run(src, "load", data, states[data, frac], frac, *common).split()
                        if exact != "True":
                            raise SystemExit(f"{name} {data} at {frac}: the first batch after the resume differs")
                        times.setdefault((name, data, frac), []).append(float(seconds))
        print(f"load average after: {os.getloadavg()[0]:.2f}")
        for (name, data, frac), values in times.items():
            print(
                f"{name:10s} {Path(data).name:12s} at {frac}: {statistics.median(values):.3f} s "
                f"({min(values):.3f}-{max(values):.3f})"
            )


if __name__ == "__main__":
    main()
