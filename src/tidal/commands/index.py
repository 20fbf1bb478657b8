"""``tidal index URL``: count a remote dataset once and publish its index beside it (or ``--to``
elsewhere), so that every job over it opens it with one request per rank (:mod:`tidal.sources.indexing`)."""

from __future__ import annotations

import argparse
from typing import Any

from tidal.commands import add_progress, progress_on, size, storage_options
from tidal.errors import ArgumentError
from tidal.progress import Bar


def add(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "index",
        parents=parents,
        help="count a remote dataset once and publish its index: every job then starts from one request per rank",
        description="List a remote dataset (a directory or glob URL), count the records of every file once "
        "(Parquet from its footer, other files from a copy in the shard cache) and publish .tidal-index.json "
        "beside the data, or at --to. Jobs over the dataset then take their listing from it: no LIST and no "
        "HEAD per object. Run it again after the data changes. A run cut off goes on where it stopped.",
    )
    p.add_argument("url", metavar="URL", help="the dataset: a directory or glob URL (s3://, gs://, az://, ...)")
    p.add_argument("--to", default=None, metavar="URL", help="publish the index here (where the data is read-only)")
    p.add_argument("--format", default=None, help="the files' format, where their endings do not tell (e.g. jsonl)")
    p.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an fsspec storage option, repeatable (as for tidal inspect)",
    )
    p.add_argument("--cache-dir", default=None, help="the shard cache, where counted files and progress are kept")
    p.add_argument(
        "--workers",
        type=int,
        default=0,
        metavar="N",
        help="processes (or Ray tasks) counting at once (0: threads; --engine ray: at least 1)",
    )
    p.add_argument("--engine", choices=("processes", "ray"), default="processes", help="where workers run")
    p.add_argument(
        "--ray-address", default=None, help="with --engine ray, a Ray cluster's address (default: a local Ray)"
    )
    add_progress(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tidal.sources.indexing import index, published_at

    if args.workers < 0:
        raise ArgumentError("--workers cannot be negative")
    bar = Bar(None, "index", "file", progress_on(args))
    try:
        shards = index(
            args.url,
            to=args.to,
            format=args.format,
            storage_options=storage_options(args.storage_option) or None,
            cache_dir=args.cache_dir,
            workers=args.workers,
            engine=args.engine,
            ray_address=args.ray_address,
            progress=bar.update,
        )
    finally:
        bar.close()
    where = published_at(args.url, args.to)
    bad = sum(s.error is not None for s in shards)
    unreadable = f" ({bad} unreadable, counted as 0)" if bad else ""
    print(
        f"{len(shards):,} files, {shards.total:,} records, {size(int(shards.bytes.sum()))}{unreadable}: "
        f"index published at {where}"
    )
    return 0
