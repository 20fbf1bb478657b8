"""``tidal state verify``: a finished run's states replayed, records read twice or never.

A run saves loader states as it goes (every k steps). Each state is a position, and the order
is a pure function of the position, so the batches every rank took between two consecutive
states can be made again without the model (:class:`tidal.provenance.Replay`): from the start
of the run to the first state, then from each state to the next, on the topology the later
state was saved on (so an elastic restart between them is replayed as the run made it).

Two things are checked:

- **continuity**: replayed from state ``i`` for as many batches as the rank took before state
  ``i + 1``, each of the rank's readers must be exactly where state ``i + 1`` puts it. Where it
  is not, the replay goes on looking for it: found further on, the batches between were never
  read (a *gap*, named record by record); not found, state ``i + 1`` does not follow from state
  ``i`` (a *break*: it was moved back, or is of another run);
- **no record twice**: every record (and, for packed rows, every token range of a document)
  is read once per epoch over all ranks; one read twice is a *duplicate*, named with the ranks
  and steps that read it.

Mixture weights set during the run (``loader.set_weights``) are set again in the replay, at the
step they were set: each state holds the calls made since the state before it
(:mod:`tidal.state.calls`). Where a state holds fewer than were made since the state before it
in the list (a state taken between them is missing, or more than it keeps were made), that
stretch cannot be replayed, and says so.

Batches skipped with ``tidal state skip`` (the state it writes counts them, ``skipped_batches``)
are the first batches after the state they were skipped from: give the state ``skip`` wrote in
its place among the others, and they are reported as skipped, not as read, and are not an
error. (A state saved after resuming from it no longer says so: without the skipped state in
the list, those batches count as read.)
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tidal.errors import StateError
from tidal.provenance import Replay, Step, as_saved, load_state
from tidal.state import calls as weight_calls
from tidal.state import keys as k
from tidal.state.schema import check_layout

if TYPE_CHECKING:
    from pathlib import Path

    from tidal.dataset import Dataset

__all__ = ["Report", "verify"]

SEARCH = 10_000  # batches a replay goes on looking for a state it did not reach (within its pass)


@dataclass
class Report:
    """What :func:`verify` found; ``ok`` when there is no duplicate, gap or break.

    ``duplicates``: ``{"epoch", "file", "row", "stream", "reads": [{"rank", "pass", "step", "start", "end"}]}``;
    ``gaps``: ``{"rank", "state", "name", "batches", "records": [segment, ...]}``: records never
    read before state ``state`` (an index into the states in step order), named ``name``;
    ``breaks``: lines saying which state does not follow from the one before it on which rank;
    ``skipped``: ``{"rank", "state", "name", "batches", "records"}``;
    ``left_out``: ``{"source", "epoch", "records", "of"}``: per epoch the replay went through
    whole, the records no batch held by design, not an error: what ``drop_last`` drops (each
    reader's last partial batch), the remainder of an epoch that does not split evenly over the
    readers, records a filter drops or skipped as bad.
    """

    batches: int = 0  # replayed
    reads: int = 0  # segments read: a record, or the piece of a document a packed row holds
    duplicates: list[dict] = field(default_factory=list)
    gaps: list[dict] = field(default_factory=list)
    breaks: list[str] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)
    left_out: list[dict] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.duplicates or self.gaps or self.breaks)

    def lines(self) -> list[str]:
        """The report as text, one finding a line, the verdict last."""
        out = []
        for b in self.breaks:
            out.append(f"break: {b}")
        for g in self.gaps:
            out.append(
                f"never read: rank {g['rank']}, {g['batches']} batch(es) before {g['name']}, "
                f"{len(g['records'])} record(s):"
            )
            out += [f"  {_where(s)}" for s in g["records"]]
        for d in self.duplicates:
            reads = ", ".join(f"rank {r['rank']} step {r['step']}" + _range(r) for r in d["reads"])
            out.append(f"read twice: epoch {d['epoch']}: {_where(d)}: {reads}")
        for s in self.skipped:
            out.append(
                f"skipped on purpose (tidal state skip): rank {s['rank']}, {s['batches']} batch(es) before "
                f"{s['name']}, {len(s['records'])} record(s)"
            )
        for d in self.left_out:
            source = f"source {d['source'][:-1]}, " if d["source"] else ""
            out.append(
                f"in no batch ({source}epoch {d['epoch']}, finished): {d['records']} of its {d['of']} records "
                "(drop_last's partial last batches, an uneven split over the readers, filters, records skipped as bad)"
            )
        verdict = "exactly once" if self.ok else "NOT exactly once"
        left_out = sum(d["records"] for d in self.left_out)
        out.append(
            f"{verdict}: {self.batches} batches replayed, {self.reads} records or document pieces read, {len(self.duplicates)} read "
            f"twice, {sum(len(g['records']) for g in self.gaps)} never read, {len(self.breaks)} break(s)"
            + (f"; {left_out} in no batch of a finished epoch, by design (drop_last...)" if left_out else "")
        )
        return out


def _where(segment: dict) -> str:
    stream = f" (stream {segment['stream']})" if segment.get("stream") else ""
    return f"{segment['file']} row {segment['row']}{stream}" + _range(segment)


def _range(read: dict) -> str:
    return f" tokens [{read['start']}, {read['end']})" if read.get("start") is not None else ""


def verify(
    dataset: Dataset,
    states: Sequence[dict | str | Path],
    *,
    from_start: bool = True,
    batch_size: int | None = None,
    drop_last: bool = False,
) -> Report:
    """Replay a run from its saved states and report records read twice or never, per rank and
    epoch (see :mod:`tidal.verify`). The states (dicts, or paths of their JSON files) are taken
    in step order: sorted by pass and batches consumed, so a glob's order does not matter (ties
    keep the order given). ``from_start``: also replay from the start of the run to the first
    state (not possible where the first state was itself restored from another topology: then
    the check starts at it). Findings name each state by its path, or as ``states[i]``. States of
    a ``tidal.DataLoader(dataset, batch_size=n)`` replay ``dataset`` batched as that loader
    batched it (``batch_size``/``drop_last``, or found from the states, as :func:`tidal.trace` does).

    >>> report = tidal.verify.verify(ds, glob.glob("run/state-*.json"))
    >>> report.ok, report.lines()[-1]
    """
    named = [(str(s) if not isinstance(s, dict) else f"states[{i}]", load_state(s)) for i, s in enumerate(states)]
    if not named:
        raise StateError("no states to verify")
    dataset = as_saved(dataset, named[0][1], batch_size, drop_last)
    for name, state in named:
        check_layout(state, name)
        try:
            for r, rank in enumerate(state[k.RANKS]):
                if rank is not None:
                    Replay(dataset, state, r).check()
        except StateError as exc:
            raise StateError(f"{name}: {exc}") from None
    named.sort(key=lambda ns: (ns[1][k.PASS], max((r[k.COUNTS][k.BATCHES] for r in ns[1][k.RANKS] if r), default=0)))
    names = [name for name, _ in named]
    loaded = [state for _, state in named]
    report = Report()
    reads: dict[tuple, list[dict]] = defaultdict(list)
    previous: dict | None = None
    start = 0
    if not from_start or loaded[0].get(k.ORIGIN) is not None:
        previous, start = loaded[0], 1
    for i in range(start, len(loaded)):
        _boundary(dataset, previous, loaded[i], names, i, report, reads)
        previous = loaded[i]
    for (_, epoch, file, row), got in sorted(reads.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][3])):
        if len(got) > 1 and _overlap(got):
            report.duplicates.append(
                {"epoch": epoch, "file": file, "row": row, "stream": got[0]["stream"], "reads": got}
            )
    report.left_out = _left_out(loaded[0] if start else None, loaded[-1], reads)
    return report


def _left_out(first: dict | None, last: dict, reads: dict) -> list[dict]:
    """Per source and epoch replayed whole (from ``first``, None: the start of the run, to the
    epoch ``last`` is in), the records of the epoch that no batch held."""
    held: dict[tuple[str, int], int] = defaultdict(int)
    for source, epoch, _, _ in reads:  # each (source, epoch, file, row) once
        held[(source, epoch)] += 1
    out = []
    for key, at in (last.get(k.PROGRESS) or {}).items():
        if k.EPOCH not in at:
            continue  # a mixture's draws: its streams' epochs are counted
        start = 0
        if first is not None:
            begun = ((first.get(k.PROGRESS) or {}).get(key)) or {}
            if k.EPOCH not in begun:
                continue  # where the check started is unknown for this source
            start = max([int(begun[k.EPOCH]) - 1, *map(int, begun.get(k.DONE) or {})]) + 1
        total = last[k.SOURCES][key][k.RECORDS]
        for epoch in range(start, int(at[k.EPOCH])):
            missing = total - held[(key, epoch)]
            if missing > 0:
                out.append({"source": key, "epoch": epoch, "records": missing, "of": total})
    return out


def _overlap(got: list[dict]) -> bool:
    """Whether reads of one record overlap: two whole reads, or token ranges sharing a token."""
    if any(r["start"] is None for r in got):
        return True
    spans = sorted((r["start"], r["end"]) for r in got)
    return any(b[0] < a[1] for a, b in itertools.pairwise(spans))


def _boundary(
    dataset: Dataset, previous: dict | None, target: dict, names: list[str], index: int, report: Report, reads: dict
) -> None:
    """Replay every rank of ``target``'s topology from ``previous`` to ``target``."""
    ranks, workers = target[k.TOPOLOGY]
    skipped = target.get(k.SKIPPED_BATCHES, 0) - (previous or {}).get(k.SKIPPED_BATCHES, 0)
    calls = _calls_between(previous, target)
    if calls is None:
        before = names[index - 1] if previous is not None else "the start of the run"
        made, kept = _total(target) - _total(previous), len(target[k.WEIGHT_CALLS][k.CALLS])
        report.breaks.append(
            f"{names[index]} cannot be replayed from {before}: set_weights() was called {made} times between "
            f"them, and it holds the last {kept} (the calls since the state_dict() before it, at most "
            f"{weight_calls.KEPT}): give every state the run took"
        )
        return
    for r in range(ranks):
        goal_rank = target[k.RANKS][r]
        if goal_rank is None:
            raise StateError(
                f"{names[index]} lacks rank {r}: verifying needs every rank's state "
                "(save under torch.distributed, or combine the ranks' files with tidal.state.merge)"
            )
        replay = Replay(dataset, previous, r, ranks, workers, positions=True)
        goal = (target[k.PASS], goal_rank[k.COUNTS][k.BATCHES])
        if (replay.pass_, replay.step) > goal:
            report.breaks.append(
                f"{names[index]} is behind {names[index - 1]} on rank {r} (pass {goal[0]} step {goal[1]}, "
                f"after pass {replay.pass_} step {replay.step})"
            )
            continue
        steps = _Steps(replay)
        taken = 0
        todo = list(calls)
        while (replay.pass_, replay.step) < goal and not steps.done:
            while todo and (todo[0][0], todo[0][1]) <= (replay.pass_, replay.step):
                steps.switch(todo.pop(0)[2])  # set_weights after this many batches: as the loader, read on under them
            step = steps.next()
            if step is None:
                continue  # a pass ended: the next one starts
            if taken < skipped:
                _skip(report, r, index, names[index], step)
            else:
                _read(report, reads, r, step)
            taken += 1
        if _at(replay, goal_rank):
            continue
        lost: list[Step] = []
        found = False
        while len(lost) < SEARCH and not found:  # further on, in the same pass?
            step = steps.next()
            if step is None:
                break
            lost.append(step)
            found = _at(replay, goal_rank)
        if found:
            segments = [seg for s in lost for row in s.segments() for seg in row]
            report.gaps.append(
                {"rank": r, "state": index, "name": names[index], "batches": len(lost), "records": segments}
            )
        else:
            before = names[index - 1] if previous is not None else "the start of the run"
            report.breaks.append(
                f"{names[index]} does not follow from {before} on rank {r}: replayed to pass {goal[0]} step "
                f"{goal[1]}, the readers are not where it puts them (moved back, edited, or another run's)"
            )


def _total(state: dict | None) -> int:
    """set_weights calls of the run up to ``state``."""
    return int(((state or {}).get(k.WEIGHT_CALLS) or {}).get(k.TOTAL, 0))


def _calls_between(previous: dict | None, target: dict) -> list | None:
    """The set_weights calls made between two states, oldest first (``[pass, batches, weights]``);
    None where ``target`` does not hold them all."""
    made = _total(target) - _total(previous)
    if made <= 0:
        return []
    held = (target.get(k.WEIGHT_CALLS) or {}).get(k.CALLS, [])
    return held[-made:] if made <= len(held) else None


class _Steps:
    """A replay's batches, pass after pass; ``done`` once a pass yields nothing."""

    def __init__(self, replay: Replay):
        self._replay = replay
        self._it = iter(replay)
        self._fresh = False  # a whole pass, from its start, that has yielded nothing yet
        self.done = False

    def next(self) -> Step | None:
        """The next batch; None where a pass ended (the replay is then at the next pass's start)."""
        step = next(self._it, None)
        if step is not None:
            self._fresh = False
            return step
        if self._fresh:
            self.done = True
            return None
        self._replay.next_pass()
        self._it, self._fresh = iter(self._replay), True
        return None

    def switch(self, weights: dict[str, float]) -> None:
        """``set_weights(weights)`` here: the readers reopened where they are, under them (as the loader restarts them)."""
        close = getattr(self._it, "close", None)
        if close is not None:
            close()
        self._replay.weights = weights
        self._it = iter(self._replay)


def _at(replay: Replay, rank: dict) -> bool:
    """Whether the replay's readers are where a rank state puts them."""
    if replay.next_worker != rank[k.NEXT_WORKER]:
        return False
    for mine, theirs in zip(replay.readers, rank[k.WORKERS], strict=True):
        if (mine is None) != (theirs is None):
            return False
        if (
            mine is not None
            and theirs is not None
            and (mine[k.POSITION] != theirs[k.POSITION] or mine[k.WITHIN] != theirs[k.WITHIN])
        ):
            return False
    return True


def _read(report: Report, reads: dict, rank: int, step: Step) -> None:
    report.batches += 1
    for row in step.rows:
        for o in row:
            report.reads += 1
            reads[(o.source, o.epoch, o.file, o.row)].append(
                {
                    "rank": rank,
                    "pass": step.pass_,
                    "step": step.step,
                    "start": o.start,
                    "end": o.end,
                    "stream": o.stream,
                }
            )


def _skip(report: Report, rank: int, index: int, name: str, step: Step) -> None:
    records = [seg for row in step.segments() for seg in row]
    if report.skipped and report.skipped[-1]["rank"] == rank and report.skipped[-1]["state"] == index:
        report.skipped[-1]["batches"] += 1
        report.skipped[-1]["records"] += records
    else:
        report.skipped.append({"rank": rank, "state": index, "name": name, "batches": 1, "records": records})
