"""Elastic restores: a state saved on one topology, resumed on another.

Each reader (rank x worker) reads a *share* of every epoch: intervals of the epoch's
positions (:func:`tidal.order.share`). A reader's state says how far into its share it is
(``used``: ``{source: [epoch, offset]}``). Gathered over all readers, these give, per
source, which positions of the epochs in progress are used up: the ``progress``
``{source: {"epoch": first epoch in progress, "done": {epoch: [[start, stop], ...]}}}``.
A reader that streams several rows side by side (``batch(n, continuous=True)``) is one
reader per row here: its ``used`` holds each row's ``[epoch, offset]`` (:func:`lanes`).
A loader on a different topology hands that to its readers as their *origin*: each takes an
equal part of what is left of those epochs, then carries on with whole epochs as usual.
Nothing left is dropped: the remainder a finite epoch leaves unread on the old topology is
read on the new one. A mixture's draws over all readers travel the same way (``"…@mix"``),
so a weight schedule goes on from where it was.

Granularity: records for plain, mapped, filtered and batched streams; documents for
``pack("concat")`` over any stream (the document in progress counts as used, so the rest of its
tokens is dropped): a packer counts the documents it began through the locator of the table they
came in (:meth:`tidal.stages.Locator.used`), so filtered and mixed streams count as exactly as
plain ones, and a table that begins at an epoch's end counts in the next epoch; for
``pack("best_fit")``, its buffer in progress (about ``buffer_size`` sequences' worth) is packed
again.
"""

from __future__ import annotations

import numpy as np

from tidal.errors import StateError
from tidal.order import taken
from tidal.state import keys as k
from tidal.state.view import View, check_int

MAX_EPOCHS_APART = 100_000  # readers of one topology are never this far apart; a state that says so is not one


def progress(sources: dict, used: list[dict | None], origin: dict | None, first_epoch: int) -> dict:
    """Used-up positions per source, from every reader's ``used`` (``None``: not started).

    ``sources`` maps each source key to ``{"records": per epoch, "finite": bool}``; ``used``
    is indexed by reader (rank-major), so its length is the topology's reader count;
    ``origin`` is the progress these readers were restored from, if any.
    """
    used = lanes(used)
    out = {}
    for key, src in sources.items():
        base = (origin or {}).get(key) or {k.EPOCH: first_epoch, k.DONE: {}}
        at = [list(c[key]) if c and key in c else [int(base[k.EPOCH]), 0] for c in used]
        first, last = min(e for e, _ in at), max(e for e, _ in at)
        if last - first > MAX_EPOCHS_APART:
            raise StateError(f"readers at epochs {first} and {last} of source {key!r}: not one run's state")
        done = {}
        total = src[k.RECORDS]
        for epoch in range(first, last + 1):
            prior = [tuple(iv) for iv in base[k.DONE].get(str(epoch), [])]
            # per reader, how much of its share of this epoch it has used: all of it once past it
            used_of = np.array([total if e > epoch else min(o, total) if e == epoch else 0 for e, o in at], np.int64)
            merged = taken(total, prior, used_of, drop_remainder=src[k.FINITE])
            if merged:
                done[str(epoch)] = [list(iv) for iv in merged]
        out[key] = {k.EPOCH: first, k.DONE: done}
    return out


def lanes(used: list[dict | None]) -> list[dict | None]:
    """Every lane's ``used`` as a reader's own: a reader that streams several rows side by side
    (continuous batches) gives, per source, ``[epoch, offset]`` of each row one after the other,
    and each row is a reader of the data (:meth:`tidal.world.World.with_lane`). A reader not
    started yet stands for as many lanes as the others have."""
    widths = {len(v) // 2 for c in used if c for v in c.values()}
    if len(widths) > 1:
        raise StateError(f"readers with different numbers of rows ({sorted(widths)}): not one run's state")
    width = widths.pop() if widths else 1
    if width == 1:
        return used
    out: list[dict | None] = []
    for c in used:
        if c is None:
            out += [None] * width
        else:
            out += [{key: v[2 * i : 2 * i + 2] for key, v in c.items()} for i in range(width)]
    return out


def records_done(progress_of_source: dict) -> int:
    """How many positions of the epochs in progress are used up."""
    return sum(b - a for intervals in progress_of_source[k.DONE].values() for a, b in intervals)


def check_progress(view: View, sources: dict) -> None:
    """Raise a :class:`StateError` naming the key unless ``view`` is a well-formed progress for ``sources``."""
    for key in view.data:
        entry = view.view(key)
        if key.endswith(k.MIX):
            entry.integer(k.DRAWS)
            continue
        if key not in sources:
            raise StateError(f"{view.where(key)}: the dataset has no source {key!r}")
        entry.integer(k.EPOCH)
        done = entry.view(k.DONE)
        total = sources[key][k.RECORDS]
        for epoch, intervals in done.data.items():
            where = done.where(epoch)
            if not epoch.isdigit():
                raise StateError(f"{where}: an epoch is a number, not {epoch!r}")
            if not isinstance(intervals, list):
                raise StateError(f"{where}: expected a list of [start, stop], found {intervals!r}")
            for i, iv in enumerate(intervals):
                if not (isinstance(iv, list) and len(iv) == 2):
                    raise StateError(f"{where}[{i}]: expected [start, stop], found {iv!r}")
                a = check_int(iv[0], f"{where}[{i}][0]", 0, total)
                check_int(iv[1], f"{where}[{i}][1]", a, total)
