"""Provenance: which file, row and token range every row of the next batches holds.

tidal's order is a pure function of (seed, epoch, shard list, stages) and a loader state is a
position, so the batches a loader restored from a state yields can be made again, anywhere,
without the training run: :func:`trace` replays them from the state and says where every row
came from. A batch is a list of rows; a row is a list of *segments*::

    {"file": "data/web/part-3.jsonl", "row": 1841, "start": None, "end": None, "stream": None}

the record at 0-based ``row`` of ``file`` (a path or URL as the shard list has it); for a
packed row, ``[start, end)`` is the range of that document's token ids (EOS included) the row
holds; ``stream`` is the name of the mixture's stream it was drawn from (``"outer/inner"`` in
a mixture of mixtures), else None.

The replay is the loader's own path: each of the rank's readers (one per DataLoader worker) is
opened where the state puts it (on another topology: where an elastic restore puts it), and
the batches are taken round robin from the worker whose turn it is, as the loader takes them
(continuous rows shared by workers: one batch of every worker side by side). It reads only
what those batches need (a restore re-reads at most one shuffle block, packing tokenizes the
documents it packs). Provenance rides alongside the items (:class:`tidal.stages.locators.Origin`): a
stage works it out only when opened with ``trace=True``, so a training loop pays nothing.

A state saved by a loader that batched the dataset itself (``tidal.DataLoader(ds,
batch_size=n)``) is traced on ``ds`` as it is: the state's fixed batch size (or ``batch_size=``,
where its batches hold no fixed number of records, as packed ones) says how the loader batched
it. No state (``None``) traces from the start of the run.

A trace follows one rank and ends where that rank's pass over the loader ends (a finite
dataset). Under ``torch.distributed`` with a pipeline whose ranks may end unevenly (filters,
records skipped as bad), the loader ends every rank's pass with the first rank that runs out:
a trace past that step shows batches the loop never took.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, overload

from tidal.errors import ArgumentError, StateError
from tidal.iterator import DatasetIterator
from tidal.stages.continuous import shared_rows
from tidal.stages.locators import Origin
from tidal.state import keys as k
from tidal.state import schema
from tidal.state.schema import ReaderState, Restored
from tidal.world import World

if TYPE_CHECKING:
    from tidal.dataset import Dataset

__all__ = ["Replay", "Segment", "Step", "load_state", "trace", "traced"]

Segment = dict[str, Any]
"""``{"file": str, "row": int, "start": int | None, "end": int | None, "stream": str | None}``"""


@dataclass
class Step:
    """One batch of the replay: the ``step``-th batch of this rank in pass ``pass_`` (batches the
    rank had consumed in the pass before it), the worker that made it, its rows."""

    pass_: int
    step: int
    worker: int
    rows: list[list[Origin]]

    def segments(self) -> list[list[Segment]]:
        return [[o.segment() for o in row] for row in self.rows]


class Replay:
    """The batches a loader restored from ``state`` yields on ``rank``, with their provenance.

    ``state``: a loader state (``state_dict()``), or None for the start of a run. ``world_size``
    and ``num_workers`` (default: the state's topology) name the topology it is restored on.
    ``positions=True`` keeps every reader's state after its latest batch (:attr:`readers`),
    what a loader's ``state_dict()`` would hold at that point. ``passes=True`` goes on into the
    next passes, as a loop that calls ``iter(loader)`` again; otherwise the replay ends with the
    pass (:meth:`next_pass` goes on). Iterating it yields :class:`Step` values.
    """

    def __init__(
        self,
        dataset: Dataset,
        state: dict | None,
        rank: int = 0,
        world_size: int | None = None,
        num_workers: int | None = None,
        *,
        positions: bool = False,
        passes: bool = False,
    ):
        self.dataset = dataset
        if state is not None:
            schema.check_layout(state)
            if state.get(k.DATASET) != dataset.fingerprint():
                raise StateError(_what_differs(dataset, state))
            view = schema.check(state, dataset.fingerprint(), schema.sources_of(dataset.sources()))
            saved_ranks, saved_workers = state[k.TOPOLOGY]
        else:
            view, saved_ranks, saved_workers = None, world_size or 1, num_workers or 1
        self.world_size = _count(world_size if world_size is not None else saved_ranks, "world_size")
        self.workers = max(1, _count(num_workers if num_workers is not None else saved_workers, "num_workers", 0))
        if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < self.world_size:
            raise ArgumentError(f"rank must be an int from 0 to {self.world_size - 1}, not {rank!r}")
        self.rank = rank
        self.weights = state.get(k.WEIGHTS) if state is not None else None  # set_weights in force
        if view is not None:
            self.restored = schema.restore(view, rank, self.world_size, self.workers)
        else:
            self.restored = Restored(0, None, schema.fresh_rank(self.workers))
        self._positions, self._passes = positions, passes
        self._shared = shared_rows(dataset.stage, self.workers)
        self.pass_ = self.restored.pass_
        self.step = self.restored.rank[k.COUNTS][k.BATCHES]
        self.origin = self.restored.origin
        self.readers: list[ReaderState | None] = list(self.restored.rank[k.WORKERS])
        self.next_worker = self.restored.rank[k.NEXT_WORKER]

    def next_pass(self) -> None:
        """Go on with the next pass, as a loop that calls ``iter(loader)`` again after one ends:
        fresh readers, the next epochs."""
        self.pass_, self.step, self.origin = self.pass_ + 1, 0, None
        self.readers, self.next_worker = [None] * self.workers, 0

    def check(self) -> None:
        """Open, and close, the rank's readers where the state puts them: a position no reader
        takes is a :class:`~tidal.StateError` naming its key."""
        for it in self._open(self.origin):
            it.close()

    def _open(self, origin: dict | None) -> list[DatasetIterator]:
        ranks = World(self.rank, self.world_size)
        first = self.pass_ * self.dataset.epochs_per_pass()
        its: list[DatasetIterator] = []
        try:
            for w in range(self.workers):
                where = schema.reader_where(self.rank, w)
                state = self.readers[w]
                world = ranks.with_worker(w, self.workers)
                its.append(
                    DatasetIterator(
                        self.dataset.stage,
                        self.dataset.fingerprint(),
                        world,
                        state,
                        first,
                        origin,
                        where,
                        self.weights,
                        trace=True,
                        replay=True,  # the run reported the bad records it met
                    )
                )
        except BaseException:
            for it in its:
                it.close()
            raise
        return its

    def __iter__(self) -> Iterator[Step]:
        while True:
            its = self._open(self.origin)
            try:
                yield from self._shared_steps(its) if self._shared else self._round_robin(its)
            finally:
                for it in its:
                    it.close()
            if not self._passes:
                return
            self.next_pass()

    def _took(self, it: DatasetIterator, w: int) -> None:
        if self._positions:
            self.readers[w] = it.state()
        self.next_worker = (w + 1) % self.workers

    def _round_robin(self, its: list[DatasetIterator]) -> Iterator[Step]:
        """Batches in worker order from the worker whose turn it is, skipping workers that ended."""
        ended = [False] * len(its)
        w = self.next_worker
        while not all(ended):
            if not ended[w]:
                try:
                    next(its[w])
                except StopIteration:
                    ended[w] = True
                else:
                    step = Step(self.pass_, self.step, w, its[w].rows())
                    self._took(its[w], w)
                    self.step += 1
                    yield step
            w = (w + 1) % len(its)

    def _shared_steps(self, its: list[DatasetIterator]) -> Iterator[Step]:
        """Continuous rows shared by the workers: each step one batch of every worker, side by side."""
        while True:
            rows: list[list[Origin]] = []
            for w, it in enumerate(its):
                try:
                    next(it)
                except StopIteration:
                    return  # no whole step is left
                rows += it.rows()
                self._took(it, w)
            step = Step(self.pass_, self.step, 0, rows)
            self.step += 1
            yield step


def _count(value: Any, what: str, lo: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < lo:
        raise ArgumentError(f"{what} must be an int of at least {lo}, not {value!r}")
    return value


@overload
def load_state(state: None) -> None: ...


@overload
def load_state(state: dict | str | Path) -> dict: ...


def load_state(state: dict | str | Path | None) -> dict | None:
    """A state given as a dict, or the path of its JSON file; None stays None (the start of a run).
    Every error names the file and what is wrong with it."""
    if state is None or isinstance(state, dict):
        return state
    if isinstance(state, (str, Path)):
        path = Path(state)
        try:
            text = path.read_text()
        except FileNotFoundError:
            raise StateError(f"{path}: no such state file") from None
        except UnicodeDecodeError as exc:
            raise StateError(f"{path}: not a text file ({exc.reason} at byte {exc.start})") from None
        except OSError as exc:
            raise StateError(f"{path}: the state file cannot be read: {exc.strerror or exc}") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise StateError(f"{path}: not JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}") from None
        if not isinstance(data, dict):
            raise StateError(f"{path}: not a tidal loader state (a JSON {type(data).__name__})")
        return data
    raise StateError(
        f"expected a loader state (a dict, as state_dict() returns it), its path, or None, not {type(state).__name__}"
    )


def as_saved(dataset: Dataset, state: dict | None, batch_size: int | None = None, drop_last: bool = False) -> Dataset:
    """The dataset ``state`` was saved from: ``dataset`` itself, or ``dataset`` batched as a loader
    made with ``tidal.DataLoader(dataset, batch_size=n)`` batched it (``batch_size``, else the
    state's fixed batch size, with ``drop_last`` either way). The fingerprint decides: where none
    fits, ``dataset`` is returned, and the replay's check says what differs."""
    if batch_size is not None:
        if dataset.batched:
            raise ArgumentError("batch_size=: the dataset is already batched (as DataLoader refuses it too)")
        return dataset.batch(batch_size, drop_last=bool(drop_last))
    if state is None or state.get(k.DATASET) == dataset.fingerprint() or dataset.batched:
        return dataset
    n = state.get(k.RECORDS_PER_BATCH)
    if type(n) is int and n > 1:
        for drop in (drop_last, not drop_last):
            candidate = dataset.batch(n, drop_last=drop)
            if candidate.fingerprint() == state.get(k.DATASET):
                return candidate
    return dataset


def _what_differs(dataset: Dataset, state: dict) -> str:
    """Why ``state`` is not a state of ``dataset``, as far as a state tells: its sources' record
    counts and its batches' size are in it; the rest is a digest."""
    head = "this state was saved from a different dataset"
    saved, ours = state.get(k.SOURCES), schema.sources_of(dataset.sources())
    if saved != ours:

        def counts(sources: Any) -> str:
            if not isinstance(sources, dict):
                return repr(sources)
            return ", ".join(
                f"{key or 'files'}: {v.get(k.RECORDS) if isinstance(v, dict) else v!r} records"
                for key, v in sources.items()
            )

        return f"{head}: other files (the state's sources: {counts(saved)}; this dataset's: {counts(ours)})"
    n, m = state.get(k.RECORDS_PER_BATCH), dataset.records_per_batch()
    if n != m and n is not None:
        if dataset.batched or n == 1:
            return (
                f"{head}: its items hold {n} records each, this dataset's {m if m is not None else 'a varying number'}"
            )
        fingerprint = state.get(k.DATASET)
        if any(dataset.batch(n, drop_last=drop).fingerprint() == fingerprint for drop in (False, True)):
            return (
                f"{head}: a loader made with tidal.DataLoader(ds, batch_size={n}) batched it: trace with "
                f"batch_size={n} (in a config: loader: {{batch_size: {n}}})"
            )
        return (
            f"{head}: its batches hold {n} records each, and batched so (as tidal.DataLoader(ds, batch_size={n}) "
            "would) this one is still another: another seed, block size or step"
        )
    if not dataset.batched:
        return (
            f"{head}: the same files, but another chain; where a loader batched it (tidal.DataLoader(ds, "
            "batch_size=n)), trace with batch_size=n (and drop_last= as the loader had it); else another seed, "
            "block size or step"
        )
    return f"{head}: the same files, but another seed, block size or step"


def traced(
    dataset: Dataset,
    state: dict | str | Path | None,
    steps: int,
    rank: int = 0,
    *,
    skip: int = 0,
    world_size: int | None = None,
    num_workers: int | None = None,
    batch_size: int | None = None,
    drop_last: bool = False,
) -> Iterator[Step]:
    """The :class:`Step` values :func:`trace` gives, as they are made (for ``tidal trace``)."""
    for value, what in ((steps, "steps"), (skip, "skip")):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ArgumentError(f"{what} must be a non-negative int, not {value!r}")
    loaded = load_state(state)
    dataset = as_saved(dataset, loaded, batch_size, drop_last)
    try:
        replay = Replay(dataset, loaded, rank, world_size, num_workers)
    except StateError as exc:
        if isinstance(state, (str, Path)):  # the file it came from, first
            raise StateError(f"{state}: {exc}") from None
        raise
    if steps == 0:
        return
    for i, step in enumerate(replay):
        if i >= skip:
            yield step
        if i + 1 >= skip + steps:
            return


def trace(
    dataset: Dataset,
    state: dict | str | Path | None,
    steps: int,
    rank: int = 0,
    *,
    skip: int = 0,
    world_size: int | None = None,
    num_workers: int | None = None,
    batch_size: int | None = None,
    drop_last: bool = False,
) -> list[list[list[Segment]]]:
    """Where every row of the next ``steps`` batches a loader restored from ``state`` yields on
    ``rank`` came from: one list per batch, of rows, each a list of segments (see
    :mod:`tidal.provenance`). ``state`` None: from the start of the run (the topology is then
    ``world_size`` ranks of ``num_workers`` workers, default 1 and 1). ``skip``: start that many
    batches later. ``world_size`` and ``num_workers``: the topology the state is restored on
    (default: the one it was saved on; another gives what an elastic restore yields).
    ``batch_size`` and ``drop_last``: those of a loader that batched ``dataset`` itself
    (``tidal.DataLoader(ds, batch_size=n)``), where the state does not say it (its batches hold
    no fixed number of records: packed, filtered, mixed).

    >>> state = json.load(open("run/state-51200.json"))
    >>> batches = tidal.trace(ds, state, steps=100, rank=3)
    >>> first_batch = batches[0]
    >>> first_batch[0]    # its first row
    [{'file': 'data/web/part-3.jsonl', 'row': 1841, 'start': 0, 'end': 417, 'stream': None}, ...]

    A state that is not one, or not this dataset's, is a :class:`~tidal.StateError`; a pipeline
    whose provenance cannot be followed, a :class:`~tidal.Untraceable`.
    """
    steps_made = traced(
        dataset,
        state,
        steps,
        rank,
        skip=skip,
        world_size=world_size,
        num_workers=num_workers,
        batch_size=batch_size,
        drop_last=drop_last,
    )
    return [step.segments() for step in steps_made]
