"""``tidal plan URL``: a run simulated before it starts, from the index alone (see :mod:`tidal.simulate`)."""

from __future__ import annotations

import argparse
import re
from typing import TYPE_CHECKING, Any

from tidal.commands import add_source, open_dataset, progress_on, rate, seconds, size
from tidal.errors import ArgumentError
from tidal.progress import Bar

if TYPE_CHECKING:
    from tidal.dataset import Dataset
    from tidal.simulate import Simulation
    from tidal.stages.plan import ReadPlan


def add(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "plan",
        parents=parents,
        help="simulate a run from the index alone: downloads per node, cache needed, shuffle quality, first batch",
        description="Simulate one epoch of a run before it starts, from the dataset's index alone (no record is "
        "read): the bytes each node downloads (the shards whose blocks its readers read), the cache a shuffle "
        "block needs, the shuffle quality (distinct shards per batch) and the time to the first batch at a given "
        "bandwidth. The order is the one tidal will read: the same seed, blocks and topology give the same epoch.",
    )
    add_source(p, what="plan a run on")
    p.add_argument("--ranks", type=int, default=1, help="processes of the run (world size; default 1)")
    p.add_argument(
        "--ranks-per-node", type=int, default=1, help="ranks on each machine, which share its shard cache (default 1)"
    )
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="DataLoader workers per rank (default: a config's loader num_workers, else 1; 0 counts as 1)",
    )
    p.add_argument(
        "--shuffle",
        type=int,
        default=None,
        metavar="SEED",
        help="shuffle with this seed (default: a config's, else in order)",
    )
    p.add_argument(
        "--block-size", type=int, default=None, help="records per shuffle block (default: a config's, else 16384)"
    )
    p.add_argument(
        "--block-bytes",
        default=None,
        metavar="SIZE",
        help="bytes of its files a shuffle block holds at most, e.g. 64MB (default: a config's, else 128MiB)",
    )
    p.add_argument(
        "--shards-per-block",
        type=int,
        default=None,
        help="shards each shuffle block mixes at least (default: a config's, else 8)",
    )
    p.add_argument("--batch", type=int, default=None, help="records per batch (default: a config's batch size, else 8)")
    p.add_argument(
        "--cache-limit",
        default=None,
        metavar="SIZE",
        help="the shard cache of each node, e.g. 200GB (default: the dataset's, 50GB unless set; local data: unbounded)",
    )
    p.add_argument(
        "--bandwidth",
        default="1GB/s",
        help="download bandwidth of each node, e.g. 1GB/s, 500MB/s, 10Gbit/s (default 1GB/s)",
    )
    p.add_argument("--epoch", type=int, default=0, help="the epoch to simulate (each is shuffled anew; default 0)")
    p.add_argument(
        "--forever",
        action="store_true",
        help="an infinite stream (repeat()): no remainder is dropped at the end of the epoch (default: a config's, else finite)",
    )
    p.add_argument(
        "--sample-batches",
        type=int,
        default=2000,
        metavar="N",
        help="batches whose shuffle quality is measured (default 2000)",
    )
    p.set_defaults(run=run)


def bandwidth(text: str) -> float:
    """Bytes per second in ``"1GB/s"``, ``"500 MB/s"``, ``"1GiB/s"``, ``"10Gbit/s"``, ``"10Gbps"`` or a
    number of bytes. ``B`` is a byte; ``b`` and ``bit`` are bits.

    >>> bandwidth("10Gbit/s")
    1250000000.0
    """
    m = re.fullmatch(
        r"\s*([0-9]+(?:\.[0-9]*)?(?:[eE][0-9]+)?)\s*([kKmMgGtT]?)(i?)(bit|byte|b|B)?\s*(?:/s|ps)?\s*", text
    )
    if m is None or float(m.group(1)) <= 0:
        raise ArgumentError(f"--bandwidth {text!r}: give a positive rate such as 1GB/s, 500MB/s or 10Gbit/s")
    number, prefix, binary, unit = m.groups()
    power = " kmgt".index(prefix.lower()) if prefix else 0
    scale = (1024 if binary else 1000) ** power
    bits = unit in ("bit", "b")
    return float(number) * scale / (8 if bits else 1)


def run(args: argparse.Namespace) -> int:
    from tidal.simulate import Setup, simulate
    from tidal.storage.config import parse_size

    for name in ("ranks", "ranks_per_node", "batch", "block_size", "shards_per_block", "sample_batches"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ArgumentError(f"--{name.replace('_', '-')} must be at least 1, not {value}")
    if (args.workers is not None and args.workers < 0) or args.epoch < 0:
        raise ArgumentError("--workers and --epoch cannot be negative")
    per_second = bandwidth(args.bandwidth)
    block_bytes = parse_size(args.block_bytes) if args.block_bytes is not None else None
    if block_bytes is not None and block_bytes < 1:
        raise ArgumentError(f"--block-bytes must be at least 1 byte, not {args.block_bytes!r}")
    ds = open_dataset(args)
    workers = args.workers
    if workers is None and args.config is not None:
        from tidal.config import load, loader_settings

        workers = loader_settings(load(args.config)).get("num_workers")
    workers = max(1, workers or 1)
    records = ds.records_per_batch()
    batch = args.batch or records or _batch_size(ds) or 8
    if args.batch is None and records is None and _batch_size(ds) is not None:
        print(
            f"(a batch of this pipeline holds a varying number of source records (packing, filters, records "
            f"skipped, a mixture): the figures per batch below count {batch} records as one; --batch N to say more)"
        )
    sources = ds.sources()
    for key, plan in sources.items():
        if key:
            print(f"stream {key[:-1]}:")
        seed = args.shuffle if args.shuffle is not None else plan.seed if args.config is not None else None
        limit = (
            parse_size(args.cache_limit)
            if args.cache_limit is not None
            else plan.storage.limit
            if plan.storage is not None
            else None
        )
        setup = Setup(
            **_cache(plan, limit, workers, ds),
            rows=plan.shards.rows.tolist(),
            bytes=plan.shards.bytes.tolist(),
            seed=seed,
            block_size=args.block_size or plan.block_size,
            block_bytes=block_bytes or plan.block_bytes,
            shards_per_block=args.shards_per_block or plan.shards_per_block,
            ranks=args.ranks,
            workers=workers,
            ranks_per_node=min(args.ranks_per_node, args.ranks),
            finite=not args.forever and plan.epochs is not None,
            epoch=args.epoch,
            batch=batch,
            cache_limit=limit,
            bandwidth=per_second,
            sample_batches=args.sample_batches,
        )
        bar = Bar(setup.ranks * setup.workers, "simulate", "reader", progress_on(args))
        try:
            sim = simulate(setup, bar.update)
        finally:
            bar.close()
        remote = plan.storage is not None
        print(report(sim, remote, "  " if key else ""))
    if len(sources) > 1:
        print("(a mixture: each stream simulated on its own, with --batch records per batch from it)")
    return 0


def _batch_size(ds: Dataset) -> int | None:
    return ds.stage.batch_size()


def _cache(plan: ReadPlan, limit: int | None, workers: int, ds: Dataset) -> dict:
    """What the simulation needs to size the cache as the readers check it: per shard what a reader
    holds in the cache while it is open, which may be read in place instead, the cache's own
    files, and the continuous rows each worker streams (each a reader)."""
    from tidal.stages.continuous import ContinuousBatch, rows_per_reader

    continuous = [s for s in ds.stage.main_line() if isinstance(s, ContinuousBatch)]
    lanes = rows_per_reader(continuous[0].size, workers) if continuous else 1
    if plan.storage is None:  # local data: no cache; sized as if the same files were remote
        return {"lanes": lanes}
    from tidal.storage.cache import Cache
    from tidal.storage.prefetch import fetched_whole
    from tidal.storage.room import cached_sizes, streamable

    shards = plan.shards
    return {
        "lanes": lanes,
        "cached": cached_sizes(shards, fetched_whole(shards, plan.columns)).tolist(),
        "streamable": streamable(shards).tolist(),
        "fixed": Cache(plan.storage.root, limit if limit is not None else plan.storage.limit).fixed(),
    }


def report(sim: Simulation, remote: bool, indent: str = "") -> str:
    """What ``tidal plan`` prints about one source."""
    s = sim.setup
    lines = []
    order = (
        f"shuffled (seed {s.seed}) in blocks of {s.block_size:,} records"
        f"{f' and {size(s.block_bytes)}' if s.block_bytes is not None else ''} mixing at least {s.shards_per_block} shards"
        if s.seed is not None
        else "in order (no shuffle)"
    )
    lines.append(
        f"data: {len(s.rows):,} shards, {sim.total_records:,} records, {size(sim.total_bytes)}; "
        f"{order}: {sim.blocks:,} block{'s' * (sim.blocks != 1)} in epoch {s.epoch}"
    )
    readers = s.ranks * s.workers
    lines.append(
        f"run: {s.nodes} node{'s' * (s.nodes > 1)} x {min(s.ranks_per_node, s.ranks)} rank(s) x {s.workers} "
        f"worker(s) = {readers} readers, batches of {s.batch:,} records"
    )
    per = sim.readers.records
    least, most, read = int(per.min()), int(per.max()), int(per.sum())
    dropped = sim.total_records - read
    note = f"; {dropped:,} not read this epoch (the remainder of a finite epoch)" if dropped else ""
    lines.append(
        f"each reader: {least:,}{'' if least == most else f' to {most:,}'} records{note}; "
        f"{sim.batches_per_rank:,} batches per rank per epoch"
    )
    loaded = int(sim.readers.loaded.sum())
    if read:
        lines.append(
            f"reads: the readers load {loaded:,} records to yield {read:,} ({loaded / read:.2f}x: "
            "a reader loads a block whole to yield its part of it)"
        )
    limit = "unbounded" if s.cache_limit is None else size(s.cache_limit)
    what = "downloads" if remote else "shards opened (local data: nothing to download)"
    lines.append(f"{what} per node, epoch {s.epoch} (cache_limit {limit}):")
    for i, n in enumerate(sim.nodes[:16]):
        extra = ""
        if n.downloads > n.touched:
            extra = (
                f"; with the cache_limit: {n.downloads:,} fetches, {size(n.downloaded_bytes)} (shards fetched again)"
            )
        ranks = f"rank {n.ranks[0]}" if len(n.ranks) == 1 else f"ranks {n.ranks[0]}-{n.ranks[-1]}"
        share = n.touched_bytes / sim.total_bytes if sim.total_bytes else 0
        lines.append(
            f"  node {i} ({ranks}): {n.touched:,} shards, {size(n.touched_bytes)} ({share:.0%} of the data){extra}"
        )
    if len(sim.nodes) > 16:
        lines.append(f"  ... {len(sim.nodes) - 16} more nodes")
    total = sum(n.downloaded_bytes for n in sim.nodes)
    if sim.total_bytes:
        lines.append(f"  all nodes: {size(total)} per epoch, {total / sim.total_bytes:.2f}x the data")
    lines += _cache_lines(sim, remote)
    q = sim.quality
    if q:
        if s.seed is None:
            lines.append(
                f"shuffle: none; a batch of {s.batch:,} holds records of {q['distinct']:.2f} shard(s) on average "
                f"(shuffled at random it would be {q['ideal']:.2f} of {q['shards']:,})"
            )
        else:
            lines.append(
                f"shuffle: a batch of {s.batch:,} holds records of {q['distinct']:.2f} distinct shards on average "
                f"(a perfect shuffle: {q['ideal']:.2f} of {q['shards']:,}); its largest part from one shard: "
                f"{q['largest_share']:.0%} (measured on {q['batches']:,} batches)"
            )
    first = max((n.first_bytes for n in sim.nodes), default=0)
    lines.append(
        f"first batch: about {seconds(sim.first_batch_seconds())} at {rate(s.bandwidth)}B/s "
        f"(a node's readers fetch their first blocks, {size(first)}, at once); after a resume at most "
        f"{seconds(sim.worst_block_seconds())} (the largest block's shards, {size(sim.largest_block_bytes)}); "
        "the network part only"
        if remote
        else f"first batch: reading {size(first)} from disk at {rate(s.bandwidth)}B/s takes about "
        f"{seconds(sim.first_batch_seconds())}"
    )
    return "\n".join(indent + line for line in lines)


def _cache_lines(sim: Simulation, remote: bool) -> list[str]:
    """The cache a node needs: what a reader holds in this epoch, and in the worst, which tidal
    checks before the first block (the same figure its error names)."""
    s, need = sim.setup, sim.room
    worst = sim.readers[int(sim.readers.held_bytes.argmax())]  # the first that holds the most
    node = f"{min(s.ranks_per_node, s.ranks)} rank(s) x {s.workers} worker(s)"
    if s.lanes > 1:
        node += f" x {s.lanes} continuous rows"
    ranged = f" with {len(sim.ranged):,} Parquet shard(s) read in place by ranges" if sim.ranged else ""
    lines = [
        f"cache: in epoch {s.epoch} a reader holds at most {worst.held_shards} shard(s) open at once, "
        f"{size(worst.held_bytes)} in the cache; in the worst epoch up to {need.shards} ({need.why()}), "
        f"{size(need.per_reader)}{ranged}",
        f"  tidal needs a cache_limit of at least {sim.cache_per_node:,} bytes ({size(sim.cache_per_node)}) for a node "
        f"of {node} = {s.readers_per_node} readers, each of which may hold as much at once"
        + (
            " (more than every shard once: the whole dataset)"
            if need.needed < s.readers_per_node * need.per_reader
            else ""
        )
        + (f" ({size(s.fixed)} of it the cache's own index and directories)" if s.fixed else "")
        + (f"; {size(sim.cache_per_rank)} for one rank" if min(s.ranks_per_node, s.ranks) > 1 else ""),
    ]
    if s.cache_limit is not None and remote:
        if sim.cache_per_node <= s.cache_limit:
            whole = " (the whole dataset fits)" if need.needed == need.whole else ""
            lines.append(f"  cache_limit {size(s.cache_limit)}: enough for every epoch{ranged}{whole}")
        else:
            lines.append(
                f"  cache_limit {size(s.cache_limit)} is too small: tidal refuses it before the first batch "
                f"(StorageError); raise it, or hold fewer shards at once: {need.fix() or 'no argument holds fewer'}"
            )
    return lines
