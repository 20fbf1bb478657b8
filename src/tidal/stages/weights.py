"""Live mixture weights: weights set on a running loader (``loader.set_weights``), exactly replayable.

A mixture draws which stream gives each record as a pure function of (seed, reader, draw
index) and the weights in force at that draw (:mod:`tidal.stages.mix`). Weights set while a
run goes on are *changes*: ``[draw, {name: weight}]``, "from this reader's draw ``draw`` on,
these weights", oldest first; before the first change the mixture's own weights (or schedule)
hold. Each reader (each lane of a reader, for continuous rows) has its own list, since each
draws at its own pace.

A change is made when a reader is reopened at the state after the last batch the training
loop consumed (:meth:`Live.switch`): it takes effect at the mixture's draw count once the
chain stands at that state again, past every draw that fed a consumed batch, so nothing the
loop already saw is drawn again differently. The reader state keeps the changes its
position still needs (``"weights"``: per lane, the changes from the one in force at the
mixture's draw in the saved position on, :meth:`Live.saved`), a few entries at most whatever
the number of calls, so a restored reader replays the same draws.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping
from typing import Any, Protocol

from tidal.errors import ArgumentError, StateError, TidalError
from tidal.state import keys as k

Change = tuple[int, dict[str, float]]
"""From this reader's draw ``[0]`` on, the weights ``[1]``."""


def checked(
    weights: Any, names: list[str], where: str = "set_weights()", error: type[TidalError] = ArgumentError
) -> dict[str, float]:
    """``weights`` as ``{name: float}`` over ``names`` (streams left out: 0, as in ``mix()``),
    or ``error`` saying what is wrong: unknown names, a value that is not a finite non-negative
    number, or all of them zero."""
    if not isinstance(weights, Mapping):
        raise error(f"{where}: weights are a dict of stream name to weight, not {type(weights).__name__}")
    unknown = sorted(str(n) for n in set(weights) - set(names))
    if unknown:
        raise error(f"{where}: no stream named {unknown[0]!r} in this mixture; its streams: {names}")
    out: dict[str, float] = {}
    for name in names:
        value = weights.get(name, 0.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise error(f"{where}: the weight of {name!r} must be a finite, non-negative number, not {value!r}")
        out[name] = float(value)
    if sum(out.values()) <= 0:
        raise error(f"{where}: the weights are all zero; at least one stream needs a positive weight")
    return out


def in_force(changes: list[Change], draw: int) -> tuple[dict[str, float] | None, int | None]:
    """The weights set for ``draw`` (None: the mixture's own) and the draw of the next change (None: none)."""
    i = bisect.bisect_right([c[0] for c in changes], draw)
    return (changes[i - 1][1] if i else None), (changes[i][0] if i < len(changes) else None)


class Drawing(Protocol):
    """What :class:`Live` asks of a mixture that draws with its changes
    (:class:`tidal.stages.mix.MixIterator`): the mixture imports this module, not the reverse."""

    drawn: dict[str, int]
    tokens: dict[str, int]

    @property
    def names(self) -> list[str]: ...

    @property
    def draws(self) -> int: ...

    def counts_at(self, draw: int) -> tuple[dict[str, int], dict[str, int]]: ...

    def drawn_with(self, draw: int) -> dict[str, float]: ...


class Live:
    """One reader's changes, per lane, and the mixtures that draw with them.

    ``saved``: the reader state's ``"weights"`` (None: no change yet); ``where``: how errors
    name it. Each lane's top mixture attaches itself when it opens (:meth:`attach`).
    """

    def __init__(self, saved: Any, where: str):
        if saved is not None and not isinstance(saved, list):
            raise StateError(f"{where}: expected a list of changes per row, found {saved!r}")
        self._saved: list | None = saved
        self._where = where
        self._lanes: dict[int, tuple[list[Change], Drawing]] = {}
        self.coming: Mapping[str, float] | None = None  # the weights switch() will set, once the chain is open

    @property
    def switching(self) -> bool:
        """Whether :attr:`coming` changes the weights of a mixture attached so far: a packing stage
        above it then reads again only the documents it had begun (:mod:`tidal.stages.pack`), so
        that the next ones are drawn under them."""
        if self.coming is None:
            return False
        return any(
            not changes or changes[-1][1] != checked(self.coming, mix.names) for changes, mix in self._lanes.values()
        )

    def attach(self, lane: int, lanes: int, names: list[str], mix: Drawing) -> list[Change]:
        """The changes of lane ``lane`` (of ``lanes``), read from the saved state and checked;
        ``mix`` draws with them, and :meth:`switch` changes them."""
        changes: list[Change] = []
        if self._saved is not None:
            if len(self._saved) != lanes:
                raise StateError(f"{self._where}: {len(self._saved)} rows of changes where this reader streams {lanes}")
            entries = self._saved[lane]
            at = f"{self._where}[{lane}]"
            if not isinstance(entries, list):
                raise StateError(f"{at}: expected a list of [draw, weights], found {entries!r}")
            for i, entry in enumerate(entries):
                if not (isinstance(entry, list) and len(entry) == 2):
                    raise StateError(f"{at}[{i}]: expected [draw, {{stream: weight}}], found {entry!r}")
                draw = entry[0]
                if type(draw) is not int or draw < 0 or (changes and draw <= changes[-1][0]):
                    raise StateError(f"{at}[{i}][0]: {draw!r} is not a draw after the change before it")
                changes.append((draw, checked(entry[1], names, f"{at}[{i}][1]", StateError)))
        self._lanes[lane] = (changes, mix)
        return changes

    def check_attached(self) -> None:
        """Saved changes with no mixture to draw with them do not belong to this chain."""
        if self._saved and not self._lanes:
            raise StateError(f"{self._where}: mixture weights saved for a chain without tidal.mix()")

    def switch(self, weights: Mapping[str, float]) -> None:
        """From each mixture's next draw on, ``weights`` (nothing changes where they are in force already)."""
        for changes, mix in self._lanes.values():
            now = checked(weights, mix.names)
            draw = mix.draws
            if changes and changes[-1][1] == now:
                continue
            if changes and changes[-1][0] == draw:
                changes[-1] = (draw, now)  # the change before had no draw yet
            else:
                changes.append((draw, now))

    def saved(self, position: dict) -> list | None:
        """The changes a reader at ``position`` needs, per lane, JSON-able; None where there are none."""
        if not any(changes for changes, _ in self._lanes.values()):
            return None
        draws = _draws(position)
        out = []
        for lane in range(max(self._lanes) + 1):
            changes = self._lanes[lane][0] if lane in self._lanes else []
            at = draws[lane] if lane < len(draws) else 0
            first = max(bisect.bisect_right([c[0] for c in changes], at) - 1, 0)
            out.append([[draw, dict(w)] for draw, w in changes[first:]])
        return out

    def streams(self, position: dict) -> tuple[dict, dict, dict, dict, dict] | None:
        """What the top mixture of every lane has drawn, for a batch's mark (:mod:`tidal.metrics`):
        per stream the records and tokens drawn so far and those drawn up to ``position`` (the
        reader's, which a packing stage holds where its buffer began), and the weights the
        records at ``position`` are drawn with (the lanes' mean). None without a mixture."""
        if not self._lanes:
            return None
        draws = _draws(position)
        records: dict[str, int] = {}
        tokens: dict[str, int] = {}
        records_at: dict[str, int] = {}
        tokens_at: dict[str, int] = {}
        weights: dict[str, float] = {}
        for lane, (_, mix) in self._lanes.items():
            at = draws[lane] if lane < len(draws) else mix.draws
            then = mix.counts_at(at)
            for into, counts in (
                (records, mix.drawn),
                (tokens, mix.tokens),
                (records_at, then[0]),
                (tokens_at, then[1]),
            ):
                for name, n in counts.items():
                    into[name] = into.get(name, 0) + n
            for name, w in mix.drawn_with(at).items():
                weights[name] = weights.get(name, 0.0) + w / len(self._lanes)
        return records, tokens, weights, records_at, tokens_at


def _draws(position: Any) -> list[int]:
    """Per lane, the draws of the top mixture in a reader position (a buffering stage's
    position holds its upstream's where its buffer began)."""
    while isinstance(position, dict):
        if isinstance(position.get(k.ROWS), list):
            return [(_draws(row) or [0])[0] for row in position[k.ROWS]]
        if k.STREAMS in position:
            return [int(position[k.DRAWS])]
        position = position.get(k.UPSTREAM)
    return []


def for_streams(names: list[str] | None, weights: Any) -> dict[str, float]:
    """``weights`` checked for the streams of a chain's top mixture, ``stage.mixed_streams()``
    (``loader.set_weights``)."""
    if names is None:
        raise ArgumentError("set_weights(): this dataset has no mixture; build it with tidal.mix(...)")
    return checked(weights, names)
