"""Elastic restores: a state saved on one topology, resumed on another.

Each reader (rank x worker) reads a *share* of every epoch: intervals of the epoch's
positions (:func:`tidal.order.share`). A reader's state says how far into its share it is
(``consumed``: ``{source: [epoch, offset]}``). Gathered over all readers, these give, per
source, which positions of the epochs in progress are used up: the ``progress``
``{source: {"epoch": first epoch in progress, "done": {epoch: [[start, stop], ...]}}}``.
A loader on a different topology hands that to its readers as their *origin*: each takes an
equal part of what is left of those epochs, then carries on with whole epochs as usual.
Nothing left is dropped: the remainder a finite epoch leaves unread on the old topology is
read on the new one.

Granularity: records for plain, mapped, filtered and batched streams; documents for
``pack("concat")`` (the document in progress counts as used, so the rest of its tokens is
dropped); for ``pack("best_fit")``, its buffer in progress is packed again.
"""

from __future__ import annotations

from tidal.order import cut_intervals, share, union


def progress(sources: dict, consumed: list[dict | None], origin: dict | None, first_epoch: int) -> dict:
    """Used-up positions per source, from every reader's ``consumed`` (``None``: not started).

    ``sources`` maps each source key to ``{"records": per epoch, "finite": bool}``;
    ``consumed`` is indexed by reader (rank-major), so its length is the topology's reader
    count; ``origin`` is the progress these readers were restored from, if any.
    """
    readers = len(consumed)
    out = {}
    for key, src in sources.items():
        base = (origin or {}).get(key) or {"epoch": first_epoch, "done": {}}
        at = [list(c[key]) if c and key in c else [int(base["epoch"]), 0] for c in consumed]
        first, last = min(e for e, _ in at), max(e for e, _ in at)
        done = {}
        for epoch in range(first, last + 1):
            prior = [tuple(iv) for iv in base["done"].get(str(epoch), [])]
            used = list(prior)
            for reader, (e, offset) in enumerate(at):
                if e < epoch:
                    continue
                part = share(src["records"], prior, readers, reader, drop_remainder=src["finite"])
                used += part if e > epoch else cut_intervals(part, 0, offset)
            merged = union(used)
            if merged:
                done[str(epoch)] = [list(iv) for iv in merged]
        out[key] = {"epoch": first, "done": done}
    return out


def records_done(progress_of_source: dict) -> int:
    """How many positions of the epochs in progress are used up."""
    return sum(b - a for intervals in progress_of_source["done"].values() for a, b in intervals)
