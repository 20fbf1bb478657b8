"""A loader's ``set_weights`` calls: checked alike over ranks at ``state_dict()``, and saved for a replay.

Every rank must set the same weights after the same number of batches. ``set_weights()`` itself
cannot check it: a check needs every rank in a collective at the same moment, and a rank that
calls it a step later than another is elsewhere then (in its forward pass, or in the step's
own all_reduce), so both would wait for ever. Each rank records its calls instead,
``[pass, batches, {stream: weight}]`` ("after ``batches`` batches of pass ``pass``"), and the
next ``state_dict()`` compares them: it gathers every rank's state anyway, and every rank calls
it at the same step. Ranks whose calls differ are named, with their calls, in an
:class:`~tidal.ArgumentError` raised on every rank (:func:`agree`).

A state keeps the calls since the ``state_dict()`` before it (``"weight_calls"``: the last
:data:`KEPT` of them, and how many the run made in all), so a replay from the state before
(``tidal state verify``) makes them again at their steps; a run that never called
``set_weights`` saves nothing of it.
"""

from __future__ import annotations

import hashlib
import json
from collections import deque
from collections.abc import Callable

from tidal.errors import ArgumentError, StateError
from tidal.state import keys as k
from tidal.state.view import View, check_int

KEPT = 256  # calls a state keeps: a few kilobytes

Call = list  # [pass, batches, {stream: weight}]


class Calls:
    """This rank's calls: over the run (``total``, from the state it resumed from on) and since
    the last ``state_dict()`` (:meth:`taken`): how many, a digest of all of them, the last :data:`KEPT`."""

    def __init__(self, saved: dict | None = None):
        self.total = int(saved[k.TOTAL]) if saved else 0
        self.log: deque[Call] = deque(maxlen=KEPT)
        self.made = 0
        self.digest = ""

    def add(self, pass_: int, batches: int, weights: dict[str, float]) -> None:
        call = [pass_, batches, dict(weights)]
        self.log.append(call)
        self.made += 1
        self.total += 1
        self.digest = hashlib.sha256((self.digest + json.dumps(call, sort_keys=True)).encode()).hexdigest()

    def mine(self, weights: dict[str, float] | None) -> dict:
        """What the ranks compare (:func:`agree`), with the weights in force (``weights``)."""
        return {"made": self.made, "digest": self.digest, "log": list(self.log), "weights": weights}

    def saved(self, before: tuple[Call, ...] | list[Call] = ()) -> dict | None:
        """The state's ``"weight_calls"`` (``before``: calls the state already held); None before any call."""
        if not self.total:
            return None
        return {k.TOTAL: self.total, k.CALLS: [*before, *self.log][-KEPT:]}

    def taken(self) -> None:
        """A state was taken: the calls since start afresh."""
        self.log.clear()
        self.made, self.digest = 0, ""


def agree(every: list[dict]) -> None:
    """That every rank made the same calls since the last check and has the same weights in force
    (``every``: per rank, :meth:`Calls.mine`)."""
    calls = [(e["made"], e["digest"]) for e in every]
    weights = [e["weights"] for e in every]
    if len(set(calls)) == 1 and all(w == weights[0] for w in weights):
        return
    groups: dict[str, list[int]] = {}
    for r, e in enumerate(every):
        groups.setdefault(json.dumps([e["made"], e["digest"], e["weights"]], sort_keys=True), []).append(r)
    parts = []
    for ranks in groups.values():
        e = every[ranks[0]]
        shown = "; ".join(_call(c) for c in e["log"][:3]) + ("; ..." if len(e["log"]) > 3 else "")
        if e["made"] > len(e["log"]):
            shown = f"{e['made']} calls, the last {shown}"
        now = _weights(e["weights"]) if e["weights"] is not None else "the mixture's own"
        parts.append(f"{_ranks(ranks)}: {shown or 'no call'} (in force: {now})")
    raise ArgumentError(
        "set_weights() was not called alike on every rank since the last state_dict(), which this state_dict() "
        f"checks: {' | '.join(parts)}. Call it on every rank after the same number of batches with the same "
        "weights (compute them from values every rank shares, e.g. losses all-reduced first); the ranks have "
        "read under different mixtures since"
    )


def _call(call: Call) -> str:
    pass_, batches, weights = call
    where = f"after batch {batches}" + (f" of pass {pass_}" if pass_ else "")
    return f"{_weights(weights)} {where}"


def _weights(weights: dict[str, float]) -> str:
    return "{" + ", ".join(f"{n}: {w:g}" for n, w in weights.items()) + "}"


def _ranks(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    shown = ", ".join(map(str, ranks[:8])) + (", ..." if len(ranks) > 8 else "")
    return f"ranks {shown}"


def check(view: View, check_weights: Callable[[View], None]) -> None:
    """That a state's ``"weight_calls"`` (``view``) are well formed; ``check_weights`` checks each call's weights."""
    view.only(k.TOTAL, k.CALLS)
    total = view.integer(k.TOTAL)
    calls = view.entries(k.CALLS)
    if len(calls) > total:
        raise StateError(f"{view.where(k.CALLS)}: {len(calls)} calls, more than {view.where(k.TOTAL)} ({total})")
    for i, call in enumerate(calls):
        at = f"{view.where(k.CALLS)}[{i}]"
        if not (isinstance(call, list) and len(call) == 3):
            raise StateError(f"{at}: expected [pass, batches, {{stream: weight}}], found {call!r}")
        check_int(call[0], f"{at}[0]")
        check_int(call[1], f"{at}[1]")
        check_weights(View(call[2], f"{at}[2]"))
