"""``tidal state show STATE``, ``tidal state skip STATE --batches N``, ``tidal state merge
STATE... -o OUT`` and ``tidal state verify STATE...``: read, edit, combine and check saved loader
states. Every error names the file it concerns and what is wrong with it."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from tidal.commands import add_pipeline, pipeline, read_state
from tidal.errors import StateError


def add(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "state",
        parents=parents,
        help="read or edit a saved DataLoader state",
        description="Read or edit a state saved by tidal.DataLoader.state_dict() (or tidal.jax.Loader) as JSON.",
    )
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    q = actions.add_parser(
        "show",
        parents=parents,
        help="epoch, position per stream, batches and tokens consumed",
        description="Print what a saved state says: the pass and topology it was saved on, batches and tokens "
        "consumed, and per source the epoch and the records used up.",
    )
    q.add_argument("state", metavar="STATE", help="a state saved as JSON (json.dump(loader.state_dict(), f))")
    q.set_defaults(run=show)
    q = actions.add_parser(
        "skip",
        parents=parents,
        help="a new state that skips the next N batches (e.g. after a loss spike)",
        description="Write a state that continues N batches (per rank) later than STATE, for stepping over the "
        "data behind a loss spike. Exact where every batch holds a known number of records (plain and continuous "
        "batches); refused otherwise, unless --approximate (see tidal.state.skip).",
    )
    q.add_argument("state", metavar="STATE", help="a state saved as JSON")
    q.add_argument("--batches", type=int, required=True, help="batches per rank to skip")
    q.add_argument(
        "--approximate",
        action="store_true",
        help="for packed, filtered or mixed batches: move on at the rate of records per batch read so far",
    )
    q.add_argument("-o", "--output", default=None, help="where to write the new state (default: STATE.skipN.json)")
    q.set_defaults(run=skip)
    q = actions.add_parser(
        "merge",
        parents=parents,
        help="one state for all ranks from the states each rank saved for itself (no torch.distributed)",
        description="Combine the states ranks saved each for itself (ranks from RANK/WORLD_SIZE, without "
        "torch.distributed, hold only their own part) into one loader state that restores on any topology "
        "(see tidal.state.merge). States gathered under torch.distributed are whole already: merging them checks "
        "that they agree.",
    )
    q.add_argument("states", metavar="STATE", nargs="+", help="the ranks' states, saved as JSON, in any order")
    q.add_argument("-o", "--output", required=True, help="where to write the merged state")
    q.set_defaults(run=merge)
    q = actions.add_parser(
        "verify",
        parents=parents,
        help="replay a run from its states: records read twice or never, per rank and epoch",
        description="Replay a run between its saved states (taken in step order), without training, and report "
        "per rank and epoch the records read twice or never (see tidal.verify). Exit status 1 when one is found.",
    )
    q.add_argument(
        "states",
        metavar="STATE",
        nargs="+",
        help="the run's states, saved as JSON (taken in step order, as a glob gives them or not)",
    )
    add_pipeline(q)
    q.add_argument(
        "--from-state",
        action="store_true",
        help="start the check at the first STATE (default: replay from the start of the run to it too)",
    )
    q.add_argument("--json", action="store_true", help="print the report as one JSON object")
    q.set_defaults(run=verify)


def _named(path: str, exc: StateError) -> StateError:
    return StateError(f"{path}: {exc}")


def show(args: argparse.Namespace) -> int:
    from tidal.state import show as describe

    state = read_state(args.state)
    try:
        print(describe(state))
    except StateError as exc:
        raise _named(args.state, exc) from None
    return 0


def skip(args: argparse.Namespace) -> int:
    from tidal.state import skip as skipped

    state = read_state(args.state)
    try:
        new = skipped(state, args.batches, approximate=args.approximate)
    except StateError as exc:
        raise _named(args.state, exc) from None
    stem = args.state[: -len(".json")] if args.state.endswith(".json") else args.state
    out = args.output or f"{stem}.skip{args.batches}.json"
    write(out, new)
    print(f"wrote {out}: continues {args.batches} batches per rank after {args.state}")
    return 0


def merge(args: argparse.Namespace) -> int:
    from tidal.state import merge as merged

    new = merged([read_state(path) for path in args.states], names=list(args.states))
    write(args.output, new)
    ranks, workers = new["topology"]
    print(f"wrote {args.output}: the state of {ranks} rank(s) x {workers} worker(s) from {len(args.states)} file(s)")
    return 0


def write(path: str, state: dict) -> None:
    """``state`` as JSON at ``path``, whole or not at all (written beside it, then renamed)."""
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(state, f)
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise StateError(f"{path}: the state cannot be written there: {exc.strerror or exc}") from None


def verify(args: argparse.Namespace) -> int:
    from tidal.verify import verify as check

    for path in args.states:
        read_state(path)  # a file that is not JSON: named as the other commands name it
    ds = pipeline(args.config)
    report = check(ds, args.states, from_start=not args.from_state)
    if args.json:
        print(json.dumps({"ok": report.ok, **vars(report)}))
    else:
        print("\n".join(report.lines()))
    return 0 if report.ok else 1
