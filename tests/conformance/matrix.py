"""One cell, end to end: its data written, its pipeline built, run as the cell says, every
invariant checked. :func:`run_cell` returns the findings (empty: the cell conforms).

The runs of a cell:

1. **reference**: every rank's whole pass, states saved along the way: exactly once, bad
   records, values, metrics, nothing left behind;
2. **trace** of each rank's pass from its first state, and ``tidal state verify`` over the
   states (with a loader);
3. **resume** (``same``): the pass cut at the cell's step, resumed in a new loader from the
   state saved there: the same batches, and the trace from that state equals them;
   (``elastic``): cut on the cell's topology, restored on the other one: exactly once over
   both, within the documented remainder of an elastic restore, and the trace of the new
   topology from that state equals its batches.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

import tidal
from conformance import checks, data
from conformance.cells import Cell
from conformance.pipeline import STREAMS, Source, build
from conformance.run import Pass, errors_to, run_ranks

NUM_WORKERS = {"torch0": 0, "fork2": 2, "spawn2": 2, "jax": 2, "jax1": 1, "none": 0}


def write_sources(cell: Cell, tmp: Path, s3: Any = None) -> list[Source]:
    """The cell's corpora (two, disjoint ids, for a mixture), local or uploaded to ``s3``."""
    rng = np.random.default_rng(cell.seed)
    shapes = [cell.shape] + ([cell.mix] if cell.mix is not None else [])
    sources, first = [], 1
    for name, shape in zip(STREAMS, shapes, strict=False):
        corpus = data.write(cell.fmt, tmp / f"{name}-{shape}", shape, rng, first, cell.size)
        first = max(corpus.ids, default=first) + 1
        if cell.storage == "s3" and s3 is not None:
            url = s3.upload(corpus.root, s3.bucket(f"cell-{cell.seed}-{name}-{random.getrandbits(32):08x}"), "data")
            corpus.base = url
            sources.append(Source(corpus, url, s3.options(), tmp / "cache"))
        else:
            sources.append(Source(corpus, str(corpus.root)))
    return sources


def read_errors(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def run_cell(cell: Cell, tmp: Path, s3: Any = None) -> list[str]:
    """Every invariant of ``cell``; what does not hold, one line each (empty: all hold)."""
    findings: list[str] = []
    before = checks.snapshot()
    sources = write_sources(cell, tmp, s3)
    streams = checks.Streams({name: s.corpus for name, s in zip(STREAMS, sources, strict=False)})
    ds = build(cell, sources, data.tokenizer(tmp / "tokenizer.json"))
    try:
        _reference_and_resume(cell, ds, streams, tmp, findings)
    finally:
        del ds
        checks.left_behind(before, findings)
    return findings


def _bad(streams: checks.Streams) -> bool:
    return any(c.bad for c in streams.corpora.values())


def _reference_and_resume(
    cell: Cell, ds: tidal.Dataset, streams: checks.Streams, tmp: Path, findings: list[str]
) -> None:
    loader = cell.loader
    with errors_to(tmp / "errors-reference.jsonl") as log:
        passes = run_ranks(ds, cell, loader, cell.ranks, save_every=3)
    errors = [p.error for p in passes if p.error is not None]
    if cell.errors == "raise" and _bad(streams):
        checks.raised_record_error(cell, streams, errors, findings)
        return
    for e in errors:
        findings.append(f"reference: the loop got {type(e).__name__}: {str(e)[:400]}")
    if errors:
        return
    rows = [row for p in passes for batch in p.batches for row in batch]
    reported = _reported(cell, streams, passes, read_errors(log), findings, "reference")
    checks.exactly_once(cell, streams, rows, reported, findings)
    checks.values(cell, streams, rows, findings)
    if not (cell.filter or cell.packed or cell.mix or _bad(streams)) and len({len(p.batches) for p in passes}) > 1:
        findings.append(f"reference: ranks yield different numbers of batches: {[len(p.batches) for p in passes]}")
    if loader != "none":
        for p in passes:
            checks.metrics_add_up(cell, p, findings, f"reference rank {p.rank}", complete=True,
                                  skipped=_skipped(cell, streams, p, log))  # fmt: skip
        with errors_to(tmp / "errors-replays.jsonl") as replays:
            _trace_and_verify(cell, ds, streams, passes, findings)
        if read_errors(replays):  # the run reported them: a replay only reads them again
            findings.append(f"trace, verify: the errors function was given {len(read_errors(replays))} errors")
    if cell.resume == "same":
        _same(cell, ds, streams, passes, tmp, findings)
    elif cell.resume == "elastic":
        _elastic(cell, ds, streams, passes, tmp, findings)


def _reported(
    cell: Cell, streams: checks.Streams, passes: list[Pass], lines: list[dict], findings: list[str], where: str
) -> Counter | None:
    """How often each bad record was reported in a run: given to the errors function, or (under
    ``"skip"``) counted in ``metrics()["skipped"]``, which names no record: None then."""
    if cell.errors == "function":
        return checks.bad_reports(cell, streams, lines, findings, where)
    if cell.errors == "skip" and _bad(streams):
        skipped = [p.metrics.get("skipped", 0) for p in passes if p.metrics is not None]
        total = sum(len(c.bad) for c in streams.corpora.values()) * cell.epochs
        if sum(skipped) > total and not checks.restarts(cell):
            findings.append(f"{where}: metrics()['skipped'] counts {sum(skipped)}, there are {total} bad records")
        return None
    return Counter()


def _skipped(cell: Cell, streams: checks.Streams, p: Pass, log: Path) -> int | None:
    """What ``metrics()["skipped"]`` of rank ``p.rank``'s pass must be, where the run tells it."""
    if cell.errors != "function":
        return 0 if not _bad(streams) else None
    return None if cell.ranks > 1 else len(read_errors(log))


def _trace_and_verify(
    cell: Cell, ds: tidal.Dataset, streams: checks.Streams, passes: list[Pass], findings: list[str]
) -> None:
    for p in passes:
        first = p.states[min(p.states)]
        steps = _before_weights(cell, 0, len(p.batches))
        try:
            traced = tidal.trace(ds, first, steps=steps, rank=p.rank)
        except Exception as exc:
            findings.append(f"trace of rank {p.rank} from its first state: {type(exc).__name__}: {str(exc)[:300]}")
            continue
        checks.trace_matches(cell, streams, traced, p.batches[:steps], findings, f"trace of rank {p.rank}")
    states = _merged(passes)
    try:
        report = tidal.verify.verify(ds, states)
    except Exception as exc:
        findings.append(f"verify: {type(exc).__name__}: {str(exc)[:300]}")
        return
    checks.verify_clean(report, findings, "verify")


def _merged(passes: list[Pass]) -> list[dict]:
    """The states saved along the pass and at its end, the ranks' merged where there are several
    (at the steps every rank saved one: ranks may end the pass at different steps)."""
    ends = [p.end for p in passes if p.end is not None]
    if len(passes) == 1:
        return [passes[0].states[s] for s in sorted(passes[0].states)] + ends
    common = sorted(set.intersection(*(set(p.states) for p in passes)) - {0})
    return [tidal.state.merge([p.states[s] for p in passes]) for s in common] + [tidal.state.merge(ends)]


def _before_weights(cell: Cell, start: int, batches: int) -> int:
    """Of ``batches`` from step ``start``, those a trace from the state at ``start`` replays: a
    trace knows the weights the state holds, not a ``set_weights`` the loop calls later."""
    if cell.set_weights is not None and cell.set_weights[0] >= start:
        return min(batches, cell.set_weights[0] - start)
    return batches


def _cut(cell: Cell, passes: list[Pass]) -> int:
    return int(cell.at * min(len(p.batches) for p in passes))


def _same(
    cell: Cell, ds: tidal.Dataset, streams: checks.Streams, reference: list[Pass], tmp: Path, findings: list[str]
) -> None:
    """Cut at the cell's step, resumed in a new loader of the same topology: the same batches."""
    k = _cut(cell, reference)
    with errors_to(tmp / "errors-cut.jsonl"):
        cut = run_ranks(ds, cell, cell.loader, cell.ranks, stop=k)
    states = [p.end for p in cut]
    with errors_to(tmp / "errors-resumed.jsonl") as log:
        resumed = run_ranks(ds, cell, cell.loader, cell.ranks, start=k, states=states)
    for r, (ref, a, b) in enumerate(zip(reference, cut, resumed, strict=True)):
        where = f"same-topology resume of rank {r} at batch {k}"
        if a.error or b.error:
            findings.append(f"{where}: the loop got {a.error or b.error!r}")
            continue
        checks.same_batches(ref.batches, a.batches + b.batches, findings, where)
        if cell.loader != "none":
            checks.metrics_add_up(cell, b, findings, f"{where}, resumed", complete=False, skipped=None)
            with errors_to(tmp / "errors-replays.jsonl"):
                try:
                    steps = _before_weights(cell, k, len(b.batches))
                    traced = tidal.trace(ds, states[r], steps=steps, rank=r)
                    checks.trace_matches(cell, streams, traced, b.batches[:steps], findings, f"trace of {where}")
                except Exception as exc:
                    findings.append(f"trace of {where}: {type(exc).__name__}: {str(exc)[:300]}")
    if cell.errors == "function":
        checks.bad_reports(cell, streams, read_errors(log), findings, "same-topology resume")
        in_order = cell.shuffle is None and cell.readers == 1 and cell.epochs == 1 and not (cell.mix or cell.packed)
        if in_order and not any(p.error for p in cut + resumed):
            before = [row for batch in cut[0].batches for row in batch]
            checks.not_reported_again(cell, streams, before, read_errors(log), findings)


def _elastic(
    cell: Cell, ds: tidal.Dataset, streams: checks.Streams, reference: list[Pass], tmp: Path, findings: list[str]
) -> None:
    """Cut on the cell's topology, restored on the other: no record lost or repeated in the epoch."""
    k = _cut(cell, reference)
    with errors_to(tmp / "errors-cut.jsonl"):
        cut = run_ranks(ds, cell, cell.loader, cell.ranks, stop=k)
    where = f"elastic restore at batch {k}: {cell.ranks} x {cell.loader} -> {cell.ranks_after} x {cell.loader_after}"
    if any(p.error for p in cut):
        findings.append(f"{where}: the loop got {[p.error for p in cut if p.error]!r}")
        return
    try:
        state = tidal.state.merge([p.end for p in cut]) if cell.ranks > 1 else cut[0].end
    except Exception as exc:
        findings.append(f"{where}: merging the ranks' states: {type(exc).__name__}: {exc}")
        return
    with errors_to(tmp / "errors-restored.jsonl") as log:
        restored = run_ranks(ds, cell, cell.loader_after, cell.ranks_after, start=k, states=[state] * cell.ranks_after)
    if any(p.error for p in restored):
        findings.append(f"{where}: the loop got {[p.error for p in restored if p.error]!r}")
        return
    rows = [row for p in cut + restored for batch in p.batches for row in batch]
    old = checks.lanes(cell, cell.ranks, cell.loader)
    if cell.errors == "function":  # each bad record reported once by the restored run; those before the
        checks.bad_reports(cell, streams, read_errors(log), findings, where)  # cut were the cut run's
    # which bad records the cut run reported for good is unknown (it reads ahead of what the loop
    # took): bad records are left out of the count (None)
    checks.exactly_once(cell, streams, rows, None, findings, elastic_from=old)
    workers = NUM_WORKERS[cell.loader_after]
    with errors_to(tmp / "errors-replays.jsonl"):
        for p in restored:
            try:
                steps = _before_weights(cell, k, len(p.batches))
                traced = tidal.trace(ds, state, steps=steps, rank=p.rank, world_size=cell.ranks_after,
                                     num_workers=workers)  # fmt: skip
                checks.trace_matches(
                    cell, streams, traced, p.batches[:steps], findings, f"trace of {where}, rank {p.rank}"
                )
            except Exception as exc:
                findings.append(f"trace of {where}, rank {p.rank}: {type(exc).__name__}: {str(exc)[:300]}")
