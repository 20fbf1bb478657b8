"""The ``tidal`` command: ``inspect`` (a dataset, or a pipeline ``--config``), ``convert``, ``state show``, ``state skip`` and ``demo``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _inspect(args: argparse.Namespace) -> int:
    from tidal.dataset import Dataset

    if args.config is not None:
        return _inspect_config(args)
    if args.path is None:
        raise ValueError("give a PATH to inspect, or --config PIPELINE")
    ds = Dataset(args.path, format=args.format, errors=_note)
    total_bytes = sum(s.bytes for s in ds.shards)
    bad = [s for s in ds.shards if s.error is not None]
    unreadable = f", {len(bad)} unreadable (not counted)" if bad else ""
    print(f"{len(ds.shards)} shards, {ds.num_records} records, {total_bytes / 1e6:.1f} MB{unreadable}")
    for s in ds.shards[: args.limit]:
        comp = f".{s.compression}" if s.compression else ""
        rows = "unreadable" if s.error is not None else s.rows
        print(f"  {rows:>10}  {s.bytes / 1e6:>9.2f} MB  {s.format}{comp}  {s.path}")
    if len(ds.shards) > args.limit:
        print(f"  ... {len(ds.shards) - args.limit} more")
    for s in bad[: args.limit]:
        print(f"unreadable: {s.error}")
    if len(bad) > args.limit:
        print(f"unreadable: ... {len(bad) - args.limit} more")
    return 1 if bad else 0


def _note(error: Exception) -> None:
    """The errors policy of ``inspect``: a file that cannot be read is listed, not fatal."""


def _inspect_config(args: argparse.Namespace) -> int:
    """The pipeline a config resolves to, and what each of its sources holds."""
    from tidal.dataset import Dataset

    ds = Dataset.from_config(args.config)
    print(repr(ds))
    for key, plan in ds.sources().items():
        total_bytes = sum(s.bytes for s in plan.shards)
        name = f"stream {key[:-1]}" if key else "source"
        print(f"  {name}: {len(plan.shards)} shards, {plan.total} records, {total_bytes / 1e6:.1f} MB")
    print(f"fingerprint {ds.fingerprint()}")
    return 0


def _convert(args: argparse.Namespace) -> int:
    from tidal.convert.cli import run_cli

    return run_cli(args)


def _state_show(args: argparse.Namespace) -> int:
    import json

    from tidal.state import show

    print(show(json.loads(Path(args.state).read_text())))
    return 0


def _state_skip(args: argparse.Namespace) -> int:
    import json
    import os

    from tidal.state import skip

    new = skip(json.loads(Path(args.state).read_text()), args.batches)
    out = args.output or args.state.replace(".json", "") + f".skip{args.batches}.json"
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(new, f)
    os.replace(tmp, out)
    print(f"wrote {out}: continues {args.batches} batches per rank after {args.state}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from importlib.util import find_spec

    missing = [name for name in ("torch", "tokenizers", "transformers", "tqdm") if find_spec(name) is None]
    if missing:
        print(f"tidal demo: needs {', '.join(missing)}: pip install 'tidal[demo]'", file=sys.stderr)
        return 2
    from tidal.demo import main

    return main(args.dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tidal", description="Stream training data larger than memory.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("inspect", help="list a dataset's shards and record counts, or show a pipeline config")
    p.add_argument("path", nargs="?", default=None)
    p.add_argument("--format", default=None)
    p.add_argument("--config", default=None, help="a pipeline config (.yaml, .json, .toml): show what it resolves to")
    p.add_argument("--limit", type=int, default=20)
    p.set_defaults(run=_inspect)
    p = sub.add_parser(
        "convert", help="rewrite a dataset as Parquet or tidal token shards (restartable; processes or Ray)"
    )
    from tidal.convert.cli import add_arguments

    add_arguments(p)
    p.set_defaults(run=_convert)
    p = sub.add_parser("state", help="read or edit a saved DataLoader state")
    state_sub = p.add_subparsers(dest="action", required=True)
    q = state_sub.add_parser("show", help="epoch, position per stream, records and tokens consumed")
    q.add_argument("state")
    q.set_defaults(run=_state_show)
    q = state_sub.add_parser("skip", help="a new state that skips the next N batches (e.g. after a loss spike)")
    q.add_argument("state")
    q.add_argument("--batches", type=int, required=True, help="batches per rank to skip")
    q.add_argument("-o", "--output", default=None, help="where to write it (default: STATE.skipN.json)")
    q.set_defaults(run=_state_skip)
    p = sub.add_parser("demo", help="stream, interrupt and resume a corpus made on this machine")
    p.add_argument("--dir", default="demo-data")
    p.set_defaults(run=_demo)
    args = parser.parse_args(argv)
    from tidal.errors import TidalError

    try:
        return int(args.run(args))
    except (TidalError, OSError, ValueError) as exc:
        print(f"tidal {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
