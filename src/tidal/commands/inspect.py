"""``tidal inspect URL``: what a dataset holds, from its index and its first records.

Format(s), shards, records, bytes, the columns and their types (from the first records read:
Arrow types where the format reads Arrow, else the types of the values), a few sample records,
and the shards one per line. Any format and any source ``tidal.Dataset`` reads, local or
remote. With ``--config`` it shows the pipeline a config resolves to, its sources, and the
first item the pipeline yields.

Bad data does not stop it (``--errors skip``, the default): a file that cannot be read is
listed as unreadable, and a bad record among those read for the columns and samples is
skipped, counted and named (file, line or row, what is wrong); either makes the exit status 1.
``--errors raise`` stops at the first, as a pipeline with ``errors="raise"`` would.
"""

from __future__ import annotations

import argparse
import os
from collections import Counter
from typing import TYPE_CHECKING, Any

from tidal.commands import add_source, listed, open_dataset, size
from tidal.errors import ArgumentError, TidalError

if TYPE_CHECKING:
    from tidal.dataset import Dataset
    from tidal.sources.shards import Shards

TEXT_CHARS = 100  # characters of a string shown in a sample
ITEMS = 8  # elements of a list or array shown in a sample


def add(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "inspect",
        parents=parents,
        help="what a dataset holds: formats, shards, records, columns and types, bytes, sample records",
        description="Show what a dataset holds: its format(s), shards, records, bytes, columns and their types, "
        "a few sample records, and the shards. Any format and source tidal.Dataset reads; with --config, the "
        "pipeline a config resolves to and the first item it yields.",
    )
    add_source(p, what="inspect")
    p.add_argument("--samples", type=int, default=3, metavar="N", help="sample records to show (default 3; 0: none)")
    p.add_argument(
        "--limit",
        type=int,
        default=None,
        metavar="N",
        help="shards and bad records to list (default 20; the rest counted); not with --config",
    )
    p.add_argument(
        "--errors",
        choices=("skip", "raise"),
        default=None,
        help="a bad record among those read: skip it, counted and named, exit status 1 (default); or raise: stop "
        "at the first (not with --config: the config's own errors policy applies)",
    )
    p.set_defaults(run=run)


class Collected:
    """An ``errors=`` policy that keeps each error and skips what it names: what ``inspect`` shows."""

    def __init__(self) -> None:
        self.errors: list[TidalError] = []

    def __call__(self, error: TidalError) -> None:
        self.errors.append(error)


def run(args: argparse.Namespace) -> int:
    import numpy as np

    if args.samples < 0 or (args.limit is not None and args.limit < 0):
        raise ArgumentError("--samples and --limit cannot be negative")
    if args.config is not None:
        if args.errors is not None:
            raise ArgumentError("--errors: with --config the config's own errors policy applies; set it there")
        if args.limit is not None:
            raise ArgumentError("--limit: with --config the pipeline is shown, not its shards")
        return _pipeline(open_dataset(args), args)
    args.limit = 20 if args.limit is None else args.limit
    args.errors = args.errors or "skip"
    ds = open_dataset(args, errors=listed if args.errors == "skip" else "raise")
    shards = ds.shards  # columns: read as such, never a Shard per file (a corpus may have a million)
    total = int(shards.bytes.sum())
    bad = [shards[i] for i, error in enumerate(shards.errors) if error is not None]
    unreadable = f", {len(bad)} unreadable (not counted)" if bad else ""
    print(
        f"{len(shards)} shard{'s' * (len(shards) != 1)}, {ds.num_records:,} records, {size(total)} in {args.url}"
        + unreadable
    )
    kinds = _kinds(shards)
    print("format: " + ", ".join(f"{kind} ({n} shard{'s' * (n > 1)})" for kind, n in kinds.most_common()))
    readable = np.fromiter((e is None for e in shards.errors), dtype=bool, count=len(shards))
    counted = np.flatnonzero((shards.rows > 0) & readable)
    firsts = _first_of_each_format(shards, counted)
    skipped = Collected() if args.errors == "skip" else None
    for i in firsts:
        shard = shards[i]
        table = _first_table(ds, i, max(args.samples, 64), skipped)
        of = f"{_kind(shard)} shards, " if len(firsts) > 1 else ""
        print(f"columns ({of}of the first records, in {os.path.basename(shard.path)}):")
        for name, kind in column_types(table).items():
            print(f"  {name:<20} {kind}")
        if args.samples:
            print(f"samples (the first {args.samples} of {os.path.basename(shard.path)}):")
            for record in _records(table)[: args.samples]:
                print("  " + show(record))
    print("shards:")
    print(f"  {'records':>12}  {'bytes':>9}  format          path")
    for s in shards[: args.limit]:
        rows = "unreadable" if s.error is not None else f"{s.rows:,}"
        print(f"  {rows:>12}  {size(s.bytes):>9}  {_kind(s):<14}  {s.path}")
    if len(shards) > args.limit:
        print(f"  ... {len(shards) - args.limit} more (--limit)")
    for s in bad[: args.limit]:
        print(f"unreadable: {s.error}")
    if len(bad) > args.limit:
        print(f"unreadable: ... {len(bad) - args.limit} more")
    found = skipped.errors if skipped is not None else []
    if found:
        read = ", ".join(os.path.basename(shards[i].path) for i in firsts)
        print(f"bad records: {len(found)} skipped among the records read for the columns and samples (of {read}):")
        for error in found[: args.limit]:
            print(f"  {error}")
        if len(found) > args.limit:
            print(f"  ... {len(found) - args.limit} more (--limit)")
    return 1 if bad or found else 0


def _pipeline(ds: Dataset, args: argparse.Namespace) -> int:
    """A config: the pipeline it resolves to, its sources, and the first item it yields."""
    from tidal.world import World

    print(repr(ds))
    for key, plan in ds.sources().items():
        name = f"stream {key[:-1]}" if key else "source"
        formats = ", ".join(_kinds(plan.shards))
        print(
            f"  {name}: {len(plan.shards)} shards, {plan.total} records, "
            f"{size(int(plan.shards.bytes.sum()))} ({formats})"
        )
    print(f"fingerprint {ds.fingerprint()}")
    if args.samples:
        it = ds.iterator(World())
        try:
            first = next(it, None)
        finally:
            it.close()
        if first is not None:
            print("the first item the pipeline yields:")
            if isinstance(first, dict):
                for name, kind in column_types([first]).items():
                    print(f"  {name:<20} {kind}")
            print("  " + show(first))
    return 0


def _kinds(shards: Shards) -> Counter[str]:
    """Shards per format (with its compression), in order of first appearance."""
    return Counter(f"{f}.{c}" if c else f for f, c in zip(shards.formats, shards.compressions, strict=True))


def _kind(shard: Any) -> str:
    return shard.format + (f".{shard.compression}" if shard.compression else "")


def _first_of_each_format(shards: Shards, counted: Any) -> list[int]:
    """The first shard with records of each format (a glob may match several; each has its columns)."""
    seen: dict[str, int] = {}
    for i in counted.tolist():
        seen.setdefault(f"{shards.formats[i]}.{shards.compressions[i]}", i)
        if len(seen) == 8:  # enough to see that the formats differ
            break
    return list(seen.values())


def _first_table(ds: Dataset, shard: int, n: int, skipped: Collected | None = None) -> Any:
    """Up to ``n`` records from the start of shard number ``shard``, as the source reads them (an
    Arrow table where the format reads Arrow); bad records go to ``skipped`` (default: raised)."""
    from dataclasses import replace

    from tidal.stages import Context
    from tidal.stages.read import Read
    from tidal.world import World

    errors: Any = skipped if skipped is not None else "raise"

    def only(read: Read) -> Read:
        return Read(replace(read.plan, shards=read.plan.shards[shard : shard + 1], seed=None, errors=errors))

    it = ds.stage.with_source(only).open(Context(World()), None)
    try:
        return it.next(n)
    except StopIteration:
        return []
    finally:
        it.close()


def _records(table: Any) -> list[Any]:
    from tidal.tables import records

    return records(table)


def column_types(table: Any) -> dict[str, str]:
    """Column name to type: Arrow's for an Arrow table, else the types of the values of a list of records."""
    import pyarrow as pa

    if isinstance(table, pa.Table):
        return {f.name: str(f.type) for f in table.schema}
    seen: dict[str, list[str]] = {}
    for record in table:
        if not isinstance(record, dict):
            seen.setdefault("(record)", []).append(type_name(record))
            continue
        for name, value in record.items():
            seen.setdefault(name, []).append(type_name(value))
    return {name: " | ".join(dict.fromkeys(kinds)) for name, kinds in seen.items()}


def type_name(value: Any) -> str:
    import numpy as np

    if isinstance(value, np.ndarray):
        return f"array[{value.dtype}]" + (f" of shape {value.shape}" if value.ndim > 1 else "")
    if isinstance(value, np.generic):
        return str(value.dtype)
    if isinstance(value, list):
        inner = dict.fromkeys(type_name(v) for v in value[:ITEMS])
        return f"list[{' | '.join(inner) or '?'}]"
    if isinstance(value, dict):
        return "dict"
    if value is None:
        return "null"
    return {"str": "string", "bytes": "binary"}.get(type(value).__name__, type(value).__name__)


def show(value: Any, depth: int = 0) -> str:
    """A record on one line: long strings, lists and arrays cut, bytes as their size."""
    import numpy as np

    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {show(v, depth + 1)}" for k, v in value.items()) + "}"
    if isinstance(value, str):
        text = value if len(value) <= TEXT_CHARS else value[:TEXT_CHARS] + f"... ({len(value):,} chars)"
        return repr(text)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"<{size(len(value))} of bytes>"
    if isinstance(value, np.ndarray):
        head = ", ".join(str(v) for v in value.reshape(-1)[:ITEMS].tolist())
        more = ", ..." if value.size > ITEMS else ""
        return f"array[{value.dtype}, shape {value.shape}]([{head}{more}])"
    if isinstance(value, (list, tuple)):
        head = ", ".join(show(v, depth + 1) for v in value[:ITEMS])
        more = f", ... ({len(value):,} items)" if len(value) > ITEMS else ""
        return f"[{head}{more}]"
    return repr(value)
