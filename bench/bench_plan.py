"""Scale on paper: ``tidal plan`` of 1,024 ranks x 8 workers over 100,000 shards, the cold
``tidal inspect`` that indexes them first, and the size of the loader state of 8,192 readers.

For a directory of ``--files`` JSONL shards of two records (``bench_index.py``'s corpus, in
directories of 10,000), each command runs in a fresh process, timed from outside: a cold
``tidal inspect`` (the index removed first: it scans every file) and ``tidal plan DIR --ranks
1024 --ranks-per-node 8 --workers 8 --shuffle 0`` (the index kept). Medians of ``--repeats``,
with the load average; one untimed run first, so that Python has compiled tidal's modules
(``PYTHONDONTWRITEBYTECODE`` is dropped for the children, as ``make`` does).

``--before SRC`` also times the tidal of another tree (``PYTHONPATH=SRC``, e.g. an export of an
older commit's ``src``), interleaved with this one, and checks that both print the same plan.

The state: ``DataLoader.state_dict()`` of 1,024 ranks x 8 workers after 1,001 batches per rank
of ``Dataset(corpus).shuffle(0).batch(8)`` over a sparse flat token file of 1 TiB (134 million
rows of 4,096 token ids, nothing written), made as ``tidal state skip`` makes one (exact for
plain batches, see ``tests/state/test_state_scale.py``), then again after an elastic restore onto
1,024 x 7 and 37 batches more: JSON bytes per reader, and the time to make each (with
``--before``, for both trees).

    .venv/bin/python bench/bench_plan.py
    .venv/bin/python bench/bench_plan.py --data /tmp/plan --before /tmp/tidal-fe2da05/src --repeats 3
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

from bench_index import make

PLAN = ["--ranks", "1024", "--ranks-per-node", "8", "--workers", "8", "--shuffle", "0"]

STATE = r"""
import json, sys, time
import tidal
from tidal.state import schema, skip

root = sys.argv[1]
ds = tidal.Dataset(root).shuffle(seed=0).batch(8)
fingerprint, sources, per_batch = ds.fingerprint(), schema.sources_of(ds.sources()), ds.records_per_batch()

def saved(ranks, workers, batches, origin):
    t = time.perf_counter()
    fresh = [schema.fresh_rank(workers) for _ in range(ranks)]
    state = skip(schema.make(fingerprint, sources, 0, 0, [ranks, workers], fresh, origin, per_batch), batches)
    return state, time.perf_counter() - t

first, first_s = saved(1024, 8, 1001, None)
restored = schema.restore(schema.check(first, fingerprint, sources), 0, 1024, 7)
after, after_s = saved(1024, 7, 37, restored.origin)
print(json.dumps({"records": ds.num_records, "bytes": len(json.dumps(first)), "made_s": first_s,
                  "restored_bytes": len(json.dumps(after)), "restored_made_s": after_s}))
"""


def env(src: str | None) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    if src is not None:
        out["PYTHONPATH"] = src
    return out


def tidal_cli(src: str | None, *args: str) -> tuple[float, str]:
    exe = Path(sys.executable).with_name("tidal")
    t = time.perf_counter()
    out = subprocess.run([str(exe), *args], capture_output=True, text=True, check=True, env=env(src))
    return time.perf_counter() - t, out.stdout


def med(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s ({min(values):.2f}-{max(values):.2f}, {len(values)} runs)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="bench-data/index")
    ap.add_argument("--files", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--before", metavar="SRC", help="also time the tidal in SRC (PYTHONPATH), interleaved")
    ap.add_argument("--skip-inspect", action="store_true", help="time tidal plan only (the index kept)")
    args = ap.parse_args()
    root = Path(args.data) / f"n{args.files}"
    make(root, args.files)
    index = root / ".tidal-index.json"
    trees = {"this tree": None} if args.before is None else {"before": args.before, "this tree": None}
    load = os.getloadavg()
    for src in trees.values():  # compile the modules, build the index
        tidal_cli(src, "inspect", str(root), "--samples", "0", "--limit", "0")
    inspect: dict[str, list[float]] = {name: [] for name in trees}
    plan: dict[str, list[float]] = {name: [] for name in trees}
    printed: dict[str, str] = {}
    for _ in range(args.repeats):
        for name, src in trees.items():
            if not args.skip_inspect:
                index.unlink(missing_ok=True)
                inspect[name].append(tidal_cli(src, "inspect", str(root), "--samples", "1", "--limit", "2")[0])
            seconds, printed[name] = tidal_cli(src, "plan", str(root), *PLAN)
            plan[name].append(seconds)
    print(f"{args.files:,} JSONL shards of 2 records in {root}; load average {load[0]:.2f} -> {os.getloadavg()[0]:.2f}")
    for name in trees:
        if not args.skip_inspect:
            print(f"  {name}: cold tidal inspect (scans every file): {med(inspect[name])}")
        print(f"  {name}: tidal plan {' '.join(PLAN)}: {med(plan[name])}")
    if len(printed) > 1:
        print(f"  the plans printed are {'the same' if len(set(printed.values())) == 1 else 'DIFFERENT'}")
    sparse = Path(args.data) / "sparse-1tib"
    sparse.mkdir(parents=True, exist_ok=True)
    with open(sparse / "train.bin", "ab") as f:
        f.truncate(1 << 40)
    for name, src in trees.items():
        out = subprocess.run(
            [sys.executable, "-c", STATE, str(sparse)], capture_output=True, text=True, check=True, env=env(src)
        )
        s = json.loads(out.stdout)
        print(f"{name}: loader state, Dataset(1 TiB of token ids, {s['records']:,} rows).shuffle(0).batch(8):")
        print(
            f"  1,024 ranks x 8 workers after 1,001 batches per rank: {s['bytes']:,} bytes of JSON, "
            f"{s['bytes'] / 8192:.0f} per reader (made in {s['made_s']:.2f} s)"
        )
        print(
            f"  restored onto 1,024 x 7, 37 batches later: {s['restored_bytes']:,} bytes, "
            f"{s['restored_bytes'] / 7168:.0f} per reader (made in {s['restored_made_s']:.2f} s)"
        )


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"({time.time() - t0:.0f} s)")
