"""Reading and editing a saved loader state: ``tidal state show`` and ``tidal state skip``.

A state (``DataLoader.state_dict()``) is plain JSON:

- ``pass``, ``topology`` ``[ranks, workers]``, ``ranks``: per rank, the next worker and each
  worker's exact position (what a restore on the same topology continues from);
- ``sources``: per source, its records per epoch and whether epochs are finite;
- ``progress``: per source, the epochs in progress and the positions used up in each (what
  a restore on another topology, or after ``skip``, continues from; see :mod:`tidal.elastic`);
- per rank, ``counts``: the batches and tokens its training loop has consumed.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from tidal.elastic import progress, records_done
from tidal.errors import StateError
from tidal.order import share

if TYPE_CHECKING:
    from tidal.dataset import Dataset


def with_progress(dataset: Dataset, state: dict) -> dict:
    """Add ``sources`` and, when every rank is known, ``progress`` to a loader state."""
    state["sources"] = {k: {"records": p.total, "finite": p.epochs is not None} for k, p in dataset.sources().items()}
    if any(r is None for r in state["ranks"]):
        state["progress"] = None  # other ranks unknown: see merge()
        return state
    consumed = [(w or {}).get("consumed") for r in state["ranks"] for w in r["workers"]]
    state["progress"] = progress(state["sources"], consumed, state.get("origin"), state["first_epoch"])
    return state


def merge(states: list[dict]) -> dict:
    """One state for all ranks from the per-rank states saved without ``torch.distributed``."""
    if not states:
        raise StateError("no states to merge")
    out = copy.deepcopy(states[0])
    for s in states[1:]:
        if s["dataset"] != out["dataset"] or s["topology"] != out["topology"] or s["pass"] != out["pass"]:
            raise StateError("these states come from different datasets, topologies or passes")
        for rank, entry in enumerate(s["ranks"]):
            if entry is not None:
                out["ranks"][rank] = entry
    if any(r is None for r in out["ranks"]):
        raise StateError(f"ranks {[i for i, r in enumerate(out['ranks']) if r is None]} are missing")
    consumed = [(w or {}).get("consumed") for r in out["ranks"] for w in r["workers"]]
    out["progress"] = progress(out["sources"], consumed, out.get("origin"), out.get("first_epoch", 0))
    return out


def show(state: dict) -> str:
    """A short human description of a state."""
    _check(state)
    world_size, workers = state["topology"]
    lines = [f"tidal loader state: pass {state['pass']}, saved on {world_size} rank(s) x {workers} worker(s)"]
    counts = [r["counts"] for r in state["ranks"] if r]
    if counts:
        batches, tokens = sum(c["batches"] for c in counts), sum(c["tokens"] for c in counts)
        lines.append(f"consumed: {batches} batches over all ranks" + (f", {tokens} tokens" if tokens else ""))
    for key, prog in (state.get("progress") or {}).items():
        total = state["sources"][key]["records"]
        epoch, done = int(prog["epoch"]), records_done(prog)
        partial = ", ".join(f"epoch {e}: {records_done({'done': {e: iv}})}" for e, iv in sorted(prog["done"].items()))
        lines.append(
            f"{key or 'source'}: {total} records per epoch; in epoch {epoch}; "
            f"records used up in epochs in progress: {done}" + (f" ({partial})" if partial else "")
        )
    if state.get("progress") is None:
        lines.append("progress: unknown (this state covers one rank; merge the ranks' states)")
    if state.get("skipped_batches"):
        lines.append(f"skipped by `tidal state skip`: {state['skipped_batches']} batches per rank")
    return "\n".join(lines)


def skip(state: dict, batches: int) -> dict:
    """A state that continues ``batches`` batches (per rank) later, skipping the data between.

    Each reader's position moves on by its part of the skipped batches, at the rate of
    records per batch it has read so far. The result restores as on another topology: from
    ``progress``, with the skipped records marked used.
    """
    _check(state)
    if batches < 0:
        raise StateError("cannot skip a negative number of batches")
    if state.get("progress") is None:
        raise StateError("this state covers one rank: merge the ranks' states before skipping")
    out = copy.deepcopy(state)
    world_size, workers = state["topology"]
    readers = world_size * workers
    per_worker = -(-batches // workers)
    consumed: list[dict | None] = []
    for r in state["ranks"]:
        for w in r["workers"]:
            c = (w or {}).get("consumed")
            rate = _records_per_batch(w)
            consumed.append(_advance(c, per_worker * rate, state, readers, len(consumed)) if c else None)
    out["progress"] = progress(out["sources"], consumed, state.get("origin"), state.get("first_epoch", 0))
    out["mix_draws"] = mix_draws(state)
    out["ranks"] = [None] * world_size  # positions inside buffers no longer apply
    out["skipped_batches"] = state.get("skipped_batches", 0) + batches
    return out


def mix_draws(state: dict) -> int:
    """Records a mixture has drawn over all readers (0 when the dataset is not a mixture)."""

    def draws(position: Any) -> int:
        if isinstance(position, dict):
            if "streams" in position and "k" in position:
                return int(position["k"])
            return draws(position.get("upstream"))
        return 0

    known = [draws(w["position"]) for r in state["ranks"] if r for w in r["workers"] if w]
    return sum(known) if known else int(state.get("mix_draws", 0))


def _records_per_batch(worker_state: dict | None) -> int:
    if not worker_state or not worker_state.get("items"):
        raise StateError("a worker has not yielded a batch yet: cannot tell how many records a batch holds")
    return max(1, round(worker_state["records"] / worker_state["items"]))


def _advance(consumed: dict, records: int, state: dict, readers: int, reader: int) -> dict:
    """Move each source's [epoch, offset] on by ``records`` through its share, epoch by epoch."""
    out = {}
    for key, (epoch, offset) in consumed.items():
        src = state["sources"][key]
        origin = (state.get("origin") or {}).get(key) or {"done": {}}
        left = records
        while True:
            done = origin["done"].get(str(epoch), [])
            size = sum(b - a for a, b in share(src["records"], done, readers, reader, drop_remainder=src["finite"]))
            step = min(left, size - offset)
            offset, left = offset + step, left - step
            if left == 0 or size == 0:
                break
            epoch, offset = epoch + 1, 0
        out[key] = [epoch, offset]
    return out


def _check(state: Any) -> None:
    if not isinstance(state, dict) or "topology" not in state or "ranks" not in state:
        raise StateError("not a tidal loader state (expected the JSON of DataLoader.state_dict())")
