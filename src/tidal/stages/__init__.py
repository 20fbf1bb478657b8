"""Stages: the steps of a pipeline as frozen descriptions, and the iterators they open.

A :class:`Stage` says what a step does (read these shards in this order, batch by 8, pack
into 2048 tokens), never how far it has got. It is a small frozen value, so a whole chain
pickles: it crosses into spawn and forkserver DataLoader workers, Ray tasks and JAX
processes, and ``repr`` shows it. ``stage.open(ctx, position)`` opens a
:class:`StageIterator` over the stage's upstream, either at the start (``position=None``) or at
a saved position: one code path for starting and for resuming. A stage opens its upstream
itself, with the upstream's part of the position, read through :class:`tidal.state.View`,
so a malformed position is an error naming its key.

A :class:`StageIterator` returns 1 to ``max_items`` items per ``next`` (``StopIteration`` at
the end) and reports ``position()``: exactly where it is after the last item it returned. A
stage never takes more from upstream than its items need, so the position is exact at every
call; a stage that buffers (packing) saves where its buffer began upstream and an offset
into it, never the buffer. ``used()`` says how far into its share of each source the reader
is (``{source key: [epoch, offset]}``), which is what a restore on another topology needs.
``exact`` is true when each item stands for exactly one source record, in order.

A stage that finds a record it cannot use (a null where tokenize needs text, a document pack
cannot pack) hands it back with ``upstream.locate().reject(i, why)``: item ``i`` of the table
upstream returned last. The source stage names its file and row and puts it to the reader's
``errors`` policy (raised, or skipped and counted); stages in between map the index to theirs.

Provenance rides on the same locators: ``locate().origins(i)`` is what item ``i`` is made
of, as :class:`~tidal.stages.locators.Origin` values (file, row, token range, stream, epoch), and
``rows(i)`` the rows of a batch item (:mod:`tidal.provenance`); the locators are
:mod:`tidal.stages.locators`. Stages that would do work to know it (packing, batching)
do it only when opened with ``Context(trace=True)``; the normal path pays nothing.

``stage.to_config()`` writes the chain as plain data, each stage its own part
(``config_step()``); :mod:`tidal.config` reads it back. A step is declared once, as a
:class:`Declared` dataclass: the :class:`tidal.Dataset` method that makes it (``METHOD``) and
that method's arguments, its fields. The config schema (which keys each step takes, which it
needs) and the step a config holds are both made from those fields.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import MISSING, dataclass, fields, replace
from typing import TYPE_CHECKING, Any, ClassVar

from tidal.errors import ConfigError, RecordError, SchemaError
from tidal.stages.locators import Locator, Unlocated
from tidal.state.view import View
from tidal.tables import Table, records
from tidal.world import World

if TYPE_CHECKING:
    from tidal.stages.read import Read, ReadPlan
    from tidal.stages.weights import Live


@dataclass(frozen=True)
class Context:
    """What a reader opens its chain with, besides a position.

    ``first_epoch``: the epoch a fresh source starts at (each pass over a loader starts the
    next ones). ``origin``: the progress of an elastic restore (see :mod:`tidal.state.elastic`),
    keyed by source key. ``key``: the key of the sources below this stage: ``""`` at the top,
    ``"web/"`` inside the mixed stream ``web``. ``weights``: the weights set on a running loader,
    for the top mixture (see :mod:`tidal.stages.weights`). ``trace``: keep where every item came
    from (:meth:`Locator.origins`), for :func:`tidal.trace`. ``replay``: the chain is opened to
    check or replay a state (``load_state_dict``'s check, :func:`tidal.trace`, ``tidal state
    verify``), not to train on: the bad records it meets were the run's to report, so they are
    skipped without going to the ``errors`` function or the log again (``"raise"`` still raises).
    """

    world: World
    first_epoch: int = 0
    origin: dict | None = None
    key: str = ""
    weights: Live | None = None
    trace: bool = False  # whether items' provenance is kept (see Locator.origins)
    replay: bool = False  # a check or replay of a state: bad records are not reported again


class StageIterator(ABC):
    """An open stage; every member here is what the code above relies on."""

    exact: bool = False

    @abstractmethod
    def next(self, max_items: int) -> Table: ...

    @abstractmethod
    def position(self) -> dict: ...

    @abstractmethod
    def used(self) -> dict[str, list[int]]: ...

    def stats(self) -> dict:
        """Counters of this stage and those upstream of it."""
        return {}

    def locate(self) -> Locator:
        """Where the items of the table this iterator returned last came from (a
        :class:`~tidal.stages.locators.Locator`)."""
        return Unlocated()

    @abstractmethod
    def close(self) -> None: ...


class Needed:
    """A column a stage needs in every record (the text tokenize encodes, the ids pack packs). A
    record without it is bad data, for the ``errors`` policy; a column that no record has is a
    mistake in the pipeline (a typo, a step missing before): a :class:`~tidal.SchemaError`
    under every policy and at any size, never a stream of skipped records. No record: none of
    the first :attr:`RUN`, or none at all where the stream ends sooner; under ``errors="raise"``,
    where the first record without it ends the stream, the records after it are looked at first
    (:meth:`reject`) to tell the one from the other."""

    RUN = 64

    def __init__(self, column: str, what: str, advice: str):
        self.column, self._what, self._advice = column, what, advice
        self.seen = False  # whether a record had it yet
        self._lacking = 0  # records before the first that had it
        self._found = ""  # the fields of the first record without it

    def check(self, recs: list[Any]) -> None:
        """Called with a table where some record lacks the column (or does not hold what it should)."""
        if self.seen or self._has(recs):
            return
        if not self._lacking and recs:
            self._found = str(sorted(recs[0])) if isinstance(recs[0], dict) else type(recs[0]).__name__
        self._lacking += len(recs)
        if self._lacking >= self.RUN:
            raise self._typo(ended=False)

    def ended(self) -> None:
        """The stream ended: if none of its records had the column, the same mistake."""
        if not self.seen and self._lacking:
            raise self._typo(ended=True)

    def reject(self, locator: Locator, i: int, why: str, upstream: StageIterator, size: int) -> None:
        """Hand record ``i`` to the policy (``locator.reject``). Where that raises before any record
        had the column, the next records are read first, up to :attr:`RUN` (the error ends the
        stream anyway, so nothing read ahead is lost): if none has it either, the error is the
        pipeline's, a SchemaError, not this record's."""
        try:
            locator.reject(i, why)
        except RecordError as exc:
            if not self.seen:
                self._read_on(upstream, size, exc)
            raise

    def _read_on(self, upstream: StageIterator, size: int, error: RecordError) -> None:
        while self._lacking < self.RUN:
            try:
                recs = records(upstream.next(size))
            except StopIteration:
                raise self._typo(ended=True) from error
            except Exception:  # another error on the way: the first one stands
                return
            if self._has(recs):
                return
            self._lacking += len(recs)
        raise self._typo(ended=False) from error

    def _has(self, recs: list[Any]) -> bool:
        """Whether a record of ``recs`` has the column (then :attr:`seen`)."""
        if any(isinstance(r, dict) and self.column in r for r in recs):
            self.seen = True
        return self.seen

    def _typo(self, ended: bool) -> SchemaError:
        which = f"the {self._lacking} records it was given" if ended else f"the first {self._lacking} records"
        return SchemaError(
            f"{self._what}: none of {which} has a column {self.column!r} (they have {self._found}): {self._advice}"
        )


class Stateless(StageIterator):
    """Base of iterators with no position of their own (map, filter, batch, tokenize): each
    returns every item it computes from what it took upstream, so it is where its upstream is."""

    def __init__(self, upstream: StageIterator):
        self._up = upstream

    def position(self) -> dict:
        return self._up.position()

    def used(self) -> dict[str, list[int]]:
        return self._up.used()

    def stats(self) -> dict:
        return self._up.stats()

    def close(self) -> None:
        self._up.close()


INTERNAL: dict[str, Any] = {"config": False}
"""The metadata of a field that is no argument of the step's method: ``field(metadata=INTERNAL)``."""


class Declared:
    """A step as a config holds it, declared once: ``METHOD`` is the :class:`tidal.Dataset` method
    that makes it, and the dataclass fields of :meth:`fields_of` (the class itself, by default)
    are that method's arguments, in order; a field without a default is a required one.
    ``upstream`` and fields marked :data:`INTERNAL` are none. ``EXTRA`` names the method's
    arguments that are no field, each after a field (``(("eos", "column"),)``: ``eos``, after ``column``).

    :meth:`arguments` (what :mod:`tidal.config` checks a step's keys against) and
    :meth:`config_step` (what ``to_config()`` writes) are both made from these fields, so a
    field added to a stage is a key of its step in the config without another line elsewhere.
    """

    METHOD: ClassVar[str] = ""
    EXTRA: ClassVar[tuple[tuple[str, str], ...]] = ()

    @classmethod
    def fields_of(cls) -> type:
        """The dataclass whose fields are the arguments (:class:`~tidal.stages.pack.Pack`: its config)."""
        return cls

    @classmethod
    def arguments(cls) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The method's arguments: (required, optional), each in the order of the fields."""
        required: list[str] = []
        optional: list[str] = []
        for f in fields(cls.fields_of()):
            if f.name == "upstream" or not f.metadata.get("config", True):
                continue
            needed = f.default is MISSING and f.default_factory is MISSING
            (required if needed else optional).append(f.name)
            optional.extend(extra for extra, after in cls.EXTRA if after == f.name)
        return tuple(required), tuple(optional)

    def config_args(self) -> dict[str, Any]:
        """The arguments that make this step again, as plain data (the fields' values by default)."""
        required, optional = self.arguments()
        values = self.config_values()
        return {name: getattr(values, name) for name in required + optional if name not in dict(self.EXTRA)}

    def config_values(self) -> Any:
        """The value whose fields :meth:`fields_of` declares: this step itself, by default."""
        return self

    def config_step(self) -> dict:
        """This step in a config: ``{"batch": {"size": 8, "drop_last": True}}``, the method of
        :class:`tidal.Dataset` that makes it and its arguments."""
        return {self.METHOD: self.config_args()}


@dataclass(frozen=True, repr=False)
class Stage(ABC):
    """A step of a pipeline: frozen, picklable, comparable."""

    @abstractmethod
    def open(self, ctx: Context, position: View | None) -> StageIterator:
        """An iterator at ``position`` (None: the start), its upstream opened at its part of it."""

    @abstractmethod
    def describe(self) -> list:
        """JSON-able facts that decide the output, this stage's and its upstream's: the fingerprint's input."""

    @abstractmethod
    def call(self) -> str:
        """How this step reads in a chain: ``batch(8, drop_last=True)``."""

    @abstractmethod
    def sources(self, key: str = "") -> dict[str, ReadPlan]:
        """The file sources below, by source key."""

    @abstractmethod
    def epochs_per_pass(self) -> int:
        """Epochs one pass over the stage reads; 0 where passes do not apply (forever, or a mixture)."""

    @abstractmethod
    def with_source(self, change: Callable[[Read], Read]) -> Stage:
        """The same chain over a changed source (``shuffle`` and ``repeat`` change the source's order)."""

    def upstreams(self) -> tuple[Stage, ...]:
        return ()

    def main_line(self) -> list[Stage]:
        """This chain's stages down to its source or mixture, not into the mixed streams."""
        line = [self]
        while len(ups := line[-1].upstreams()) == 1:
            line.append(ups[0])
        return line

    # -- what the code above a chain asks of it: each stage answers for itself ----------

    def records_per_item(self) -> int | None:
        """How many source records each item holds, where that is fixed (plain records: 1, a
        batch of them: its size); None where it varies (filters, packing, mixtures, records
        skipped as bad). ``tidal state skip`` is exact where it is known."""
        return None

    def finite(self) -> bool:
        """Whether a pass over this stage ends."""
        return False

    def may_end_unevenly(self) -> bool:
        """Whether readers fed equal shares may yield different numbers of items in a finite pass."""
        return self.finite()

    def functions(self) -> list[tuple[str, Callable]]:
        """The user's functions this stage carries, each with what names it: they travel with
        the chain, pickled, into spawn workers."""
        return []

    def tokenizer_used(self) -> Any:
        """The :class:`~tidal.stages.tokenize.Tokenizer` this stage encodes with, if any."""
        return None

    def batch_size(self) -> int | None:
        """Records per item where this stage batches them."""
        return None

    def shifts_labels(self) -> bool:
        """Whether the labels this stage makes are already shifted by one (packing's default)."""
        return False

    def first_weights(self) -> dict[str, float]:
        """A mixture's weights by stream when it starts drawing, normalized; empty for others."""
        return {}

    def record_wise(self) -> bool:
        """Whether this stage gives records (not batches, packed rows or a mixture): what a
        conversion can write."""
        return False

    def mixed_streams(self) -> list[str] | None:
        """The streams of the chain's top mixture, whose weights ``loader.set_weights`` sets; None
        where there is no mixture (an :class:`~tidal.ArgumentError` where its weights cannot be set)."""
        ups = self.upstreams()
        return ups[0].mixed_streams() if len(ups) == 1 else None

    def to_config(self) -> dict:
        """The chain down from this stage as a pipeline config: ``{"source": ...}`` (or
        ``{"mix": ...}``) and ``{"steps": [...]}``, plain data (see :mod:`tidal.config`)."""
        raise ConfigError(f"{self.call()}: this stage cannot be written in a config")

    def __repr__(self) -> str:
        return self.call()


@dataclass(frozen=True, repr=False)
class Step(Declared, Stage):
    """A stage with one upstream; a step of :class:`tidal.Dataset`'s chain, declared once (see :class:`Declared`)."""

    upstream: Stage

    def describe(self) -> list:
        return [*self.upstream.describe(), [type(self).__name__, *self.facts()]]

    def facts(self) -> list:
        """What, besides the upstream, decides this stage's output."""
        return []

    def sources(self, key: str = "") -> dict[str, ReadPlan]:
        return self.upstream.sources(key)

    def epochs_per_pass(self) -> int:
        return self.upstream.epochs_per_pass()

    def with_source(self, change: Callable[[Read], Read]) -> Stage:
        return replace(self, upstream=self.upstream.with_source(change))

    def upstreams(self) -> tuple[Stage, ...]:
        return (self.upstream,)

    def finite(self) -> bool:
        return self.upstream.finite()

    def to_config(self) -> dict:
        config = self.upstream.to_config()
        config["steps"].append(self.config_step())
        return config

    def config_step(self) -> dict:
        if not self.METHOD:
            raise ConfigError(f"{self.call()}: this stage cannot be written in a config")
        return super().config_step()

    def __repr__(self) -> str:
        return f"{self.upstream!r}.{self.call()}"


class OneToOne(Step):
    """A step that gives one item for each item of its upstream, in order (map, tokenize): it
    keeps the upstream's count of records per item, and its evenness over readers."""

    def records_per_item(self) -> int | None:
        return self.upstream.records_per_item()

    def may_end_unevenly(self) -> bool:
        return self.upstream.may_end_unevenly()

    def record_wise(self) -> bool:
        return self.upstream.record_wise()


def walk(stage: Stage) -> Iterator[Stage]:
    """Every stage of a chain, top first, into every mixed stream."""
    yield stage
    for up in stage.upstreams():
        yield from walk(up)


def add_stats(*parts: dict) -> dict:
    """Counters of several iterators as one: numbers summed, per-stream dicts merged."""
    out: dict[str, Any] = {}
    for part in parts:
        for k, v in part.items():
            if k in out and isinstance(v, dict):
                out[k] = add_stats(out[k], v)
            elif k in out and isinstance(v, (int, float)) and not isinstance(v, bool):
                out[k] += v
            else:
                out[k] = v
    return out
