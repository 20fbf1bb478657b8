"""``tidal convert SRC DST``: its arguments and what it prints."""

from __future__ import annotations

import argparse
from typing import Any

from tidal.convert import TARGETS, convert


def add(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "convert",
        parents=parents,
        help="rewrite a dataset as Parquet or tidal token shards (restartable; processes or Ray)",
        description="Rewrite SRC as Parquet (the same records) or as tidal token shards (pre-tokenized, "
        "memory-mapped) in DST, with a hashed index. Run the same command again to finish an interrupted "
        "conversion: finished shards are kept.",
    )
    add_arguments(p)
    p.set_defaults(run=run_cli)


def add_arguments(p: Any) -> None:
    """The arguments of ``tidal convert``."""
    p.add_argument("src", help="what to convert: a file, directory, glob or URL, as tidal.Dataset reads it")
    p.add_argument("dst", help="the output directory (local or a URL); run again to finish an interrupted conversion")
    p.add_argument(
        "--to",
        choices=TARGETS,
        default=None,
        help="output format: parquet (the records) or tokens (tidal token shards); default tokens with --tokenize, else parquet",
    )
    p.add_argument("--columns", default=None, help="comma-separated columns to keep (default: all)")
    p.add_argument(
        "--tokenize",
        metavar="TOKENIZER",
        default=None,
        help="tokenizer.json (or its directory) to tokenize --column with",
    )
    p.add_argument(
        "--column",
        default=None,
        help="the text column to tokenize (default text); with --to tokens and no --tokenize, the column of token ids (default input_ids)",
    )
    p.add_argument("--shard-size", default="256MB", help="about how large each output shard is (default 256MB)")
    p.add_argument(
        "--workers", type=int, default=1, help="processes (local) or Ray tasks at once (ray; 1: as many as Ray runs)"
    )
    p.add_argument("--engine", choices=("local", "ray"), default="local", help="local processes (default) or Ray tasks")
    p.add_argument(
        "--ray-address",
        default=None,
        help="with --engine ray, the Ray cluster to run on (ray.init(address=...)); default a local Ray",
    )
    p.add_argument("--format", default=None, help="the source's format, where its file endings do not tell")
    p.add_argument(
        "--format-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a format option for reading SRC, repeatable, as tidal.Dataset's format_options (a dotted key nests: "
        "column_types.zip=string reads a CSV column as text)",
    )
    p.add_argument(
        "--errors",
        choices=("raise", "skip"),
        default="raise",
        help="bad records (and, with --tokenize, records without text): stop (default) or skip and count them",
    )
    p.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an fsspec storage option for reading SRC, repeatable (as in tidal inspect: a dotted key nests, a value is JSON where it parses)",
    )
    p.add_argument("--cache-dir", default=None, help="the shard cache of remote SRC (as in tidal inspect)")
    p.add_argument(
        "--follow-links",
        action="store_true",
        help="read what symbolic links in a local SRC directory lead to outside it (as in tidal inspect)",
    )
    p.add_argument(
        "--dst-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an fsspec storage option for writing DST, repeatable",
    )
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a progress bar on stderr (default: when stderr is a terminal; tqdm draws it: pip install 'tidal[cli]')",
    )


def run_cli(args: Any) -> int:
    """``tidal convert``: convert, then print what was written."""
    from tidal.commands import storage_options

    report = convert(
        args.src,
        args.dst,
        to=args.to or ("tokens" if args.tokenize else "parquet"),
        columns=[c.strip() for c in args.columns.split(",") if c.strip()] if args.columns else None,
        tokenizer=args.tokenize,
        column=args.column,
        shard_size=args.shard_size,
        workers=args.workers,
        engine=args.engine,
        ray_address=args.ray_address,
        progress=args.progress,
        format=args.format,
        format_options=storage_options(args.format_option) or None,
        storage_options=storage_options(args.storage_option) or None,
        dst_options=storage_options(args.dst_option) or None,
        errors=args.errors,
        cache_dir=args.cache_dir,
        follow_links=args.follow_links,
    )
    print(report)
    return 0
