"""The plan of a conversion: which source positions each output shard holds, fixed before the first is written.

Output shard ``k`` holds source positions ``[start_k, stop_k)`` of the source read in its own
order (:func:`cut`): a pure function of the source's shard list (records and bytes of each
file), the shard size, and the ratio of output to input bytes, measured once on the source's
first records with the same writer. Those records also fix the output's schema (Parquet) or
token dtype (tokens). The plan is saved in ``DST/.tidal-convert/plan.json`` with a fingerprint
of the source and the options: a restart reads it back (the same shards, whatever a new sample
would say), and a restart with another source or other options is refused.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa

from tidal.convert.task import READ_BLOCK, read_range
from tidal.dataset import Dataset
from tidal.errors import ArgumentError, SchemaError, SourceError, StateError
from tidal.stages import Stage, walk
from tidal.stages.read import Read
from tidal.tables import Table, length, records
from tidal.writers.output import WORK, Output

PLAN_VERSION = 1
SAMPLE_RECORDS = 1000  # records that measure the output-to-input ratio and fix the schema or dtype


def chain(ds: Dataset) -> Stage:
    """The dataset's chain over its source unshuffled, one epoch, read in small blocks."""
    for stage in walk(ds.stage):
        if not stage.record_wise():
            raise ArgumentError(
                f"convert writes records: {stage.call()} cannot come in the chain (read, map, filter and tokenize can; "
                "mixing, packing and batching belong to the training pipeline that reads the output)"
            )
    return ds.stage.with_source(lambda read: Read(replace(read.plan, seed=None, epochs=1, block_size=READ_BLOCK)))


def fingerprint(stage: Stage, ds: Dataset, to: str, column: str, size: int, tokenizer: Any) -> str:
    facts: list[Any] = [PLAN_VERSION, stage.describe(), to, column, size]
    facts.append([(s.path, s.rows, s.bytes, s.version) for s in ds.shards])
    for t in [t for s in walk(stage) if (t := s.tokenizer_used()) is not None]:
        backend = t.backend
        text = backend.to_str() if hasattr(backend, "to_str") else repr(backend)
        facts.append(hashlib.sha1(text.encode()).hexdigest())
    return hashlib.sha1(json.dumps(facts, default=str).encode()).hexdigest()[:16]


def load_or_make(stage: Stage, ds: Dataset, to: str, column: str, size: int, output: Output, tokenizer: Any) -> dict:
    """The saved plan where this conversion was started before; else a new one, saved."""
    key = fingerprint(stage, ds, to, column, size, tokenizer)
    saved = output.read_text(f"{WORK}/plan.json")
    if saved is not None:
        try:
            found = json.loads(saved)
        except ValueError:
            found = {}
        if not isinstance(found, dict) or found.get("fingerprint") != key:
            raise StateError(
                f"{output.where(WORK + '/plan.json')}: {output.url} holds a conversion of another source or with other "
                "options; remove it, or convert into another directory"
            )
        return found
    others = [n for n in output.names() if n != WORK]
    if others:
        raise ArgumentError(
            f"{output.url}: not empty ({others[0]}, ...) and not a tidal conversion: convert into a new directory"
        )
    sources = ds.shards
    total = sum(s.rows for s in sources)
    if total == 0:
        raise SourceError(f"{ds!r}: the source has no records to convert")
    offsets = np.concatenate([[0], np.cumsum([s.rows for s in sources])]).astype(np.int64)
    sample: list[Table] = []
    spans: list[tuple[int, int]] = []  # the source positions each table of the sample came from
    got, at = 0, 0
    for table, after in read_range(quietly(stage), total, 0, min(total, SAMPLE_RECORDS)):
        sample.append(table)
        spans.append((at, after))
        got += length(table)
        at = after
    plan: dict[str, Any] = {"version": PLAN_VERSION, "fingerprint": key, "to": to, "total": total}
    plan["offsets"] = offsets.tolist()
    in_bytes = _input_bytes(sources, offsets, min(total, SAMPLE_RECORDS))
    if to == "parquet":
        from tidal.writers.parquet import infer_schema, to_table

        try:
            schema = infer_schema(sample)
        except pa.ArrowException as exc:  # a column of two types (an ArrowInvalid is a ValueError too)
            raise SchemaError(_clash(sample, spans, offsets, sources.paths, stage, exc)) from None
        except ValueError:
            raise SchemaError(
                f"{ds!r}: no record in the first {SAMPLE_RECORDS} to take the output's schema from"
            ) from None
        plan["schema"] = schema.serialize().to_pybytes().hex()
        out_bytes = _parquet_bytes([to_table(t, schema) for t in sample], schema)
    else:
        from tidal.formats.tokens import HEADER
        from tidal.writers.tokens import documents, dtype_of

        docs = [d for t in sample for d in documents(t, column)]
        tokenizers = [t for s in walk(stage) if (t := s.tokenizer_used()) is not None]
        plan["dtype"] = str(tokenizers[0].dtype) if tokenizers else dtype_of(docs)
        width = np.dtype(plan["dtype"]).itemsize
        out_bytes = HEADER.size / max(1, len(docs)) * got + sum(8 + len(d) * width for d in docs)
    ratio = out_bytes / max(1.0, in_bytes)
    plan["ratio"] = ratio
    plan["ranges"] = cut(sources, ratio, size)
    output.write_text(f"{WORK}/plan.json", json.dumps(plan))
    return plan


def quietly(stage: Stage) -> Stage:
    """The chain with its source's bad records skipped without a word, for the sample: what the
    policy says of them (raise, or log and count) is said once, by the task that writes them.
    Under ``errors="raise"``, as it is: the first bad record stops the conversion before it starts."""

    def quiet(read: Read) -> Read:
        return read if read.plan.errors == "raise" else Read(replace(read.plan, errors=_skip))

    return stage.with_source(quiet)


def _skip(error: Exception) -> None:
    """An errors policy that skips and says nothing (the task that writes the record says it)."""


def _clash(
    sample: list[Table],
    spans: list[tuple[int, int]],
    offsets: np.ndarray,
    paths: Sequence[str],
    stage: Stage,
    exc: Exception,
) -> str:
    """What a sample whose tables do not make one schema holds: the first column whose values are
    of two types, and the files and rows of the first of each."""
    from tidal.convert.task import one_per_position

    exact = one_per_position(stage)
    seen: dict[str, dict[str, str]] = {}  # column -> kind -> where its first value of that kind is
    for table, (start, stop) in zip(sample, spans, strict=True):
        for i, record in enumerate(records(table)):
            if not isinstance(record, dict):
                continue
            where = _where(start + i if exact else start, offsets, paths, exact or stop - start == 1)
            for name, value in record.items():
                if value is None:
                    continue
                kinds = seen.setdefault(name, {})
                kinds.setdefault(_kind(value), where)
                if len(kinds) > 1:
                    (a, at_a), (b, at_b) = list(kinds.items())[:2]
                    return (
                        f"column {name!r} holds {a} ({at_a}) and {b} ({at_b}): a Parquet column holds one type; "
                        f"convert the files apart, leave the column out (columns=), or make it one type first "
                        f"(a map(); for CSV files, format_options={{'column_types': {{{name!r}: 'string'}}}}, "
                        f"on the command line --format-option column_types.{name}=string)"
                    )
    return f"the source's records do not make one schema: {exc}"


def _kind(value: Any) -> str:
    """What a value is, as a column's type tells it: numbers are one kind (they promote)."""
    if isinstance(value, bool):
        return "booleans"
    if isinstance(value, (int, float, np.number)):
        return "numbers"
    return {"str": "text", "bytes": "bytes", "list": "lists", "dict": "structs"}.get(
        type(value).__name__, type(value).__name__
    )


def _where(position: int, offsets: np.ndarray, paths: Sequence[str], exact: bool) -> str:
    """The file (and row, where ``exact``) of a source position."""
    i = max(0, min(int(np.searchsorted(offsets, position, side="right")) - 1, len(paths) - 1))
    return (
        f"{paths[i]}, row {position - int(offsets[i])}"
        if exact
        else f"{paths[i]}, near row {position - int(offsets[i])}"
    )


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
