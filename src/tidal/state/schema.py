"""The loader state (``DataLoader.state_dict()``): how it is made, checked and restored.

    {"version": 3, "dataset": fingerprint, "pass": p, "first_epoch": e,
     "topology": [ranks, workers],
     "ranks": [{"next_worker": w, "workers": [reader state | None, ...],
                "counts": {"batches": b, "tokens": t}} | None, ...],
     "origin": progress restored from | None,
     "records_per_batch": n where every batch holds n source records | None,
     "sources": {source key: {"records": per epoch, "finite": bool, "epochs": per pass | None}},
     "progress": {source key: {"epoch": e, "done": {epoch: [[start, stop], ...]}},
                  mixture key "…@mix": {"draws": over all readers}} | None,
     "weights": {stream: weight}, the mixture weights in force, where set_weights set them,
     "weight_calls": {"total": n, "calls": [[pass, batches, {stream: weight}], ...]}, the
                     set_weights calls since the state before, where there were any (tidal.state.calls)}

On the same topology each rank continues from its own rank state, batch for batch; on
another, from ``progress`` (see :mod:`tidal.state.elastic`). Everything is checked before
it is used: a state that is not one, or one that does not fit the dataset or the loader, is a
:class:`~tidal.errors.StateError` naming the key.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TypedDict

from tidal.errors import StateError
from tidal.state import calls
from tidal.state import keys as k
from tidal.state.elastic import check_progress, progress
from tidal.state.view import View

ReaderState = dict[str, Any]
"""One reader's state, ``DatasetIterator.state()``: ``dataset``, ``reader``, ``position``,
``within``, ``used``, ``counts`` and, after an elastic restore, ``origin``. Read back through
a :class:`View` (its position is each stage's own), so it is not typed further here."""


# The rank state, the part of a loader state a loader changes batch by batch, typed. Its keys
# are those of tidal.state.keys (tests/state/test_ledger.py holds them equal), spelled out as
# TypedDict needs; the code indexes it with the names of tidal.state.keys, as any state.
class RankCounts(TypedDict):
    """What a rank's training loop consumed: ``batches`` and ``tokens`` (``input_ids``)."""

    batches: int
    tokens: int


class RankState(TypedDict):
    """Per worker its reader state after the last batch consumed, the worker whose batch comes
    next, and the counts."""

    next_worker: int
    workers: list[ReaderState | None]
    counts: RankCounts


def fresh_rank(workers: int) -> RankState:
    """A rank state before any batch."""
    return {k.NEXT_WORKER: 0, k.WORKERS: [None] * workers, k.COUNTS: {k.BATCHES: 0, k.TOKENS: 0}}


def copy_rank(rank: RankState) -> RankState:
    """A copy that later batches do not change (reader states themselves are never changed)."""
    return {k.NEXT_WORKER: rank[k.NEXT_WORKER], k.WORKERS: list(rank[k.WORKERS]), k.COUNTS: rank[k.COUNTS].copy()}


def consume(rank: RankState, worker: int, reader: ReaderState, tokens: int, batches: int = 1) -> None:
    """Update a rank state in place: the training loop consumed a batch of ``worker``, after
    which that worker's reader state is ``reader``; ``tokens``: its ``input_ids`` count.
    ``batches=0``: a part of a batch made of one batch of every worker (continuous rows)."""
    rank[k.WORKERS][worker] = reader
    rank[k.NEXT_WORKER] = (worker + 1) % len(rank[k.WORKERS])
    counts = rank[k.COUNTS]
    counts[k.BATCHES] += batches
    counts[k.TOKENS] += tokens


def reader_where(rank: int, worker: int) -> str:
    """Where a rank's worker's reader state is in a loader state, as errors name it."""
    return f"state['{k.RANKS}'][{rank}]['{k.WORKERS}'][{worker}]"


def check_same_step(every: list[RankState | None]) -> None:
    """That every known rank state was taken after as many batches: ranks yield as many
    batches, so states taken at different steps were saved apart."""
    steps = {r: e[k.COUNTS][k.BATCHES] for r, e in enumerate(every) if e is not None}
    if len(set(steps.values())) > 1:
        raise StateError(
            f"state_dict() was called after different numbers of batches on different ranks ({steps}): "
            "call it on every rank at the same step"
        )


def sources_of(plans: dict) -> dict:
    """``sources`` of a state, from a dataset's read plans by source key."""
    return {key: {k.RECORDS: p.total, k.FINITE: p.epochs is not None, k.EPOCHS: p.epochs} for key, p in plans.items()}


def make(
    fingerprint: str,
    sources: dict,
    pass_: int,
    first_epoch: int,
    topology: list[int],
    ranks: list[RankState | None],
    origin: dict | None,
    records_per_batch: int | None = None,
    weights: dict[str, float] | None = None,
    weight_calls: dict | None = None,
) -> dict:
    """A loader state; ``progress`` when every rank is known (see :func:`tidal.state.merge`);
    ``weights``: the mixture weights ``set_weights`` set, if any; ``weight_calls``: its calls."""
    state: dict[str, Any] = {
        k.STATE_VERSION: k.VERSION,
        k.DATASET: fingerprint,
        k.PASS: pass_,
        k.FIRST_EPOCH: first_epoch,
        k.TOPOLOGY: topology,
        k.RANKS: ranks,
        k.ORIGIN: origin,
        k.SOURCES: sources,
        k.RECORDS_PER_BATCH: records_per_batch,
    }
    state[k.PROGRESS] = None if any(r is None for r in ranks) else progress_of(state)
    if weights is not None:
        state[k.WEIGHTS] = weights
    if weight_calls is not None:
        state[k.WEIGHT_CALLS] = weight_calls
    return state


def progress_of(state: dict) -> dict:
    """``progress`` of a state whose ranks are all known: per source, and per mixture its draws."""
    used = [(w or {}).get(k.USED) for r in state[k.RANKS] for w in r[k.WORKERS]]
    out = progress(state[k.SOURCES], used, state.get(k.ORIGIN), state[k.FIRST_EPOCH])
    out.update({key: {k.DRAWS: n} for key, n in mix_draws(state).items()})
    return out


def mix_draws(state: dict) -> dict[str, int]:
    """Records each mixture has drawn over all readers, by mixture key (empty for no mixture)."""
    total: dict[str, int] = {}
    for r in state[k.RANKS]:
        for w in (r or {}).get(k.WORKERS, []):
            for key, draws in _mixtures(w[k.POSITION] if w else None, ""):
                total[key] = total.get(key, 0) + draws
    if not total:  # no reader has drawn since the state was made: what it was made from
        total = dict(state.get(k.MIX_DRAWS) or {})
        for key, entry in (state.get(k.ORIGIN) or {}).items():
            if key.endswith(k.MIX):
                total.setdefault(key, int(entry[k.DRAWS]))
    return total


def _mixtures(position: Any, key: str) -> Iterator[tuple[str, int]]:
    """(mixture key, draws) of every mixture in a reader's position."""
    while isinstance(position, dict):
        if isinstance(position.get(k.ROWS), list):  # continuous rows: a mixture in every row
            for row in position[k.ROWS]:
                yield from _mixtures(row, key)
            return
        if k.STREAMS in position:
            yield key + k.MIX, int(position[k.DRAWS])
            for name, inner in position[k.STREAMS].items():
                yield from _mixtures(inner, f"{key}{name}/")
            return
        position = position.get(k.UPSTREAM)


@dataclass
class Restored:
    """What a rank continues from: its pass, the origin its readers share, its rank state."""

    pass_: int
    origin: dict | None
    rank: RankState


def check(state: Any, fingerprint: str, sources: dict) -> View:
    """The state as a :class:`View`, checked to be well formed and to describe this dataset."""
    view = check_layout(state)
    check_dataset(view, fingerprint)
    saved = view.data[k.SOURCES]
    if saved != sources:
        raise StateError(f"{view.where(k.SOURCES)}: {saved} does not describe this dataset's sources ({sources})")
    return view


def check_dataset(view: View, fingerprint: str) -> None:
    """That a loader state or a reader state (its ``dataset``) was saved from this dataset."""
    if view.get(k.DATASET, None) != fingerprint:
        raise StateError("this state was saved from a different dataset (other files, seed, block size or stages)")


def check_layout(state: Any, where: str = "state") -> View:
    """The state as a :class:`View`, every part checked that a restore or an edit relies on."""
    view = View(state, where)
    version = view.get(k.STATE_VERSION, None)
    if version != k.VERSION:
        raise StateError(
            f"not a tidal loader state of version {k.VERSION} ({view.where(k.STATE_VERSION)} is {version!r}); "
            "expected the JSON of DataLoader.state_dict()"
        )
    view.only(*_STATE_KEYS)
    view.string(k.DATASET)
    view.integer(k.PASS)
    view.integer(k.FIRST_EPOCH)
    topology = view.entries(k.TOPOLOGY, length=2)
    ranks_n = _positive(topology[0], view.where(k.TOPOLOGY) + "[0]")
    workers_n = _positive(topology[1], view.where(k.TOPOLOGY) + "[1]")
    sources = view.view(k.SOURCES)
    for key in sources.data:
        entry = sources.view(key)
        entry.integer(k.RECORDS)
        finite = entry.flag(k.FINITE)
        epochs = entry.get(k.EPOCHS)
        if (epochs is not None or finite) and (type(epochs) is not int or epochs < 1 or not finite):
            raise StateError(f"{entry.where(k.EPOCHS)}: {epochs!r} does not fit {k.FINITE}={finite}")
    ranks = view.entries(k.RANKS, length=ranks_n)
    for r, entry in enumerate(ranks):
        if entry is not None:
            _check_rank(View(entry, f"{view.where(k.RANKS)}[{r}]"), r, ranks_n, workers_n)
    for key in (k.ORIGIN, k.PROGRESS):
        part = view.optional(key)
        if part is not None:
            check_progress(part, sources.data)
    if view.get(k.RECORDS_PER_BATCH, None) is not None:
        view.integer(k.RECORDS_PER_BATCH, lo=1)
    draws = view.optional(k.MIX_DRAWS)
    if draws is not None:
        for key in draws.data:
            draws.integer(key)
    weights = view.optional(k.WEIGHTS)
    if weights is not None:
        check_weights(weights)
    weight_calls = view.optional(k.WEIGHT_CALLS)
    if weight_calls is not None:
        calls.check(weight_calls, check_weights)
    return view


def check_weights(view: View) -> None:
    """That the mixture weights of a loader state are finite, non-negative and not all zero (their
    names are checked against the mixture when the state is loaded)."""
    for name, value in view.data.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or value == float("inf"):
            raise StateError(f"{view.where(name)}: expected a finite, non-negative weight, found {value!r}")
    if not sum(view.data.values()) > 0:
        raise StateError(f"{view.path}: the weights are all zero")


def _positive(value: Any, where: str) -> int:
    if type(value) is not int or value < 1:
        raise StateError(f"{where}: expected a positive integer, found {value!r}")
    return value


_STATE_KEYS = (
    k.STATE_VERSION,
    k.DATASET,
    k.PASS,
    k.FIRST_EPOCH,
    k.TOPOLOGY,
    k.RANKS,
    k.ORIGIN,
    k.SOURCES,
    k.PROGRESS,
    k.RECORDS_PER_BATCH,
    k.MIX_DRAWS,
    k.SKIPPED_BATCHES,
    k.WEIGHTS,
    k.WEIGHT_CALLS,
)
_READER_KEYS = (k.DATASET, k.READER, k.POSITION, k.WITHIN, k.USED, k.COUNTS, k.ORIGIN, k.WEIGHTS)


def _check_rank(rank: View, r: int, ranks: int, workers: int) -> None:
    rank.only(k.NEXT_WORKER, k.WORKERS, k.COUNTS)
    rank.integer(k.NEXT_WORKER, hi=workers - 1)
    counts = rank.view(k.COUNTS)
    counts.only(k.BATCHES, k.TOKENS)
    counts.integer(k.BATCHES)
    counts.integer(k.TOKENS)
    for w, reader in enumerate(rank.entries(k.WORKERS, length=workers)):
        if reader is None:
            continue
        where = f"{rank.where(k.WORKERS)}[{w}]"
        view = View(reader, where)
        view.only(*_READER_KEYS)
        if view.entries(k.READER, length=4) != [r, ranks, w, workers]:
            raise StateError(
                f"{view.where(k.READER)}: {view.get(k.READER)} is not reader [{r}, {ranks}, {w}, {workers}]"
            )
        view.view(k.POSITION)
        view.integer(k.WITHIN)
        view.view(k.COUNTS).only(k.ITEMS, k.RECORDS)
        view.view(k.COUNTS).integer(k.ITEMS)
        view.view(k.COUNTS).integer(k.RECORDS)
        used = view.view(k.USED)
        for key in used.data:
            at = used.entries(key)
            if not at or len(at) % 2:  # [epoch, offset] per lane (continuous rows: several)
                raise StateError(f"{used.where(key)}: expected 2 entries ([epoch, offset]) per row, found {len(at)}")
            for i, v in enumerate(at):
                if type(v) is not int or v < 0:
                    raise StateError(f"{used.where(key)}[{i}]: expected a non-negative integer, found {v!r}")


def restore(state: View, rank: int, ranks: int, workers: int) -> Restored:
    """Where rank ``rank`` of ``ranks`` with ``workers`` workers continues from a checked state."""
    data = state.data
    pass_ = data[k.PASS]
    if data[k.TOPOLOGY] == [ranks, workers] and data[k.RANKS][rank] is not None:
        return Restored(pass_, data.get(k.ORIGIN), copy_rank(data[k.RANKS][rank]))  # the same readers: exactly
    if data.get(k.PROGRESS) is None:
        missing = [i for i, r in enumerate(data[k.RANKS]) if r is None]
        raise StateError(
            f"this state lacks ranks {missing}: restoring on another topology needs every rank's "
            "state (save under torch.distributed, or combine the ranks' files with tidal.state.merge)"
        )
    origin = dict(data[k.PROGRESS])  # the new readers share what the old ones left
    for key, n in mix_draws(data).items():
        origin[key] = {k.DRAWS: n}  # so a weight schedule goes on from there
    fresh = fresh_rank(workers)
    known = [r for r in data[k.RANKS] if r]
    fresh[k.COUNTS][k.BATCHES] = sum(r[k.COUNTS][k.BATCHES] for r in known) // ranks
    return Restored(pass_, origin, fresh)
