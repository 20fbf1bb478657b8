"""``tidal trace [STATE] --config PIPELINE --steps N``: where every row of the next batches came from.

Prints one JSON line per batch of the rank asked for: its step (the batches the rank had
consumed in the pass before it), pass, worker and rows, each row a list of segments
``{"file", "row", "start", "end", "stream"}`` (see :mod:`tidal.provenance`). Without STATE, from
the start of the run (on ``--ranks`` ranks of ``--workers`` workers, default 1 and 1).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from tidal.commands import add_pipeline, pipeline, read_state


def add(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "trace",
        parents=parents,
        help="which file, row and token range every row of the batches after a saved state holds",
        description="Replay the batches a loader restored from STATE yields on one rank, without training, and "
        "print where every row came from: one JSON line per batch, {step, pass, rank, worker, rows}, each row a list "
        "of segments {file, row, start, end, stream} (start/end: the document's token range a packed row holds).",
    )
    p.add_argument(
        "state",
        metavar="STATE",
        nargs="?",
        default=None,
        help="a loader state saved as JSON (json.dump(loader.state_dict(), f)); left out: from the start of the run",
    )
    add_pipeline(p)
    p.add_argument("--steps", type=int, required=True, help="how many batches to trace")
    p.add_argument("--rank", type=int, default=0, help="the rank whose batches to trace (default 0)")
    p.add_argument("--skip", type=int, default=0, help="start this many batches after STATE (default 0)")
    p.add_argument(
        "--ranks",
        type=int,
        default=None,
        help="the world size STATE is restored on (default: the one it was saved on; without STATE, 1)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="DataLoader workers per rank STATE is restored on (default: as it was saved; without STATE, 1; "
        "0 counts as 1)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tidal.provenance import traced

    if args.state is not None:
        read_state(args.state)  # a file that is not a state's JSON: named before the pipeline is built
    ds = pipeline(args.config)
    steps = traced(
        ds, args.state, args.steps, args.rank, skip=args.skip, world_size=args.ranks, num_workers=args.workers
    )
    for step in steps:
        line = {
            "step": step.step,
            "pass": step.pass_,
            "rank": args.rank,
            "worker": step.worker,
            "rows": step.segments(),
        }
        print(json.dumps(line), flush=True)
    return 0
