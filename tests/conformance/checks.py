"""The invariants tidal promises, checked on what a cell's runs yielded.

Each check compares what the loaders yielded with what was written (:mod:`conformance.data`),
never with what tidal says about itself, and appends what it finds wrong to ``findings``
(a list of lines), so that one run of a cell reports every broken promise at once:

- **exactly once**: every record of an epoch read once over ranks x workers, but for the
  documented remainder (docs/distributed.md: the last ``N % readers`` positions of each epoch;
  with ``drop_last`` each reader's last incomplete batch; for packed rows the last part of a
  sequence; after an elastic restore, docs/resumption.md: the document in progress of each
  old reader under ``pack("concat")``, the buffer in progress, read again, under
  ``"best_fit"``); a mixture that stops at its first exhausted stream reads no record twice;
- **bad records**: under ``errors="skip"`` each counted once (``metrics()["skipped"]``), under a
  function each given to it once, under ``"raise"`` a RecordError naming the file and line/row;
- **values**: every row holds what was written (text, ids, optional fields, the map's mark);
- **resume**: a same-topology resume yields the same batches as the uninterrupted run;
- **trace**: ``tidal.trace`` rebuilt from the files equals the batches, token for token;
- **metrics**: ``records``, ``tokens`` and ``batches`` are what the loop got, and the streams'
  counts add up to them;
- **verify**: ``tidal state verify`` is clean over the run's states;
- **nothing left**: no process, thread or ``/dev/shm`` segment outlives the loop.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any

from conformance.cells import WORKERS, Cell
from conformance.data import EOS, TOKEN_FORMATS, Corpus, document, length, meta_of, text_of
from conformance.pipeline import ident, kept
from conformance.run import Pass, Row

MAX_DOC = 9  # tokens of the longest record, EOS left out


# -- what rows hold ------------------------------------------------------------------------------


def real_tokens(row: Row) -> list[int]:
    """A packed row's tokens but best-fit padding (segment id 0)."""
    ids = row["input_ids"]
    segments = row.get("segment_ids")
    return ids if segments is None else [t for t, s in zip(ids, segments, strict=True) if s != 0]


def tokens_in(row: Row, cell: Cell) -> int:
    """The tokens of a row as metrics count them."""
    if "input_ids" not in row:
        return 0
    return len(real_tokens(row)) if cell.packed else len(row["input_ids"])


class Streams:
    """The cell's corpora by stream name, and where a file or an id belongs."""

    def __init__(self, corpora: dict[str, Corpus]):
        self.corpora = corpora
        self.owner = {i: name for name, c in corpora.items() for i in c.ids}

    def corpus_of_file(self, path: str) -> Corpus:
        for c in self.corpora.values():
            try:
                c.name_of(path)
                return c
            except KeyError:
                continue
        raise KeyError(path)

    def record_at(self, path: str, row: int) -> int | None:
        c = self.corpus_of_file(path)
        return c.at(c.name_of(path), row)


# -- exactly once --------------------------------------------------------------------------------


def remainder(cell: Cell, corpus: Corpus, readers: int) -> int:
    """Positions of each epoch no reader reads: the last ``N % readers`` (docs/distributed.md)."""
    return corpus.records % readers


def lanes(cell: Cell, ranks: int, loader: str) -> int:
    """Readers of an epoch: ranks x workers, or ranks x rows for continuous rows."""
    return ranks * (cell.batch or 1) if cell.continuous else ranks * WORKERS[loader]


def exactly_once(
    cell: Cell,
    streams: Streams,
    rows: list[Row],
    reported: Counter | None,
    findings: list[str],
    *,
    elastic_from: int | None = None,
) -> None:
    """Every record of the epochs once (tokens, for packed rows), bad ones reported once, within
    the documented remainder; ``reported``: per ``(corpus, file, row)``, how often a bad record was
    reported (None where the run cannot tell: then bad records are left out)."""
    readers = lanes(cell, cell.ranks_after if elastic_from else cell.ranks,
                    cell.loader_after if elastic_from else cell.loader)  # fmt: skip
    E = cell.epochs
    b = cell.batch or 1
    want: Counter = Counter()  # per id: how often (records) or how many tokens, over the pass
    for c in streams.corpora.values():
        for i in c.ids:
            if not cell.filter or kept(i):
                want[i] = E * (length(i) if cell.packed else 1)
    got: Counter = Counter()
    if cell.packed:
        for row in rows:
            got.update(t for t in real_tokens(row) if t != EOS)
    else:
        got.update(ident(row) for row in rows)

    foreign = sorted(set(got) - set(want))
    if foreign:
        findings.append(
            f"exactly once: rows hold ids that are not records of the pass (or were filtered): {foreign[:8]}"
        )
    mixed_repeat = restarts(cell)
    extra = {i: got[i] - want[i] for i in want if got[i] > want[i]}
    allowed_extra = 0
    if elastic_from and cell.pack == "best_fit":  # each old reader's buffer in progress is packed again
        allowed_extra = elastic_from * best_fit_buffer(cell)
    if extra and not mixed_repeat and sum(extra.values()) > allowed_extra:
        what = "tokens" if cell.packed else "reads"
        findings.append(
            f"exactly once: read more than once ({what} beyond the epochs' count, id: extra): "
            f"{dict(sorted(extra.items())[:8])} ({sum(extra.values())} in all)"
        )
    if cell.mix is not None and cell.stop == "first_exhausted":
        return  # a mixture that stops reads part of its streams: no record twice is all that holds
    if cell.continuous:
        return  # rows end with the shortest of them: what the others had left is not bounded

    missing = sum(max(0, want[i] - got[i]) for i in want)
    bad_missing = 0
    if reported is not None:
        for c in streams.corpora.values():
            for name, r in c.bad:
                bad_missing += max(0, E - reported[(c.root.name, name, r)])
    unit = MAX_DOC if cell.packed else 1
    rem = sum(remainder(cell, c, readers) for c in streams.corpora.values()) * E
    bound = rem * unit
    if cell.packed:
        bound += readers * (cell.seq_len + MAX_DOC)  # each reader's last part of a sequence
    if cell.drop_last and cell.batch:
        bound += readers * (b - 1) * (cell.seq_len if cell.packed else 1)
    if elastic_from:
        old = elastic_from  # the readers before, which left part of the epoch; the new ones split it
        bound += len(streams.corpora) * E * (old + readers) * unit  # equally, but for fewer than there are
        if cell.pack == "concat":
            bound += old * MAX_DOC  # the document in progress counts as used
        if cell.packed:
            bound += old * (cell.buffer_size + 2) * cell.seq_len
    lost = missing + bad_missing * unit
    if lost > bound:
        what = "tokens" if cell.packed else "records"
        examples = sorted(i for i in want if got[i] < want[i])[:8]
        findings.append(
            f"exactly once: {missing} {what} never read and {bad_missing} bad record(s) never reported, "
            f"more than the documented remainder ({bound}); e.g. ids {examples}"
        )


def best_fit_buffer(cell: Cell) -> int:
    """The most tokens a best-fit buffer holds (docs/resumption.md): documents pulled until they hold
    ``buffer_size * seq_len`` tokens, never more at a time than would hold what is left were each
    ``seq_len`` tokens long (or as long as the buffer's longest yet). Documents no longer than
    ``seq_len`` overshoot by the last one's tokens but one; longer ones (``seq_len`` 4) by up to the
    ratio of their length to ``seq_len``."""
    doc = MAX_DOC + 1  # a document's tokens with its EOS
    budget = cell.buffer_size * cell.seq_len
    if doc <= cell.seq_len:
        return budget - 1 + doc
    return budget * doc // cell.seq_len + doc


def restarts(cell: Cell) -> bool:
    """Whether a stream can be read again in the pass: a mixture that stops at its last exhausted
    stream restarts the others (their next epoch) until then."""
    return cell.mix is not None and cell.stop == "all_exhausted"


def bad_reports(cell: Cell, streams: Streams, lines: Iterable[dict], findings: list[str], where: str) -> Counter:
    """The errors function's calls, per bad record; each must name a bad record, once an epoch."""
    seen: Counter = Counter()
    for e in lines:
        try:
            c = streams.corpus_of_file(e["path"])
            name = c.name_of(e["path"])
        except KeyError:
            findings.append(f"{where}: the errors function got an error naming no file of the data: {e}")
            continue
        if e["type"] != "RecordError" or e["row"] is None or c.at(name, e["row"]) is not None:
            findings.append(f"{where}: the errors function got {e['type']} for {name} row {e['row']}, not a bad record")
            continue
        seen[(c.root.name, name, e["row"])] += 1  # streams' files may have the same names
    twice = {k: n for k, n in seen.items() if n > cell.epochs}
    if twice and not restarts(cell):
        findings.append(f"{where}: the errors function got a bad record more than once an epoch: {twice}")
    return seen


def not_reported_again(
    cell: Cell, streams: Streams, before: list[Row], lines: Iterable[dict], findings: list[str]
) -> None:
    """Resumed in order by one reader, no bad record the run before the cut had passed (one before
    the last record it yielded, in file order) is reported again: the state is past it."""
    corpus = streams.corpora["a"]
    order = {(name, r): (f, r) for f, (name, rows) in enumerate(corpus.files.items()) for r in range(len(rows))}
    where = {i: order[(name, r)] for name, rows in corpus.files.items() for r, i in enumerate(rows) if i is not None}
    passed = max((where[ident(row)] for row in before if ident(row) in where), default=None)
    if passed is None:
        return
    again = sorted(
        (e["path"].rsplit("/", 1)[-1], e["row"])
        for e in lines
        if e["row"] is not None and order.get((corpus.name_of(e["path"]), e["row"]), (1 << 30, 0)) < passed
    )
    if again:
        findings.append(f"resume: bad records the run had passed before its state were reported again: {again}")


# -- what rows hold ------------------------------------------------------------------------------


def values(cell: Cell, streams: Streams, rows: list[Row], findings: list[str]) -> None:
    """Every unpacked row holds its record as written (and the map's mark, where mapped)."""
    if cell.packed:
        for row in rows:
            if len(row["input_ids"]) != cell.seq_len:
                findings.append(f"values: a packed row of {len(row['input_ids'])} tokens, not {cell.seq_len}")
                return
        return
    for row in rows:
        i = ident(row)
        name = streams.owner.get(i)
        if name is None:
            continue  # exactly_once names it
        corpus = streams.corpora[name]
        wrong = []
        if "input_ids" in row:
            want = [i] * length(i) + ([EOS] if cell.tokenize else [])
            if list(row["input_ids"]) != want:
                wrong.append(f"input_ids {row['input_ids']}")
        for key in ("text", "txt"):
            if key in row and row[key] != text_of(i):
                wrong.append(f"{key} {row[key]!r}")
        if "meta" in row:
            want_meta = meta_of(i) if corpus.optional else None
            if corpus.fmt == "csv" and want_meta is None and corpus.optional:
                want_meta = ""  # an empty CSV field of a text column is "" (docs/formats.md)
            if row["meta"] != want_meta:
                wrong.append(f"meta {row['meta']!r} (expected {want_meta!r})")
        if cell.map and row.get("mapped") != 1:
            wrong.append("no mark of the map")
        if wrong:
            findings.append(f"values: record {i}: " + ", ".join(wrong))
            return


# -- resume, trace, metrics, verify --------------------------------------------------------------


def same_batches(want: list[list[Row]], got: list[list[Row]], findings: list[str], where: str) -> None:
    if got == want:
        return
    for n, (w, g) in enumerate(zip(want, got, strict=False)):
        if w != g:
            findings.append(f"{where}: batch {n} differs: {_short(g)} != {_short(w)}")
            return
    findings.append(f"{where}: {len(got)} batches, expected {len(want)}")


def _short(batch: list[Row]) -> str:
    text = repr([{k: v for k, v in row.items() if k in ("id", "input_ids", "cls", "text")} for row in batch[:3]])
    return text[:300]


def trace_matches(
    cell: Cell,
    streams: Streams,
    traced: list[list[list[dict]]],
    batches: list[list[Row]],
    findings: list[str],
    where: str,
) -> None:
    """The rows rebuilt from the trace's segments (read from the corpus) are the rows yielded."""
    if len(traced) != len(batches):
        findings.append(f"{where}: trace gives {len(traced)} batches, the loader yielded {len(batches)}")
    for n, (tb, batch) in enumerate(zip(traced, batches, strict=False)):
        if len(tb) != len(batch):
            findings.append(f"{where}: batch {n}: trace gives {len(tb)} rows, the batch has {len(batch)}")
            return
        for j, (segments, row) in enumerate(zip(tb, batch, strict=True)):
            try:
                if cell.packed:
                    rebuilt = [t for s in segments for t in document(_id(streams, s))[s["start"] : s["end"]]]
                    if rebuilt != real_tokens(row):
                        findings.append(
                            f"{where}: batch {n} row {j}: trace rebuilds {rebuilt}, the row holds {real_tokens(row)}"
                        )
                        return
                else:
                    if len(segments) != 1 or segments[0]["start"] is not None:
                        findings.append(f"{where}: batch {n} row {j}: an unpacked row traced as {segments}")
                        return
                    if _id(streams, segments[0]) != ident(row):
                        findings.append(
                            f"{where}: batch {n} row {j}: trace names record {_id(streams, segments[0])}, the row holds {ident(row)}"
                        )
                        return
            except KeyError as exc:
                findings.append(f"{where}: batch {n} row {j}: trace names {exc}, not a file or row of the data")
                return


def _id(streams: Streams, segment: dict) -> int:
    i = streams.record_at(segment["file"], segment["row"])
    if i is None:
        raise KeyError(f"bad record {segment['file']} row {segment['row']}")
    return i


def metrics_add_up(
    cell: Cell, p: Pass, findings: list[str], where: str, *, complete: bool, skipped: int | None
) -> None:
    """``metrics()`` counts what the loop received, and the streams' counts add up to it."""
    m = p.metrics
    if m is None:
        return
    rows = [row for batch in p.batches for row in batch]
    want = {"batches": len(p.batches), "records": len(rows), "tokens": sum(tokens_in(r, cell) for r in rows)}
    for key, value in want.items():
        if m.get(key) != value:
            findings.append(f"{where}: metrics()[{key!r}] is {m.get(key)}, the loop got {value}")
    if cell.mix is not None:
        records = sum(v for key, v in m.items() if key.startswith("records/"))
        tokens = sum(v for key, v in m.items() if key.startswith("tokens/"))
        tokens_mixed = cell.tokenize_before_mix or cell.fmt in TOKEN_FORMATS
        if not cell.packed:
            if records != m["records"]:
                findings.append(f"{where}: Σ records/<stream> = {records}, records = {m['records']}")
            if tokens_mixed and tokens != m["tokens"]:
                findings.append(f"{where}: Σ tokens/<stream> = {tokens}, tokens = {m['tokens']}")
        elif tokens_mixed:
            ahead = lanes(cell, 1, cell.loader) * 256 * (MAX_DOC + 1)  # a packer's documents read ahead
            if not m["tokens"] <= tokens <= m["tokens"] + ahead:
                findings.append(
                    f"{where}: Σ tokens/<stream> = {tokens}, tokens = {m['tokens']} (packed: at most {ahead} ahead)"
                )
    if complete and skipped is not None and m.get("skipped") != skipped:
        findings.append(f"{where}: metrics()['skipped'] is {m.get('skipped')}, the errors function was given {skipped}")


def verify_clean(report: Any, findings: list[str], where: str) -> None:
    if not report.ok:
        findings.append(f"{where}: tidal state verify: " + " | ".join(report.lines()[-6:]))


def raised_record_error(cell: Cell, streams: Streams, errors: list[BaseException], findings: list[str]) -> None:
    """Under ``errors="raise"``, a bad record stops the run with a RecordError naming its file and line/row."""
    import tidal

    bad = [(c, name, r) for c in streams.corpora.values() for name, r in c.bad]
    if not errors:
        positions = sum(c.records % lanes(cell, cell.ranks, cell.loader) for c in streams.corpora.values())
        if len(bad) > positions * cell.epochs:
            findings.append("raise: a pass over bad records ended without an error")
        return
    for exc in errors:
        if not isinstance(exc, tidal.RecordError):
            findings.append(f"raise: the loop got {type(exc).__name__}: {str(exc)[:300]}, not a RecordError")
            continue
        text = str(exc)
        named = [(c, name, r) for c, name, r in bad if name in text and _where(c, r) in text]
        if not named:
            findings.append(f"raise: the RecordError names no bad record as file and line/row: {text[:300]}")


def _where(corpus: Corpus, row: int) -> str:
    """How a RecordError names row ``row`` of a file of ``corpus``: its line, or its row."""
    if corpus.fmt in ("jsonl", "jsonl.zst", "text"):
        return f"line {row + 1}"
    if corpus.fmt == "csv":
        return f"line {row + 2}"  # after the header
    return f"row {row}"


# -- nothing left behind -------------------------------------------------------------------------

# one closer thread per process, by design (tidal/closing.py); fsspec's event loop for async
# filesystems (s3fs) and its executor, one per process for its lifetime
PERSISTENT_THREADS = ("tidal-close", "fsspecIO", "asyncio_")
# multiprocessing's own helpers, one per process for its lifetime: not a loader's
KEPT_PROCESSES = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


def _children(pid: int) -> set[int]:
    out: set[int] = set()
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    parents: dict[int, int] = {}
    for e in entries:
        if not e.isdigit():
            continue
        try:
            with open(f"/proc/{e}/stat") as f:
                stat = f.read()
            state, ppid = stat.rsplit(")", 1)[1].split()[:2]
            if state != "Z":
                parents[int(e)] = int(ppid)
        except (OSError, ValueError, IndexError):
            continue
    frontier = {pid}
    while frontier:
        frontier = {c for c, p in parents.items() if p in frontier} - out
        out |= frontier
    return out


def snapshot() -> dict[str, set]:
    """This process's children, threads and shared-memory segments now."""
    shm = set()
    if os.path.isdir("/dev/shm"):
        shm = {n for n in os.listdir("/dev/shm") if n.startswith(f"psm_tidal_{os.getpid()}_")}
    threads = {t.ident for t in threading.enumerate() if t.is_alive() and not t.name.startswith(PERSISTENT_THREADS)}
    return {"processes": _children(os.getpid()), "threads": threads, "segments": shm}


def left_behind(before: dict[str, set], findings: list[str], patience_s: float = 15.0) -> None:
    """What the cell started and did not end: waited for up to ``patience_s`` (workers exit as
    their loader's iterator is dropped), then named."""
    import gc

    deadline = time.monotonic() + patience_s
    while True:
        gc.collect()
        now = snapshot()
        new = {k: now[k] - before[k] for k in now}
        if not any(new.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    new["processes"] = {p for p in new["processes"] if not any(k in _cmdline(p) for k in KEPT_PROCESSES)}
    if new["processes"]:
        findings.append(f"left behind: processes {sorted(new['processes'])}: {[_cmdline(p) for p in new['processes']]}")
    if new["threads"]:
        names = [t.name for t in threading.enumerate() if t.ident in new["threads"]]
        findings.append(f"left behind: threads {names}")
    if new["segments"]:
        findings.append(f"left behind: /dev/shm segments {sorted(new['segments'])}")


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return re.sub(rb"\0", b" ", f.read()).decode(errors="replace")[:120]
    except OSError:
        return "?"
