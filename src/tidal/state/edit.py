"""Reading and editing a saved loader state: ``tidal state show``, ``tidal state skip``, merging ranks."""

from __future__ import annotations

import copy

import numpy as np

from tidal.errors import StateError
from tidal.order import share_sizes
from tidal.state import keys as k
from tidal.state.elastic import records_done
from tidal.state.schema import check_layout, mix_draws, progress_of

_SAME = (k.DATASET, k.TOPOLOGY, k.PASS, k.FIRST_EPOCH, k.ORIGIN, k.SOURCES, k.RECORDS_PER_BATCH)
"""What every state merged must agree on: one run, one topology, the same pass."""


def merge(states: list[dict], names: list[str] | None = None) -> dict:
    """One loader state for all ranks, from the states the ranks saved each for itself.

    Without ``torch.distributed`` (ranks from ``RANK``/``WORLD_SIZE`` alone) a rank's
    ``state_dict()`` holds its own rank state only (the others ``None``, no ``progress``); the
    merged state holds every rank's and the ``progress`` they make together, so it restores on
    any topology. Ranks may have saved after different numbers of batches (nothing keeps
    uncoordinated ranks together): each continues from its own state on the same topology, and
    another topology splits what is left. States gathered under ``torch.distributed`` are whole
    already: merging them checks that they agree. ``names`` (the files, say) name the states in
    errors: a rank given twice with different contents, a rank no state holds, or states of
    other datasets, topologies or passes are each a :class:`~tidal.StateError`.
    """
    if not states:
        raise StateError("no states to merge")
    names = names or [f"states[{i}]" for i in range(len(states))]
    views = [check_layout(s, name) for s, name in zip(states, names, strict=True)]
    out = copy.deepcopy(states[0])
    given: dict[int, int] = {}  # rank: the state it was taken from
    for i, view in enumerate(views):
        for key in _SAME:
            if view.data.get(key) != views[0].data.get(key):
                raise StateError(
                    f"{names[i]}: its {key!r} differs from {names[0]}'s: states of other datasets, topologies, "
                    "passes or restores cannot be merged"
                )
        for key in (k.WEIGHTS, k.WEIGHT_CALLS):  # the one check of set_weights() ranks without a process group get
            if view.data.get(key) != views[0].data.get(key):
                raise StateError(
                    f"{names[i]}: its {key!r} differ from {names[0]}'s: set_weights() set other mixture weights, or "
                    "at other steps, on other ranks (call it on every rank at the same step with the same weights)"
                )
        for rank, entry in enumerate(view.entries(k.RANKS)):
            if entry is None:
                continue
            if rank in given and out[k.RANKS][rank] != entry:
                raise StateError(
                    f"{names[given[rank]]} and {names[i]} both hold rank {rank}, at other positions: give each "
                    "rank's state once (states of one step)"
                )
            given.setdefault(rank, i)
            out[k.RANKS][rank] = entry
    missing = [i for i, r in enumerate(out[k.RANKS]) if r is None]
    if missing:
        raise StateError(
            f"no state holds rank{'s' * (len(missing) > 1)} {', '.join(map(str, missing))} of the "
            f"{len(out[k.RANKS])} it was saved on: give every rank's state"
        )
    out[k.PROGRESS] = progress_of(out)
    return out


def show(state: dict) -> str:
    """A short human description of a state."""
    check_layout(state)
    world_size, workers = state[k.TOPOLOGY]
    lines = [f"tidal loader state: pass {state[k.PASS]}, saved on {world_size} rank(s) x {workers} worker(s)"]
    counts = [r[k.COUNTS] for r in state[k.RANKS] if r]
    if counts:
        batches, tokens = sum(c[k.BATCHES] for c in counts), sum(c[k.TOKENS] for c in counts)
        lines.append(f"consumed: {batches} batches over all ranks" + (f", {tokens} tokens" if tokens else ""))
    for key, prog in (state.get(k.PROGRESS) or {}).items():
        if key.endswith(k.MIX):
            name = key[: -len(k.MIX)].rstrip("/")
            line = f"mixture{' ' + name if name else ''}: {prog[k.DRAWS]} records drawn over all readers"
            if not name and _packed(state):  # a position holds a mixture's draws where the packing buffer began
                read = sum(w[k.COUNTS][k.RECORDS] for r in state[k.RANKS] if r for w in r[k.WORKERS] if w)
                line += (
                    " before the documents in their packing buffers, which a restore draws again "
                    f"({read} records read from the streams in all)"
                )
            lines.append(line)
            continue
        total = state[k.SOURCES][key][k.RECORDS]
        epoch, done = int(prog[k.EPOCH]), records_done(prog)
        partial = ", ".join(f"epoch {e}: {records_done({k.DONE: {e: iv}})}" for e, iv in sorted(prog[k.DONE].items()))
        lines.append(
            f"{key or 'source'}: {total} records per epoch; in epoch {epoch}; "
            f"records used up in epochs in progress: {done}" + (f" ({partial})" if partial else "")
        )
    rows = {
        len(w[k.POSITION][k.ROWS]) for r in state[k.RANKS] if r for w in r[k.WORKERS] if w and k.ROWS in w[k.POSITION]
    }
    if rows:
        lines.append(f"continuous rows: {max(rows) * workers} per batch, each a reader of its own")
    weights = state.get(k.WEIGHTS)
    if weights is not None:
        shown = ", ".join(f"{name} {w:g}" for name, w in weights.items())
        lines.append(f"weights (set_weights): {shown}, from the next batch on every rank")
    elif mix_draws(state):
        lines.append("weights: the mixture's own (set_weights has not been called)")
    if state.get(k.PROGRESS) is None:
        lines.append("progress: unknown (this state covers one rank; merge the ranks' states)")
    if state.get(k.SKIPPED_BATCHES):
        lines.append(f"skipped by `tidal state skip`: {state[k.SKIPPED_BATCHES]} batches per rank")
    return "\n".join(lines)


def _packed(state: dict) -> bool:
    """Whether a reader's position holds its top mixture under a packing stage's buffer."""
    for r in state[k.RANKS]:
        for w in (r or {}).get(k.WORKERS, []):
            position = w[k.POSITION] if w else None
            while isinstance(position, dict) and k.STREAMS not in position:
                if k.UPSTREAM in position:
                    return True
                rows = position.get(k.ROWS)
                position = rows[0] if isinstance(rows, list) and rows else None
    return False


def skip(state: dict, batches: int, *, approximate: bool = False) -> dict:
    """A state that continues ``batches`` batches (per rank) later, skipping the data between.

    Exact, and restored batch for batch as if those batches had been consumed, where every
    batch holds a known number of source records: plain batches (records from files, mapped,
    tokenized and batched, none skipped as bad) and continuous rows over them, whatever the
    number of workers. Other batches (packing, filters, mixtures, records skipped as bad) hold
    a varying number of records, so a skip from the state alone would be a guess: a
    :class:`~tidal.StateError` says how to skip them exactly (run the loader on), unless
    ``approximate=True``: then each reader moves on by its part of the skipped batches at the
    rate of records per batch it has read so far (read ahead included, so it overshoots), and
    the result restores as on another topology, with the skipped records marked used.
    """
    check_layout(state)
    if not isinstance(batches, int) or isinstance(batches, bool) or batches < 0:
        raise StateError(f"cannot skip {batches!r} batches: give a non-negative number")
    if state.get(k.PROGRESS) is None:
        raise StateError("this state covers one rank: merge the ranks' states before skipping")
    exact = _skip_plain(state, batches)
    if exact is not None:
        return exact
    if not approximate:
        raise StateError(
            "the batches of this state hold a varying number of source records (packing, a filter, a mixture, "
            "records skipped as bad, or a worker that had not yielded yet), so a skip computed from the state "
            f"alone would be an estimate. To skip {batches} batches exactly, run the loader on: "
            f"loader.load_state_dict(state), take {batches} batches and save loader.state_dict(). "
            "For the estimate, pass approximate=True (tidal state skip --approximate)"
        )
    out = copy.deepcopy(state)
    world_size, workers = state[k.TOPOLOGY]
    readers = world_size * workers
    per_worker = -(-batches // workers)
    sizes = _ShareSizes()
    for r, rank in enumerate(out[k.RANKS]):
        for w, reader in enumerate(rank[k.WORKERS]):
            if reader and reader[k.USED]:
                rate = _records_per_batch(reader)
                # continuous rows: every batch is one of every worker's, side by side
                count = batches if k.ROWS in reader[k.POSITION] else per_worker
                reader[k.USED] = _advance(reader[k.USED], count * rate, state, readers, r * workers + w, sizes)
    out[k.MIX_DRAWS] = mix_draws(state)
    out[k.PROGRESS] = progress_of(out)
    out[k.RANKS] = [None] * world_size  # positions inside buffers no longer apply
    out[k.SKIPPED_BATCHES] = state.get(k.SKIPPED_BATCHES, 0) + batches
    return out


_READ = {k.FIRST_EPOCH, k.EPOCH, k.OFFSET, k.PASSED}  # the position of a plain chain: its source's


def _skip_plain(state: dict, batches: int) -> dict | None:
    """:func:`skip` by whole batches of every worker, on the same topology; None unless the
    batches are plain (``records_per_batch`` known: one source read in order)."""
    rate = state.get(k.RECORDS_PER_BATCH)
    if rate is None or len(state[k.SOURCES]) != 1 or any(r is None for r in state[k.RANKS]):
        return None
    ((key, src),) = state[k.SOURCES].items()
    readers = [w for r in state[k.RANKS] for w in r[k.WORKERS] if w is not None]
    if readers and all(set(w[k.POSITION]) == {k.ROWS} for w in readers):
        return _skip_rows(state, batches, rate)
    if any(set(w[k.POSITION]) != _READ for w in readers):
        return None
    world_size, workers = state[k.TOPOLOGY]
    origin = (state.get(k.ORIGIN) or {}).get(key) or {k.EPOCH: state[k.FIRST_EPOCH], k.DONE: {}}
    sizes = _ShareSizes()
    out = copy.deepcopy(state)
    for r, rank in enumerate(out[k.RANKS]):
        start = rank[k.NEXT_WORKER]
        for w in range(workers):
            count = batches // workers + ((w - start) % workers < batches % workers)
            reader = rank[k.WORKERS][w] or _fresh_reader(state, origin, key, [r, world_size, w, workers])
            position = reader[k.POSITION]
            offset = position[k.OFFSET] + reader[k.WITHIN] * rate
            epoch, offset, moved = _move(
                sizes, key, src, origin, world_size * workers, r * workers + w, position, offset, count * rate
            )
            position.update({k.EPOCH: epoch, k.OFFSET: offset, k.PASSED: position[k.PASSED] + moved})
            reader[k.WITHIN] = 0
            reader[k.USED] = {key: [epoch, offset]}
            reader[k.COUNTS] = {
                k.ITEMS: reader[k.COUNTS][k.ITEMS] + count,
                k.RECORDS: reader[k.COUNTS][k.RECORDS] + moved,
            }
            rank[k.WORKERS][w] = reader
        rank[k.NEXT_WORKER] = (start + batches) % workers
        rank[k.COUNTS][k.BATCHES] += batches
    out[k.PROGRESS] = progress_of(out)
    out[k.SKIPPED_BATCHES] = state.get(k.SKIPPED_BATCHES, 0) + batches
    return out


def _skip_rows(state: dict, batches: int, rate: int) -> dict | None:
    """:func:`skip` of continuous rows over plain records: every batch steps every row of every
    worker by one record, so each row moves on ``batches`` records through its own share."""
    ((key, src),) = state[k.SOURCES].items()
    world_size, workers = state[k.TOPOLOGY]
    if any(w is None for r in state[k.RANKS] for w in r[k.WORKERS]):
        return None  # a worker that has not yielded: its rows are not in the state
    rows = {len(w[k.POSITION][k.ROWS]) for r in state[k.RANKS] for w in r[k.WORKERS]}
    if len(rows) != 1 or rows.pop() * workers != rate:
        return None
    lanes = rate // workers
    origin = (state.get(k.ORIGIN) or {}).get(key) or {k.EPOCH: state[k.FIRST_EPOCH], k.DONE: {}}
    sizes = _ShareSizes()
    out = copy.deepcopy(state)
    for r, rank in enumerate(out[k.RANKS]):
        for w, reader in enumerate(rank[k.WORKERS]):
            used, moved_all = [], 0
            for lane, position in enumerate(reader[k.POSITION][k.ROWS]):
                if set(position) != _READ or reader[k.WITHIN]:
                    return None
                consumer = (r * workers + w) * lanes + lane
                epoch, offset, moved = _move(
                    sizes,
                    key,
                    src,
                    origin,
                    world_size * workers * lanes,
                    consumer,
                    position,
                    position[k.OFFSET],
                    batches,
                )
                position.update({k.EPOCH: epoch, k.OFFSET: offset, k.PASSED: position[k.PASSED] + moved})
                used += [epoch, offset]
                moved_all += moved
            reader[k.USED] = {key: used}
            reader[k.COUNTS] = {
                k.ITEMS: reader[k.COUNTS][k.ITEMS] + batches,
                k.RECORDS: reader[k.COUNTS][k.RECORDS] + moved_all,
            }
        rank[k.COUNTS][k.BATCHES] += batches
    out[k.PROGRESS] = progress_of(out)
    out[k.SKIPPED_BATCHES] = state.get(k.SKIPPED_BATCHES, 0) + batches
    return out


def _fresh_reader(state: dict, origin: dict, key: str, reader: list[int]) -> dict:
    """The state of a worker that has not yielded a batch yet: at the start of its share."""
    first = state[k.FIRST_EPOCH]
    epoch = max(first, origin[k.EPOCH])
    return {
        k.DATASET: state[k.DATASET],
        k.READER: reader,
        k.POSITION: {k.FIRST_EPOCH: first, k.EPOCH: epoch, k.OFFSET: 0, k.PASSED: 0},
        k.WITHIN: 0,
        k.USED: {key: [epoch, 0]},
        k.COUNTS: {k.ITEMS: 0, k.RECORDS: 0},
    }


class _ShareSizes:
    """The size of every reader's share of an epoch, worked out once for all readers of the
    epoch: a :func:`~tidal.order.share` per reader costs the epoch's done intervals each, which
    over 8,192 readers restored from as many intervals took minutes."""

    def __init__(self) -> None:
        self._known: dict[tuple, np.ndarray] = {}

    def __call__(self, key: str, src: dict, origin: dict, readers: int, reader: int, epoch: int) -> int:
        at = (key, readers, epoch)
        if at not in self._known:
            done = origin[k.DONE].get(str(epoch), [])
            self._known[at] = share_sizes(src[k.RECORDS], done, readers, drop_remainder=src[k.FINITE])
        return int(self._known[at][reader])


def _move(
    sizes: _ShareSizes,
    key: str,
    src: dict,
    origin: dict,
    readers: int,
    reader: int,
    position: dict,
    offset: int,
    records: int,
) -> tuple:
    """(epoch, offset, records moved) ``records`` on through this reader's shares, stopping at
    the end of the pass's last epoch."""
    epoch, left = position[k.EPOCH], records
    last = position[k.FIRST_EPOCH] + src[k.EPOCHS] - 1 if src[k.EPOCHS] is not None else None
    while True:
        size = sizes(key, src, origin, readers, reader, epoch)
        step = min(left, size - offset)
        offset, left = offset + step, left - step
        if left == 0 or size == 0 or (last is not None and epoch >= last):
            return epoch, offset, records - left
        epoch, offset = epoch + 1, 0


def _records_per_batch(reader: dict) -> int:
    counts = reader[k.COUNTS]
    if not counts[k.ITEMS]:
        raise StateError("a worker has not yielded a batch yet: cannot tell how many records a batch holds")
    return max(1, round(counts[k.RECORDS] / counts[k.ITEMS]))


def _advance(used: dict, records: int, state: dict, readers: int, reader: int, sizes: _ShareSizes) -> dict:
    """Move each source's [epoch, offset] on by ``records`` through its share, epoch by epoch
    (a reader of several lanes: each lane by its part, through the lane's own share)."""
    out = {}
    for key, at in used.items():
        lanes = len(at) // 2
        out[key] = [
            v
            for lane in range(lanes)
            for v in _advance_one(
                sizes,
                state,
                key,
                at[2 * lane],
                at[2 * lane + 1],
                records // lanes,
                readers * lanes,
                reader * lanes + lane,
            )
        ]
    return out


def _advance_one(
    sizes: _ShareSizes, state: dict, key: str, epoch: int, offset: int, records: int, readers: int, reader: int
) -> list:
    src = state[k.SOURCES][key]
    origin = (state.get(k.ORIGIN) or {}).get(key) or {k.DONE: {}}
    left = records
    while True:
        size = sizes(key, src, origin, readers, reader, epoch)
        step = min(left, size - offset)
        offset, left = offset + step, left - step
        if left == 0 or size == 0:
            break
        epoch, offset = epoch + 1, 0
    return [epoch, offset]
