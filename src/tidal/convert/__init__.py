"""``tidal convert``: a dataset rewritten as Parquet or tidal token shards, restartably, on one
machine's processes or on a Ray cluster.

>>> from tidal.convert import convert
>>> convert("data/web/*.jsonl.zst", "data/web-parquet")                      # Parquet, same records
>>> convert("data/web", "data/web-tokens", to="tokens", tokenizer="tokenizer.json", workers=4)
>>> tidal.Dataset("data/web-tokens").pack(2048)                               # reads it directly

**The plan.** The source's records in their own order (unshuffled, one epoch) are cut into
output shards: output shard ``k`` holds positions ``[start_k, stop_k)`` of the source, and
nothing else decides what it holds. The cut is a pure function of the source's shard list
(records and bytes of each file), ``shard_size``, and the ratio of output to input bytes,
measured once on the source's first records with the same writer; the first records also
fix the output's schema (Parquet) or token dtype (tokens). All of it is saved in
``DST/.tidal-convert/plan.json`` before the first shard is written, with a fingerprint of the
source and the options, so a restart uses the same plan, and a restart with another source
or other options is refused instead of mixing two conversions.

**Finished shards.** A task writes its shard under a temporary name, places it under its
final name in one step (rename, or one upload), then writes its entry (rows, bytes, hash) to
``DST/.tidal-convert/done/<k>.json``, atomically. A restarted conversion skips every shard
with an entry whose file is still there at its size; a shard whose process died before its
entry was written is written again, whole. Once every shard is done, the index is written:
``.tidal-index.json`` for Parquet (the format of tidal's own index, so ``tidal.Dataset(DST)``
reads it without scanning a file, and checks the hashes of remote copies) or ``index.json``
for token shards (as :class:`~tidal.formats.tokens.TokenWriter` writes it).

**Engines.** The tasks are independent: ``engine="local"`` runs them in this process
(``workers=1``) or in ``workers`` processes started with ``spawn``; ``engine="ray"`` runs each
as a Ray task (``ray.init(address=...)`` for a cluster, whose nodes need tidal installed and
a destination they all reach, e.g. ``s3://``). Both run :func:`run_task`, the same code.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tidal.convert.plan import chain, cut, load_or_make
from tidal.convert.progress import Progress
from tidal.convert.task import Job, finished, run_task
from tidal.dataset import Dataset
from tidal.errors import ArgumentError
from tidal.formats import Errors
from tidal.storage.config import parse_size
from tidal.writers.output import Output

__all__ = ["Job", "Report", "convert", "cut", "run_task"]

TARGETS = ("parquet", "tokens")


@dataclass
class Report:
    """What a conversion did: the output's shards and records, and how many shards an earlier run had done."""

    dst: str
    shards: int  # the output's shards, written by this run or an earlier one
    records: int
    bytes: int
    seconds: float
    resumed: int = 0  # shards found done and skipped
    entries: list[dict] = field(default_factory=list, repr=False)
    written: int | None = None  # shards this run wrote (None: all of them)
    written_bytes: int | None = None  # their bytes

    def __str__(self) -> str:
        wrote = self.shards if self.written is None else self.written
        size = self.bytes if self.written_bytes is None else self.written_bytes
        rate = size / 1e6 / self.seconds if self.seconds > 0 else 0.0
        now = f"in {self.seconds:.1f} s ({rate:.1f} MB/s)"
        if not self.resumed:
            return f"wrote {_shards(wrote)}, {self.records} records, {self.bytes / 1e6:.1f} MB to {self.dst} {now}"
        return (
            f"wrote {wrote} of {_shards(self.shards)} ({self.resumed} already done) {now}; "
            f"{self.dst} holds {self.records} records, {self.bytes / 1e6:.1f} MB"
        )


def _shards(n: int) -> str:
    return f"{n} shard" if n == 1 else f"{n} shards"


def convert(
    src: Any,
    dst: str | os.PathLike,
    *,
    to: str = "parquet",
    columns: Sequence[str] | None = None,
    tokenizer: Any = None,
    column: str | None = None,
    shard_size: int | str = "256MB",
    workers: int = 1,
    engine: str = "local",
    ray_address: str | None = None,
    progress: bool | None = None,
    format: str | None = None,
    storage_options: dict[str, Any] | None = None,
    dst_options: dict[str, Any] | None = None,
    errors: Errors = "raise",
    format_options: dict[str, Any] | None = None,
    cache_dir: str | os.PathLike | None = None,
    follow_links: bool = False,
) -> Report:
    """Rewrite ``src`` (anything :class:`tidal.Dataset` reads, or a dataset) as shards in ``dst``.

    ``to="parquet"`` keeps the records (``columns`` selects some); ``to="tokens"`` writes tidal
    token shards of ``tokenizer`` applied to ``column`` (default ``"text"``), or of a column of
    token ids already there (default ``"input_ids"``). Output shards hold about ``shard_size``
    bytes. ``workers`` processes (``engine="local"``) or Ray tasks at once (``engine="ray"``; all
    that Ray will run when 1). Running it again after an interruption skips the finished shards.
    ``progress``: a progress bar on stderr (default: when stderr is a terminal). ``errors``: the
    source's policy for bad records, as :class:`tidal.Dataset` takes it (``"skip"`` also skips
    the records ``tokenizer`` cannot use: a null or missing text), for a source named by path;
    ``format_options`` too (CSV's ``column_types``, say), and ``cache_dir`` (the shard cache of
    remote data) and ``follow_links``, as :class:`tidal.Dataset` takes them.

    >>> convert("data/web", "data/web-tokens", to="tokens", tokenizer="tokenizer.json", workers=4)
    """
    started = time.monotonic()
    if to not in TARGETS:
        raise ArgumentError(f"to must be 'parquet' or 'tokens', not {to!r}")
    if engine not in ("local", "ray"):
        raise ArgumentError(f"engine must be 'local' or 'ray', not {engine!r}")
    if ray_address is not None and engine != "ray":
        raise ArgumentError("ray_address is the cluster of engine='ray': give that engine too, or leave it out")
    if not isinstance(workers, int) or workers < 1:
        raise ArgumentError(f"workers must be at least 1, not {workers!r}")
    size = parse_size(shard_size)
    if size < 1:
        raise ArgumentError("shard_size must be at least 1 byte")
    if to == "parquet" and tokenizer is None and column is not None:
        raise ArgumentError("column names the text to tokenize (with tokenizer=) or, with to='tokens', the token ids")
    by_path = (columns, errors != "raise", format_options, cache_dir, follow_links)
    if isinstance(src, Dataset) and any(v not in (None, False) for v in by_path):
        raise ArgumentError(
            "columns=, errors=, format_options=, cache_dir= and follow_links= apply to a source named by path; "
            "pass them to the Dataset you convert"
        )
    ds = (
        src
        if isinstance(src, Dataset)
        else Dataset(
            src,
            columns,
            format,
            errors,
            storage_options=storage_options,
            format_options=format_options,
            cache_dir=cache_dir,
            follow_links=follow_links,
        )
    )
    if tokenizer is not None:
        ds = ds.tokenize(tokenizer, column or "text")
    stage = chain(ds)
    ids = "input_ids" if tokenizer is not None else column or "input_ids"
    output = Output(dst, dst_options)
    plan = load_or_make(stage, ds, to, ids, size, output, tokenizer)
    job = Job(
        stage=stage,
        total=plan["total"],
        offsets=tuple(plan["offsets"]),
        paths=tuple(ds.shards.paths),
        to=to,
        output=output,
        column=ids,
        dtype=plan.get("dtype"),
        schema=bytes.fromhex(plan["schema"]) if plan.get("schema") else None,
        ranges=tuple((a, b) for a, b in plan["ranges"]),
    )
    done = finished(job)
    todo = [s for s in range(len(job.ranges)) if s not in done]
    bar = Progress(job, done, progress)
    try:
        if todo:
            if engine == "ray":
                from tidal.convert.engines import run_ray

                run_ray(job, todo, workers, ray_address, bar.shard_done)
            elif workers == 1:
                for s in todo:
                    bar.shard_done(run_task(job, s, bar.counter(s)))
            else:
                from tidal.convert.engines import run_processes

                run_processes(job, todo, workers, bar.shard_done)
    finally:
        bar.close()
    entries = [bar.done[s] for s in range(len(job.ranges))]
    _publish(job, entries)
    shutil.rmtree(output.staging(), ignore_errors=True)  # every shard is in place: what is left was a killed task's
    kept = [e for e in entries if e.get("name")]
    new = [bar.done[s] for s in todo if bar.done[s].get("name")]  # a shard a filter left empty is no file
    return Report(
        dst=output.url,
        shards=len(kept),
        records=sum(e["rows"] for e in kept),
        bytes=sum(e["bytes"] for e in kept),
        seconds=time.monotonic() - started,
        resumed=len(done),
        entries=entries,
        written=len(new),
        written_bytes=sum(e["bytes"] for e in new),
    )


def _publish(job: Job, entries: list[dict]) -> None:
    """The output's index, once every shard is done: what ``tidal.Dataset(DST)`` reads."""
    kept = [e for e in entries if e.get("name")]
    if job.to == "parquet":
        from tidal.sources.index_file import INDEX_NAME, index_json

        keep = ("bytes", "mtime_ns", "version", "format", "compression", "rows", "info", "hash", "scan")
        shards = {e["name"]: {key: e[key] for key in keep if key in e} for e in kept}
        job.output.write_text(INDEX_NAME, index_json(shards).decode())
    else:
        from tidal.formats.tokens import INDEX, VERSION

        fields = ("name", "docs", "tokens", "bytes", "hash")
        shards_list = [{key: e[key] for key in fields} for e in kept]
        index = {"format": "tidal-tokens", "version": VERSION, "dtype": job.dtype, "shards": shards_list}
        job.output.write_text(INDEX, json.dumps(index, indent=1))
