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

import argparse
import contextlib
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from tidal.dataset import Dataset
from tidal.errors import RecordError, TidalError
from tidal.stages import Context, Stage, walk
from tidal.stages.read import Read
from tidal.stages.tokenize import Tokenize
from tidal.stages.transform import Filter, Map
from tidal.state import keys as k
from tidal.storage.config import parse_size
from tidal.tables import Table, length
from tidal.world import World
from tidal.writers.output import WORK, Output

PLAN_VERSION = 1
READ_BLOCK = 2048  # records read at once: memory per task is this many records plus one row group
SAMPLE_RECORDS = 1000  # records that measure the output-to-input ratio and fix the schema or dtype
TARGETS = ("parquet", "tokens")


@dataclass(frozen=True)
class Job:
    """What every task needs: picklable, sent once to each worker process or Ray worker."""

    stage: Stage  # the chain over the whole source: unshuffled, one epoch
    total: int  # source records
    offsets: tuple[int, ...]  # where each source shard starts in the source's positions
    paths: tuple[str, ...]  # each source shard's path, for messages
    to: str
    output: Output
    column: str  # tokens: the column of token ids
    dtype: str | None  # tokens: uint16 or uint32
    schema: bytes | None  # parquet: the output's schema, serialized
    ranges: tuple[tuple[int, int], ...]  # output shard k holds source positions ranges[k]

    def name(self, shard: int) -> str:
        return f"part-{shard:05d}.parquet" if self.to == "parquet" else f"shard-{shard:05d}.tokens"

    def locate(self, position: int) -> tuple[str, int]:
        """The source file and row of a source position, for messages."""
        i = int(np.searchsorted(self.offsets, position, side="right")) - 1
        i = max(0, min(i, len(self.paths) - 1))
        return self.paths[i], position - self.offsets[i]


@dataclass
class Report:
    """What a conversion did: the output's shards and records, and how many shards an earlier run had done."""

    dst: str
    shards: int
    records: int
    bytes: int
    seconds: float
    resumed: int = 0  # shards found done and skipped
    entries: list[dict] = field(default_factory=list, repr=False)

    def __str__(self) -> str:
        done = f" ({self.resumed} already done)" if self.resumed else ""
        rate = self.bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0
        return (
            f"wrote {self.shards} shards{done}, {self.records} records, {self.bytes / 1e6:.1f} MB "
            f"to {self.dst} in {self.seconds:.1f} s ({rate:.1f} MB/s)"
        )


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
) -> Report:
    """Rewrite ``src`` (anything :class:`tidal.Dataset` reads, or a dataset) as shards in ``dst``.

    ``to="parquet"`` keeps the records (``columns`` selects some); ``to="tokens"`` writes tidal
    token shards of ``tokenizer`` applied to ``column`` (default ``"text"``), or of a column of
    token ids already there (default ``"input_ids"``). Output shards hold about ``shard_size``
    bytes. ``workers`` processes (``engine="local"``) or Ray tasks at once (``engine="ray"``; all
    that Ray will run when 1). Running it again after an interruption skips the finished shards.
    ``progress``: a progress bar on stderr (default: when stderr is a terminal).

    >>> convert("data/web", "data/web-tokens", to="tokens", tokenizer="tokenizer.json", workers=4)
    """
    started = time.monotonic()
    if to not in TARGETS:
        raise ValueError(f"to must be 'parquet' or 'tokens', not {to!r}")
    if engine not in ("local", "ray"):
        raise ValueError(f"engine must be 'local' or 'ray', not {engine!r}")
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be at least 1, not {workers!r}")
    size = parse_size(shard_size)
    if size < 1:
        raise ValueError("shard_size must be at least 1 byte")
    if to == "parquet" and tokenizer is None and column is not None:
        raise ValueError("column names the text to tokenize (with tokenizer=) or, with to='tokens', the token ids")
    ds = src if isinstance(src, Dataset) else Dataset(src, columns, format, storage_options=storage_options)
    if isinstance(src, Dataset) and columns is not None:
        raise ValueError("columns= applies to a source named by path; select columns when building the dataset")
    if tokenizer is not None:
        ds = ds.tokenize(tokenizer, column or "text")
    stage = _chain(ds)
    ids = "input_ids" if tokenizer is not None else column or "input_ids"
    output = Output(dst, dst_options)
    plan = _load_or_make_plan(stage, ds, to, ids, size, output, tokenizer)
    job = Job(
        stage=stage,
        total=plan["total"],
        offsets=tuple(plan["offsets"]),
        paths=tuple(s.path for s in ds.shards),
        to=to,
        output=output,
        column=ids,
        dtype=plan.get("dtype"),
        schema=bytes.fromhex(plan["schema"]) if plan.get("schema") else None,
        ranges=tuple((a, b) for a, b in plan["ranges"]),
    )
    done = _finished(job)
    todo = [s for s in range(len(job.ranges)) if s not in done]
    bar = _Progress(job, done, progress)
    try:
        if todo:
            if engine == "ray":
                from tidal.convert_ray import run_ray

                run_ray(job, todo, workers, ray_address, bar.shard_done)
            elif workers == 1:
                for s in todo:
                    bar.shard_done(run_task(job, s, bar.counter(s)))
            else:
                _run_processes(job, todo, workers, bar.shard_done)
    finally:
        bar.close()
    entries = [bar.done[s] for s in range(len(job.ranges))]
    _publish(job, entries)
    with contextlib.suppress(OSError):  # left only where a task died mid-shard: its temporary file
        output.staging().rmdir()
    kept = [e for e in entries if e.get("name")]
    return Report(
        dst=output.url,
        shards=len(kept),
        records=sum(e["rows"] for e in kept),
        bytes=sum(e["bytes"] for e in kept),
        seconds=time.monotonic() - started,
        resumed=len(done),
        entries=entries,
    )


# -- the chain and the plan ----------------------------------------------------------------------


def _chain(ds: Dataset) -> Stage:
    """The dataset's chain over its source unshuffled, one epoch, read in small blocks."""
    for stage in walk(ds.stage):
        if not isinstance(stage, (Read, Map, Filter, Tokenize)):
            raise TidalError(
                f"convert writes records: {stage.call()} cannot come in the chain (read, map, filter and tokenize can; "
                "mixing, packing and batching belong to the training pipeline that reads the output)"
            )
    return ds.stage.with_source(lambda read: Read(replace(read.plan, seed=None, epochs=1, block_size=READ_BLOCK)))


def read_range(stage: Stage, total: int, start: int, stop: int) -> Iterator[tuple[Table, int]]:
    """The records of source positions ``[start, stop)`` through the chain, in order, each table
    with the source position after it."""
    done = [[0, start], [stop, total]]
    origin = {"": {k.EPOCH: 0, k.DONE: {"0": done}}}
    it = stage.open(Context(World(), 0, origin), None)
    try:
        while True:
            try:
                table = it.next(READ_BLOCK)
            except StopIteration:
                return
            yield table, start + it.used()[""][1]
    finally:
        it.close()


def _fingerprint(stage: Stage, ds: Dataset, to: str, column: str, size: int, tokenizer: Any) -> str:
    facts: list[Any] = [PLAN_VERSION, stage.describe(), to, column, size]
    facts.append([(s.path, s.rows, s.bytes, s.version) for s in ds.shards])
    tokenizers = [s for s in walk(stage) if isinstance(s, Tokenize)]
    for t in tokenizers:
        backend = t.tokenizer.backend
        text = backend.to_str() if hasattr(backend, "to_str") else repr(backend)
        facts.append(hashlib.sha1(text.encode()).hexdigest())
    return hashlib.sha1(json.dumps(facts, default=str).encode()).hexdigest()[:16]


def _load_or_make_plan(
    stage: Stage, ds: Dataset, to: str, column: str, size: int, output: Output, tokenizer: Any
) -> dict:
    """The saved plan where this conversion was started before; else a new one, saved."""
    fingerprint = _fingerprint(stage, ds, to, column, size, tokenizer)
    saved = output.read_text(f"{WORK}/plan.json")
    if saved is not None:
        try:
            found = json.loads(saved)
        except ValueError:
            found = {}
        if not isinstance(found, dict) or found.get("fingerprint") != fingerprint:
            raise TidalError(
                f"{output.where(WORK + '/plan.json')}: {output.url} holds a conversion of another source or with other "
                "options; remove it, or convert into another directory"
            )
        return found
    others = [n for n in output.names() if n != WORK]
    if others:
        raise TidalError(
            f"{output.url}: not empty ({others[0]}, ...) and not a tidal conversion: convert into a new directory"
        )
    sources = ds.shards
    total = sum(s.rows for s in sources)
    if total == 0:
        raise TidalError(f"{ds!r}: the source has no records to convert")
    offsets = np.concatenate([[0], np.cumsum([s.rows for s in sources])]).astype(np.int64)
    sample: list[Table] = []
    got = 0
    for table, _ in read_range(stage, total, 0, min(total, SAMPLE_RECORDS)):
        sample.append(table)
        got += length(table)
    plan: dict[str, Any] = {"version": PLAN_VERSION, "fingerprint": fingerprint, "to": to, "total": total}
    plan["offsets"] = offsets.tolist()
    in_bytes = _input_bytes(sources, offsets, min(total, SAMPLE_RECORDS))
    if to == "parquet":
        from tidal.writers.parquet import infer_schema, to_table

        try:
            schema = infer_schema(sample)
        except ValueError:
            raise TidalError(
                f"{ds!r}: no record in the first {SAMPLE_RECORDS} to take the output's schema from"
            ) from None
        plan["schema"] = schema.serialize().to_pybytes().hex()
        out_bytes = _parquet_bytes([to_table(t, schema) for t in sample], schema)
    else:
        from tidal.formats.tokens import HEADER
        from tidal.writers.tokens import documents, dtype_of

        docs = [d for t in sample for d in documents(t, column)]
        tokenizers = [s for s in walk(stage) if isinstance(s, Tokenize)]
        plan["dtype"] = str(tokenizers[0].tokenizer.dtype) if tokenizers else dtype_of(docs)
        width = np.dtype(plan["dtype"]).itemsize
        out_bytes = HEADER.size / max(1, len(docs)) * got + sum(8 + len(d) * width for d in docs)
    ratio = out_bytes / max(1.0, in_bytes)
    plan["ratio"] = ratio
    plan["ranges"] = cut(sources, ratio, size)
    output.write_text(f"{WORK}/plan.json", json.dumps(plan))
    return plan


def _input_bytes(sources: Sequence[Any], offsets: np.ndarray, n: int) -> float:
    """The estimated input bytes of the first ``n`` source records (each file's bytes spread over its rows)."""
    out, left = 0.0, n
    for s in sources:
        take = min(left, s.rows)
        if take:
            out += s.bytes * take / s.rows
        left -= take
        if left <= 0:
            break
    return out


def _parquet_bytes(tables: list[Any], schema: Any) -> float:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    from tidal.writers.parquet import COMPRESSION

    buf = io.BytesIO()
    pq.write_table(pa.concat_tables(tables) if tables else schema.empty_table(), buf, compression=COMPRESSION)
    return float(buf.tell())


def cut(sources: Sequence[Any], ratio: float, size: int) -> list[list[int]]:
    """Output shard ranges ``[start, stop)`` of source positions, about ``size`` output bytes each.

    A pure function of each source file's rows and bytes: files are taken in order; a file's
    records are spread evenly over its bytes; a shard closes at the record that brings it to
    ``size``, and a file larger than that is cut across several shards.
    """
    ranges: list[list[int]] = []
    start, pos, filled = 0, 0, 0.0
    for s in sources:
        if s.rows == 0:
            continue
        per_row = max(s.bytes * ratio / s.rows, 1e-9)
        row = 0
        while row < s.rows:
            room = size - filled
            take = min(s.rows - row, max(1, int(np.ceil(room / per_row))))
            row, pos, filled = row + take, pos + take, filled + take * per_row
            if filled >= size:
                ranges.append([start, pos])
                start, filled = pos, 0.0
    if pos > start:
        ranges.append([start, pos])
    return ranges


# -- the tasks ------------------------------------------------------------------------------------


def run_task(job: Job, shard: int, on_records: Callable[[int], None] | None = None) -> tuple[int, dict]:
    """Write output shard ``shard``: read its source range through the chain, write, place the file,
    record its entry in the done directory. Returns ``(shard, entry)``; the same in every engine."""
    start, stop = job.ranges[shard]
    name = job.name(shard)
    staging = job.output.staging()
    tmp = staging / f".{name}.{os.getpid()}.tmp"
    writer = _writer(job, tmp)
    pos = start
    exact = _one_per_position(job.stage)
    try:
        for table, after in read_range(job.stage, job.total, start, stop):
            try:
                writer.write(table)
            except (ValueError, TypeError) as exc:  # a record the writer cannot take: name where it came from
                within = getattr(exc, "row", None)
                path, row = job.locate(pos + within if exact and within is not None else pos)
                where = "" if exact and within is not None else f" (one of the {length(table)} records from here)"
                raise RecordError(f"cannot write {name}: {exc}{where}", path=path, row=row) from None
            if on_records is not None:
                on_records(after - pos)
            pos = after
        finished = writer.finish()
    except BaseException:
        writer.abort()
        raise
    entry: dict[str, Any] = {"shard": shard, "range": [start, stop], "rows": 0, "bytes": 0}
    if finished is not None:
        file, facts = finished
        entry.update(facts)
        entry["name"] = name
        entry.update(job.output.place(file, name))
    job.output.write_text(f"{WORK}/done/{shard:05d}.json", json.dumps(entry))
    return shard, entry


def _one_per_position(stage: Stage) -> bool:
    """Whether every source position yields one record (no filter, no bad records skipped)."""
    return not any(isinstance(s, Filter) or (isinstance(s, Read) and s.plan.errors != "raise") for s in walk(stage))


def _writer(job: Job, file: Path) -> Any:
    if job.to == "parquet":
        import pyarrow as pa

        from tidal.writers.parquet import ParquetShardWriter

        assert job.schema is not None
        return ParquetShardWriter(file, pa.ipc.read_schema(pa.py_buffer(job.schema)))
    from tidal.writers.tokens import TokenShardWriter

    assert job.dtype is not None
    return TokenShardWriter(file, job.column, job.dtype)


def _finished(job: Job) -> dict[int, dict]:
    """The shards an earlier run finished: an entry in the done directory and the file still there, at its size."""
    out = {}
    for name in job.output.names(f"{WORK}/done"):
        if not name.endswith(".json"):
            continue
        text = job.output.read_text(f"{WORK}/done/{name}")
        try:
            entry = json.loads(text or "")
            shard = int(entry["shard"])
        except (ValueError, KeyError, TypeError):
            continue
        if not 0 <= shard < len(job.ranges) or entry.get("range") != list(job.ranges[shard]):
            continue
        if entry.get("name"):
            found = job.output.stat(entry["name"])
            if found is None or found[0] != entry["bytes"]:
                continue
        out[shard] = entry
    return out


def _publish(job: Job, entries: list[dict]) -> None:
    """The output's index, once every shard is done: what ``tidal.Dataset(DST)`` reads."""
    kept = [e for e in entries if e.get("name")]
    if job.to == "parquet":
        from tidal.shards import INDEX_NAME

        keep = ("bytes", "mtime_ns", "version", "format", "compression", "rows", "info", "hash")
        shards = {e["name"]: {key: e[key] for key in keep if key in e} for e in kept}
        job.output.write_text(INDEX_NAME, json.dumps({"version": 1, "shards": shards}, separators=(",", ":")))
    else:
        from tidal.formats.tokens import INDEX, VERSION

        fields = ("name", "docs", "tokens", "bytes", "hash")
        shards_list = [{key: e[key] for key in fields} for e in kept]
        index = {"format": "tidal-tokens", "version": VERSION, "dtype": job.dtype, "shards": shards_list}
        job.output.write_text(INDEX, json.dumps(index, indent=1))


# -- processes on this machine ----------------------------------------------------------------------

_job: Job | None = None  # the job of a worker process, sent once when it starts


def _start_worker(job: Job) -> None:
    global _job
    _job = job


def _worker_task(shard: int) -> tuple[int, dict]:
    assert _job is not None
    return run_task(_job, shard)


def _run_processes(job: Job, todo: list[int], workers: int, done: Callable[[tuple[int, dict]], None]) -> None:
    """Tasks in ``workers`` processes started with ``spawn`` (safe beside threads, the same on every OS)."""
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool

    ctx = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(min(workers, len(todo)), mp_context=ctx, initializer=_start_worker, initargs=(job,))
    try:
        pending = {pool.submit(_worker_task, s): s for s in todo}
        while pending:
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for f in finished:
                shard = pending.pop(f)
                try:
                    done(f.result())
                except BrokenProcessPool:
                    raise TidalError(
                        f"a conversion process died (killed, or out of memory) while writing {job.name(shard)}; "
                        "the finished shards are kept: run the same conversion again to go on"
                    ) from None
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


# -- progress ---------------------------------------------------------------------------------------


class _Progress:
    """A tqdm bar of source records on stderr (tqdm is the ``cli`` extra), else a line per shard.

    A task in this process reports its records as it reads them; a task elsewhere (another
    process, a Ray worker) counts when its shard is done."""

    def __init__(self, job: Job, done: dict[int, dict], enabled: bool | None):
        self.job = job
        self.done = dict(done)
        self._counted: dict[int, int] = {}  # records already shown of shards in progress here
        self._bar: Any = None
        self._lines = False
        if enabled is None:
            enabled = sys.stderr.isatty()
        if not enabled:
            return
        try:
            from tqdm import tqdm
        except ImportError:
            self._lines = True
            return
        first = sum(b - a for s, (a, b) in enumerate(job.ranges) if s in done)
        self._bar = tqdm(total=job.total, initial=first, unit="rec", unit_scale=True, desc="convert", file=sys.stderr)
        self._bar.set_postfix_str(self._shards())

    def _shards(self) -> str:
        return f"{len(self.done)}/{len(self.job.ranges)} shards"

    def counter(self, shard: int) -> Callable[[int], None]:
        """What a task in this process calls with the records it has read."""

        def count(n: int) -> None:
            self._counted[shard] = self._counted.get(shard, 0) + n
            if self._bar is not None:
                self._bar.update(n)

        return count

    def shard_done(self, result: tuple[int, dict]) -> None:
        shard, entry = result
        self.done[shard] = entry
        a, b = self.job.ranges[shard]
        if self._bar is not None:
            self._bar.update(b - a - self._counted.pop(shard, 0))
            self._bar.set_postfix_str(self._shards())
        elif self._lines:
            print(f"convert: {self._shards()} ({entry.get('name') or 'no records'})", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


# -- the command line ----------------------------------------------------------------------------


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
        "--ray-address", default=None, help="the Ray cluster to run on (ray.init(address=...)); default a local Ray"
    )
    p.add_argument("--format", default=None, help="the source's format, where its file endings do not tell")
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a progress bar on stderr (default: when stderr is a terminal; tqdm draws it: pip install 'tidal[cli]')",
    )


def run_cli(args: Any) -> int:
    """``tidal convert``: convert, then print what was written."""
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
    )
    print(report)
    return 0
