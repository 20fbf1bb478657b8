"""Mixing several datasets into one stream, as a pure function of (seed, reader, draw index).

Each reader (rank x worker) reads its own share of every stream and draws which stream
gives its next record: in blocks of ``BLOCK`` draws, each block drawn from
``rng(seed, reader, block)`` with the weights the schedule gives at that point, so a resumed
reader draws exactly what it would have. With ``counts`` (``choose``/``repeat``/
``epoch_size``) a *mixture epoch* takes exactly that many records of each stream, in an order
shuffled per mixture epoch.

``stop``: ``"first_exhausted"`` ends the mixture when any stream ends; ``"all_exhausted"``
restarts streams that end (their next epochs) until every stream has ended at least once;
``"never"`` restarts them forever.

Schedules are over *records drawn by all readers* (this reader's draws times the number of
readers): a training step of a global batch of ``B`` records is ``B`` of them.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from tidal.errors import ArgumentError, ConfigError, StateError
from tidal.order import rng
from tidal.stages import Context, Locator, Stage, StageIterator, add_stats, walk
from tidal.stages.batch import Batch
from tidal.stages.locators import Joined
from tidal.stages.policy import book_kept, reports_kept
from tidal.stages.weights import in_force
from tidal.state import keys as k
from tidal.state.view import View
from tidal.tables import Table, records

if TYPE_CHECKING:
    from tidal.stages.read import Read, ReadPlan

BLOCK = 1024
COUNTED = 1024  # calls a mixture remembers its counts at (counts_at): a packing buffer's worth, many times over
STOPS = ("first_exhausted", "all_exhausted", "never")
NOT_COUNTERS = ("passed", "weights_in_force")  # in stats(): a position, weights: not kept past a stream's restart
Weights = Mapping[str, float]


class Schedule:
    """Weights as a function of the number of records drawn so far (over all readers)."""

    def __call__(self, k: int) -> Weights:
        raise NotImplementedError

    def to_config(self) -> dict:
        """This schedule in a pipeline config: ``{"linear": {"start": ..., "end": ..., "steps": n}}``."""
        raise ConfigError(f"{self!r}: only tidal's schedules (Piecewise, Linear, Cosine) can be written in a config")


@dataclass(frozen=True)
class Piecewise(Schedule):
    """``[(0, {"web": 0.9, "code": 0.1}), (10_000, {"web": 0.5, "code": 0.5})]``: each from its step on."""

    points: tuple[tuple[int, Weights], ...]

    def __post_init__(self) -> None:  # a list of pairs, or pairs read from a config: one value, one repr
        object.__setattr__(self, "points", tuple((start, weights) for start, weights in self.points))

    def __call__(self, k: int) -> Weights:
        current = self.points[0][1]
        for start, weights in self.points:
            if k >= start:
                current = weights
        return current

    def to_config(self) -> dict:
        return {"piecewise": [[start, dict(weights)] for start, weights in self.points]}


@dataclass(frozen=True)
class Linear(Schedule):
    """From ``start`` weights to ``end`` weights over ``steps`` records, then ``end``."""

    start: Weights
    end: Weights
    steps: int

    def _t(self, k: int) -> float:
        return min(max(k / self.steps, 0.0), 1.0)

    def __call__(self, k: int) -> Weights:
        t = self._t(k)
        return {n: (1 - t) * self.start[n] + t * self.end[n] for n in self.start}

    def to_config(self) -> dict:
        return {type(self).__name__.lower(): {"start": dict(self.start), "end": dict(self.end), "steps": self.steps}}


@dataclass(frozen=True)
class Cosine(Linear):
    """Like :class:`Linear`, along half a cosine: slow at both ends."""

    def _t(self, k: int) -> float:
        return (1 - math.cos(math.pi * super()._t(k))) / 2


SCHEDULES: dict[str, type[Schedule]] = {"piecewise": Piecewise, "linear": Linear, "cosine": Cosine}


@dataclass(frozen=True, repr=False)
class Mix(Stage):
    """Several streams as one: which stream gives each record is a pure function of (seed, reader, draw)."""

    streams: tuple[tuple[str, Stage], ...]
    weights: Schedule | tuple[float, ...] | None  # None: counts decide
    counts: tuple[int, ...] | None  # records of each stream per mixture epoch, all readers together
    seed: int
    stop: str

    def open(self, ctx: Context, position: View | None) -> StageIterator:
        return MixIterator(self, ctx, position)

    def describe(self) -> list:
        w = self.weights if isinstance(self.weights, (tuple, type(None))) else repr(self.weights)
        streams = [[n, s.describe()] for n, s in self.streams]
        return [["Mix", streams, w, self.counts, self.seed, self.stop]]

    def call(self) -> str:
        streams = ", ".join(f"{n!r}: {s!r}" for n, s in self.streams)
        how = f"weights={self.weights!r}" if self.weights is not None else f"counts={self.counts}"
        return f"mix({{{streams}}}, {how}, seed={self.seed}, stop={self.stop!r})"

    def sources(self, key: str = "") -> dict[str, ReadPlan]:
        return {k2: p for n, s in self.streams for k2, p in s.sources(f"{key}{n}/").items()}

    def epochs_per_pass(self) -> int:
        return 0

    def finite(self) -> bool:
        return self.stop != "never"

    def with_source(self, change: Callable[[Read], Read]) -> Stage:
        raise ArgumentError("shuffle() and repeat() apply to files: call them on the streams before mix()")

    def upstreams(self) -> tuple[Stage, ...]:
        return tuple(s for _, s in self.streams)

    def first_weights(self) -> dict[str, float]:
        return weights_at(self, 0, 1)

    def mixed_streams(self) -> list[str] | None:
        if self.weights is None:
            raise ArgumentError(
                "set_weights(): this mixture draws exact counts per mixture epoch (choose=, repeat= or "
                "epoch_size=); live weights apply to a mixture of weights"
            )
        return [n for n, _ in self.streams]

    def to_config(self) -> dict:
        names = [n for n, _ in self.streams]
        out: dict[str, Any] = {"streams": {n: s.to_config() for n, s in self.streams}}
        if isinstance(self.weights, Schedule):
            out["weights"] = self.weights.to_config()
        elif self.weights is not None:
            out["weights"] = dict(zip(names, self.weights, strict=True))
        else:  # choose, repeat and epoch_size all come to exact counts per mixture epoch
            out["choose"] = dict(zip(names, self.counts or (), strict=True))
        out.update(seed=self.seed, stop=self.stop)
        return {"mix": out, "steps": []}


def mix(
    streams: Sequence[tuple[str, Stage]],
    weights: Mapping[str, float] | Sequence[float] | Schedule | None,
    seed: int,
    stop: str,
    choose: Mapping[str, int] | None,
    repeat: Mapping[str, float] | None,
    epoch_size: int | None,
) -> Mix:
    """The :class:`Mix` of named streams, its arguments checked (see :func:`tidal.mix`)."""
    streams = tuple(streams)
    names = [n for n, _ in streams]
    if not streams:
        raise ArgumentError("mix() needs at least one dataset")
    if len(set(names)) != len(names):
        raise ArgumentError(f"mix(): stream names must differ, got {names}")
    for n, s in streams:
        if any(isinstance(x, Batch) for x in walk(s)):
            raise ArgumentError(f"mix(): stream {n!r} is batched; mix records, then batch the mixture")
    if stop not in STOPS:
        raise ArgumentError(f"stop must be one of {', '.join(STOPS)}, not {stop!r}")
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ArgumentError(f"seed must be a non-negative int, not {seed!r}")

    def by_name(values: Mapping[str, Any] | Sequence[Any], what: str) -> list[Any]:
        if isinstance(values, Mapping):
            unknown = set(values) - set(names)
            if unknown:
                raise ArgumentError(f"mix(): {what} names unknown streams {sorted(unknown)}; streams: {names}")
            return [values.get(n) for n in names]
        if len(values) != len(names):
            raise ArgumentError(f"mix(): {len(values)} {what} for {len(names)} streams")
        return list(values)

    counts = None
    if choose is not None or repeat is not None:
        if weights is not None:
            raise ArgumentError("mix(): give weights, or choose/repeat, not both")
        chosen = by_name(choose or {}, "choose")
        repeats = by_name(repeat or {}, "repeat")
        for n, c in zip(names, chosen, strict=True):
            if c is not None and (not isinstance(c, (int, np.integer)) or isinstance(c, bool) or c < 0):
                raise ArgumentError(f"mix(): choose for stream {n!r} must be a whole number of records, not {c!r}")
        for n, r in zip(names, repeats, strict=True):
            if r is not None and (
                isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(r) or r < 0
            ):
                raise ArgumentError(f"mix(): repeat for stream {n!r} must be a non-negative number, not {r!r}")
        sizes = [sum(p.total for p in s.sources().values()) for _, s in streams]
        counts = [
            int(c) if c is not None else round(r * n) if r is not None else n
            for c, r, n in zip(chosen, repeats, sizes, strict=True)
        ]
        if stop == "first_exhausted":  # the others go on past a stream's end, reading it again
            for (n, s), count, size in zip(streams, counts, sizes, strict=True):
                _check_count(n, s, count, size)
        return Mix(streams, None, tuple(counts), seed, stop)
    if weights is None:
        weights = [1.0] * len(names)
    if isinstance(weights, Schedule):
        by_name(weights(0), "weights")
        return Mix(streams, weights, None, seed, stop)
    given = by_name(weights, "weights")
    try:
        w = [float(x if x is not None else 0.0) for x in given]
    except (TypeError, ValueError):
        raise ArgumentError(f"mix(): weights must be numbers, got {weights!r}") from None
    if not all(math.isfinite(x) and x >= 0 for x in w) or sum(w) <= 0:
        shown = dict(zip(names, w, strict=True))
        raise ArgumentError(f"mix(): weights must be finite, non-negative and not all zero, got {shown}")
    if epoch_size is not None:
        if isinstance(epoch_size, bool) or not isinstance(epoch_size, (int, np.integer)) or epoch_size < 1:
            raise ArgumentError(
                f"mix(): epoch_size must be a whole number of records of at least 1, not {epoch_size!r}"
            )
        total = sum(w)
        return Mix(streams, None, tuple(round(epoch_size * x / total) for x in w), seed, stop)
    return Mix(streams, tuple(w), None, seed, stop)


def weights_at(mix: Mix, k: int, consumers: int) -> dict[str, float]:
    """The weights, normalized, a reader of ``consumers`` draws its draw ``k`` with (counts as
    proportions; a schedule at the start of the draw's block, as :meth:`MixIterator._choices`)."""
    names = [n for n, _ in mix.streams]
    if mix.counts is not None:
        values = [float(c) for c in mix.counts]
    elif isinstance(mix.weights, Schedule):
        at = mix.weights((k // BLOCK) * BLOCK * consumers)
        values = [float(at[n]) for n in names]
    else:
        values = [float(w) for w in mix.weights or ()]
    total = sum(values)
    return {n: v / total if total else 0.0 for n, v in zip(names, values, strict=True)}


def _check_count(name: str, stream: Stage, count: int, size: int) -> None:
    """A count a stream that does not repeat cannot reach is an error now, not a mixture that ends
    early (``stop="first_exhausted"`` ends it with that stream): where every stage of the stream yields one item per record, it yields ``size`` items a
    pass over its epochs."""
    from tidal.stages.read import Read
    from tidal.stages.tokenize import Tokenize
    from tidal.stages.transform import Map

    epochs = stream.epochs_per_pass()
    if epochs == 0 or not all(isinstance(x, (Read, Map, Tokenize)) for x in walk(stream)):
        return  # it repeats forever, or it is not known how many items it yields
    if count > size * epochs:
        raise ArgumentError(
            f"mix(): stream {name!r} is asked for {count:,} records, but it holds {size:,} and reads them "
            f"{epochs} time(s) (it does not repeat forever), and stop='first_exhausted' would end the mixture "
            "there: call .repeat() on it, ask for fewer, or pass stop='all_exhausted' or 'never'"
        )


class MixIterator(StageIterator):
    """Draws each record from one of several streams; position: draws so far and each stream's position."""

    def __init__(self, mix: Mix, ctx: Context, position: View | None):
        self._mix, self._ctx, self._world = mix, ctx, ctx.world
        self._names = [n for n, _ in mix.streams]
        self._stages = dict(mix.streams)
        self._order_cache: tuple[int, np.ndarray] | None = None
        self.drawn = dict.fromkeys(self._names, 0)
        self.tokens = dict.fromkeys(self._names, 0)
        self._counted: deque[tuple[int, dict[str, int], dict[str, int]]] = deque(maxlen=COUNTED)  # see counts_at
        saved: dict[str, View | None] = dict.fromkeys(self._names)
        if position is None:
            origin = (ctx.origin or {}).get(ctx.key + k.MIX) or {}
            self._k = int(origin.get(k.DRAWS, 0)) // self._world.consumers  # after an elastic restore
            self._passes = dict.fromkeys(self._names, 0)
            self._ended: set[str] = set()
            self._empty: set[str] = set()  # streams with nothing for this reader
            self._fresh: set[str] = set()  # restarted, not yet read from
        else:
            self._k = position.integer(k.DRAWS)
            passes = position.view(k.PASSES)
            self._passes = {n: passes.integer(n) for n in self._names}
            self._ended, self._empty, self._fresh = (self._known(position, key) for key in (k.ENDED, k.EMPTY, k.FRESH))
            streams = position.view(k.STREAMS)
            saved = {n: streams.view(n) for n in self._names}
        self._streams = {n: self._open(n, saved[n]) for n in self._names}
        self._book = book_kept()  # where its readers record the bad records they report (set_weights)
        self._spent: dict = {}  # the counters of the streams' readers closed to restart them
        self._parts: list[tuple[int, Locator]] = []  # where the items of the last table came from
        live = ctx.weights if not ctx.key else None  # weights set on a running loader: the top mixture's
        self._changes = live.attach(self._world.lane, self._world.lanes, self._names, self) if live else []
        if self._changes and mix.counts is not None:
            raise StateError("mixture weights saved for a mixture of exact counts (choose/repeat/epoch_size)")

    @property
    def names(self) -> list[str]:
        """The streams, in order."""
        return self._names

    @property
    def draws(self) -> int:
        """Records this reader has drawn (its next draw's index)."""
        return self._k

    def _known(self, position: View, key: str) -> set[str]:
        names = position.names(key)
        unknown = set(names) - set(self._names)
        if unknown:
            raise StateError(f"{position.where(key)}: no stream named {sorted(unknown)[0]!r} in this mixture")
        return set(names)

    def _open(self, name: str, position: View | None) -> StageIterator:
        stage = self._stages[name]
        first = self._passes[name] * stage.epochs_per_pass()
        ctx = Context(
            self._world,
            first,
            self._ctx.origin,
            f"{self._ctx.key}{name}/",
            trace=self._ctx.trace,
            replay=self._ctx.replay,
        )
        return stage.open(ctx, position)

    def _choices(self, k: int, n: int) -> np.ndarray:
        """The streams of draws ``k .. k+n`` (fewer at a block or mixture-epoch end)."""
        mix, reader = self._mix, self._world.consumer
        if mix.counts is not None:
            per_reader = [c // self._world.consumers + (reader < c % self._world.consumers) for c in mix.counts]
            size = sum(per_reader)
            if size == 0:
                raise ArgumentError("mix(): the counts give this reader no record per mixture epoch")
            epoch, at = divmod(k, size)
            if self._order_cache is None or self._order_cache[0] != epoch:
                order = np.repeat(np.arange(len(per_reader), dtype=np.int32), per_reader)
                rng(mix.seed, 4, reader, epoch).shuffle(order)
                self._order_cache = (epoch, order)
            return self._order_cache[1][at : at + n]
        block, at = divmod(k, BLOCK)
        w: Weights | None
        w, until = in_force(self._changes, k)  # weights set on the loader, and the draw of the next change
        if until is not None:
            n = min(n, until - k)
        if w is None and isinstance(mix.weights, Schedule):
            w = mix.weights(block * BLOCK * self._world.consumers)
        p = np.array([w[n] for n in self._names] if w is not None else mix.weights, dtype=np.float64)
        p /= p.sum()
        draws = rng(mix.seed, 3, reader, block).choice(len(p), size=BLOCK, p=p)
        return draws[at : at + n]

    def next(self, max_items: int) -> Table:
        if not self._counted or self._counted[-1][0] != self._k:
            self._counted.append((self._k, dict(self.drawn), dict(self.tokens)))
        out: list[Any] = []
        parts: list[tuple[int, Locator]] = []
        while len(out) < max_items:
            if len(self._empty) == len(self._names):
                break
            choices = self._choices(self._k, max_items - len(out))
            run = int(np.argmax(choices != choices[0])) or len(choices)  # a run of one stream
            name = self._names[int(choices[0])]
            if name in self._empty:
                self._k += 1  # a draw of a stream this reader has no record of: passed over
                continue
            try:
                got = records(self._streams[name].next(run))
            except StopIteration:
                if name in self._fresh:  # ended again before giving anything: empty for this reader
                    self._empty.add(name)
                    self._ended.add(name)
                    continue
                if not self._restart(name):
                    break
                continue
            self._fresh.discard(name)
            self._k += len(got)
            self.drawn[name] += len(got)
            self.tokens[name] += sum(len(r["input_ids"]) for r in got if isinstance(r, dict) and "input_ids" in r)
            parts.append((len(out), self._streams[name].locate()))
            out += got
        if not out:
            raise StopIteration
        self._parts = parts
        return out

    def locate(self) -> Locator:
        return Joined(self._parts)

    def _restart(self, name: str) -> bool:
        """A stream ended: restart it (its next epochs) unless the stop rule ends the mixture."""
        self._ended.add(name)
        stop = self._mix.stop
        if stop == "first_exhausted" or (stop == "all_exhausted" and self._ended >= set(self._names)):
            return False
        ended = self._streams[name]
        ended.close()
        counters = {key: v for key, v in ended.stats().items() if key not in NOT_COUNTERS}
        self._spent = add_stats(self._spent, counters)  # what it read and skipped still counts
        self._passes[name] += 1
        with reports_kept(self._book):  # its next epochs' readers record and skip as the others do
            self._streams[name] = self._open(name, None)
        self._fresh.add(name)
        return True

    def position(self) -> dict:
        return {
            k.DRAWS: self._k,
            k.PASSES: dict(self._passes),
            k.ENDED: sorted(self._ended),
            k.EMPTY: sorted(self._empty),
            k.FRESH: sorted(self._fresh),
            k.STREAMS: {n: s.position() for n, s in self._streams.items()},
        }

    def used(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for s in self._streams.values():
            out.update(s.used())
        return out

    def weights_now(self) -> dict[str, float]:
        """The weight each stream is drawn with at the next draw, normalized: those set on the
        loader (``set_weights``) where they are in force, else the mixture's own."""
        return self.drawn_with(self._k)

    def drawn_with(self, draw: int) -> dict[str, float]:
        """The weights, normalized, this reader draws (or drew) its draw ``draw`` with."""
        live, _ = in_force(self._changes, draw)
        if live is None or self._mix.counts is not None:
            return weights_at(self._mix, draw, self._world.consumers)
        total = sum(live.get(n, 0.0) for n in self._names)
        return {n: live.get(n, 0.0) / total for n in self._names}

    def counts_at(self, draw: int) -> tuple[dict[str, int], dict[str, int]]:
        """Records and tokens of each stream this iterator had drawn when its draw count was
        ``draw``: now, or at the start of a call it answered since (a packing stage's position
        holds the mixture's where its buffer began). Older than those remembered: now."""
        counted = self._counted
        if draw < self._k:
            while len(counted) > 1 and counted[1][0] <= draw:
                counted.popleft()  # positions only move on: older counts are not asked for again
            if counted and counted[0][0] == draw:
                return dict(counted[0][1]), dict(counted[0][2])
        return dict(self.drawn), dict(self.tokens)

    def stats(self) -> dict:
        mine = {
            "records_per_stream": dict(self.drawn),
            "tokens_per_stream": dict(self.tokens),
            "weights_in_force": self.weights_now(),
        }
        return add_stats(self._spent, *(s.stats() for s in self._streams.values()), mine)

    def close(self) -> None:
        for s in self._streams.values():
            s.close()
