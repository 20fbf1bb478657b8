"""The ``tidal`` command: ``tidal inspect PATH`` and ``tidal demo``."""

from __future__ import annotations

import argparse
import sys


def _inspect(args: argparse.Namespace) -> int:
    from tidal.dataset import Dataset

    ds = Dataset(args.path, format=args.format)
    total_bytes = sum(s.bytes for s in ds.shards)
    print(f"{len(ds.shards)} shards, {ds.num_records} records, {total_bytes / 1e6:.1f} MB")
    for s in ds.shards[: args.limit]:
        comp = f".{s.compression}" if s.compression else ""
        print(f"  {s.rows:>10}  {s.bytes / 1e6:>9.2f} MB  {s.format}{comp}  {s.path}")
    if len(ds.shards) > args.limit:
        print(f"  ... {len(ds.shards) - args.limit} more")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from tidal.demo import main

    return main(args.dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tidal", description="Stream training data larger than memory.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("inspect", help="list a dataset's shards and record counts")
    p.add_argument("path")
    p.add_argument("--format", default=None)
    p.add_argument("--limit", type=int, default=20)
    p.set_defaults(run=_inspect)
    p = sub.add_parser("demo", help="stream, interrupt and resume a corpus made on this machine")
    p.add_argument("--dir", default="demo-data")
    p.set_defaults(run=_demo)
    args = parser.parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
