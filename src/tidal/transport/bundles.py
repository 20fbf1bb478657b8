"""What background readers send, and the order batches are taken in: shared by every loader.

A reader (one rank x worker) sends *bundles* of consecutive batches (1, 2, 4, ... up to
``MAX_BUNDLE`` of them, and at most ``MAX_BUNDLE_BYTES``): each column of a bundle stacked
into one numpy array, each text column packed into one UTF-8 buffer with offsets. One
message of a few large buffers per bundle, instead of one message of Python objects per
batch, is what keeps reader processes from costing throughput. Readers in threads send
bundles of one batch, unstacked: nothing is copied.

Each batch of a bundle carries its reader's state after it. The loader takes batches
round-robin over its readers (0, 1, ..., again 0), skipping readers that have finished,
whatever the bundle sizes (:func:`round_robin`), and keeps, per reader, the state after the
last batch the training loop consumed (:func:`tidal.state.schema.consume`). So the loader's
state is exactly what was consumed, however far the readers have run ahead.

This module imports neither torch nor JAX: ``tidal.DataLoader`` (torch workers) and
``tidal.jax.Loader`` (threads or spawned processes) both build on it.
"""

from __future__ import annotations

import pickle
import time
from collections import deque
from collections.abc import Callable, Iterator
from itertools import pairwise
from typing import Any

import numpy as np

from tidal.errors import ArgumentError
from tidal.metrics import Mark, Marker
from tidal.stages import Stage, walk
from tidal.state import keys as k
from tidal.transport.recycle import RECYCLED

MAX_BUNDLE = 1024
# In the process that trains, bundles only save a call per batch: kept small, so that the
# batches a bundle holds are fresh in the cache and freed soon (1,024 held cost 9 µs a batch)
MAX_LOCAL_BUNDLE = 32
MAX_BUNDLE_BYTES = 16 << 20
MAX_BUNDLE_SECONDS = 0.05  # a bundle is sent once it took this long to make

Widen = Callable[[np.ndarray], Any]  # (in the training process: to a tensor)


def numeric(value: Any) -> bool:
    return isinstance(value, np.ndarray) and value.dtype.kind in "biuf"


def prepare(value: Any, widen: Widen) -> Any:
    """``widen`` applied to every numeric array of an item (nested dicts included)."""
    if numeric(value):
        return widen(value)
    if isinstance(value, dict):
        return {k: prepare(v, widen) for k, v in value.items()}
    return value


class Strings:
    """A text column of a whole bundle as UTF-8 and offsets: large buffers to copy instead of
    thousands of string objects to pickle and unpickle. Through shared memory each string is
    written into the slot as it was encoded, and read out of it as ``str``: no joined buffer
    on either side (each was a copy of all the text, into fresh pages)."""

    def __init__(self, batches: list[list[str]]):
        self.encoded: list[bytes] | None = [t.encode() for batch in batches for t in batch]
        self.offsets = np.cumsum([0] + [len(e) for e in self.encoded], dtype=np.int64)
        self.starts = np.cumsum([0] + [len(b) for b in batches]).tolist()
        self._data: bytes | None = None
        self._lists: list[list[str]] | None = None  # the strings, where they were read out of shared memory

    @property
    def data(self) -> bytes:
        """All the text, joined (for the pipe)."""
        if self._data is None:
            self._data, self.encoded = b"".join(self.encoded or []), None
        return self._data

    @classmethod
    def empty(cls, starts: list[int]) -> Strings:
        """One with the batch bounds ``starts`` and no text yet (it is in shared memory)."""
        new = cls.__new__(cls)
        new.__setstate__({"data": b"", "offsets": np.zeros(1, np.int64), "starts": starts})
        return new

    @classmethod
    def read(cls, data: np.ndarray, offsets: np.ndarray, starts: list[int]) -> Strings:
        """The strings of ``data`` (a view of shared memory), made now, batch by batch."""
        new = cls.empty(starts)
        view, at = data.data, offsets.tolist()
        new._lists = [[str(view[at[i] : at[i + 1]], "utf-8") for i in range(a, b)] for a, b in pairwise(starts)]
        return new

    @staticmethod
    def accepts(values: list[Any]) -> bool:
        return all(isinstance(v, list) and all(type(t) is str for t in v) for v in values)

    def __getitem__(self, j: int) -> list[str]:
        if self._lists is not None:
            return self._lists[j]
        view, offsets = memoryview(self.data), self.offsets
        a, b = self.starts[j], self.starts[j + 1]
        return [str(view[offsets[i] : offsets[i + 1]], "utf-8") for i in range(a, b)]

    def __getstate__(self) -> dict:  # through the pipe
        return {"data": self.data, "offsets": self.offsets, "starts": self.starts}

    def __setstate__(self, state: dict) -> None:
        self.encoded, self._lists = None, None
        self._data, self.offsets, self.starts = state["data"], state["offsets"], state["starts"]


class Bundle:
    """Consecutive items of one reader, with the reader's state after each; with ``pack``,
    columns stacked into one array where shapes agree. ``end``: the reader has no more."""

    def __init__(self, worker: int, items: list[Any], states: list[dict], end: bool, pack: bool, widen: Widen):
        self.worker, self.states, self.end = worker, states, end
        self.stats: dict = {}  # the reader's counters when the bundle was made
        self.marks: list[Mark] = []  # what each item holds, for the loader's metrics (tidal.metrics)
        self.columns: dict[str, Any] | None = None
        self.items: list[Any] | None = None
        first = items[0] if items else None
        if pack and isinstance(first, dict) and all(isinstance(i, dict) and i.keys() == first.keys() for i in items):
            self.columns = {k: self._stack([i[k] for i in items], widen) for k in first}
        else:
            self.items = [prepare(i, widen) for i in items]

    @staticmethod
    def _stack(values: list[Any], widen: Widen) -> Any:
        v0 = values[0]
        if numeric(v0) and all(
            isinstance(v, np.ndarray) and v.shape == v0.shape and v.dtype == v0.dtype for v in values
        ):
            return widen(np.stack(values, out=RECYCLED.empty((len(values), *v0.shape), v0.dtype)))
        if Strings.accepts(values):
            return Strings(values)
        return [prepare(v, widen) for v in values]

    def __len__(self) -> int:
        return len(self.states)

    def item(self, j: int) -> Any:
        """Item ``j`` as numpy (numeric columns are views of the bundle's arrays)."""
        if self.columns is not None:
            return {k: col[j] for k, col in self.columns.items()}
        assert self.items is not None
        return self.items[j]


def nbytes(item: Any) -> int:
    """Bytes of an item's arrays and text: what bounds a bundle."""
    if not isinstance(item, dict):
        return 0
    total = 0
    for v in item.values():
        if isinstance(v, np.ndarray):
            total += v.nbytes
        elif isinstance(v, list) and v and type(v[0]) is str:
            total += sum(len(t) for t in v if type(t) is str)  # a null among them is data too
    return total


def bundles(
    it: Any,
    worker: int,
    pack: bool,
    widen: Widen,
    max_size: int | None = None,
    kind: Callable[..., Bundle] = Bundle,
    max_bytes: int = MAX_BUNDLE_BYTES,
) -> Iterator[Bundle]:
    """A reader's items (``it``: a :class:`tidal.iterator.DatasetIterator`) as bundles of
    1, 2, 4, ... up to ``max_size`` items (default: ``MAX_BUNDLE`` for another process, ``pack``;
    ``MAX_LOCAL_BUNDLE`` in this one), ``MAX_BUNDLE_BYTES`` or ``MAX_BUNDLE_SECONDS`` of
    work (a loop waiting on a bundle of costly batches, such as tokenized ones, waits for all
    of it); the last one has ``end`` set (it may be empty). A reader that fails sends its
    counters first, in an empty bundle (the retries of the request that failed reach
    ``metrics()``), then raises."""
    size = 1
    if max_size is None:
        max_size = MAX_BUNDLE if pack else MAX_LOCAL_BUNDLE
    clock = time.perf_counter
    mark = Marker(it)
    try:
        while True:
            items: list[Any] = []
            states: list[dict] = []
            marks: list[Mark] = []
            total = 0
            ended = False
            began = clock()
            try:
                for item in it:
                    items.append(item)
                    state = it.state()
                    state.pop(k.ORIGIN, None)  # the loader keeps it once, not per batch
                    states.append(state)
                    marks.append(mark(item))
                    if pack:  # the bytes bound a message to another process; in this one nothing is copied
                        total += nbytes(item)
                    if len(items) >= size or total >= max_bytes or clock() - began >= MAX_BUNDLE_SECONDS:
                        break
                else:
                    ended = True
            except Exception:
                last = _counters(kind(worker, [], [], end=False, pack=pack, widen=widen), it)
                if last is not None:
                    yield last
                raise
            if ended:
                yield _stamped(kind(worker, items, states, end=True, pack=pack, widen=widen), it, marks)
                return
            yield _stamped(kind(worker, items, states, end=False, pack=pack, widen=widen), it, marks)
            size = min(2 * size, max_size)
    finally:
        it.close()


def _counters(bundle: Bundle, it: Any) -> Bundle | None:
    """An empty bundle with the counters of a reader that failed; None where they cannot be had."""
    try:
        return _stamped(bundle, it, [])
    except Exception:
        return None


def _stamped(bundle: Bundle, it: Any, marks: list[Mark]) -> Bundle:
    """The bundle, with its reader's counters as they stand (rows read, skipped, downloads, ...)
    and what each of its items holds."""
    bundle.stats = it.stats()
    bundle.marks = marks
    return bundle


def round_robin(
    fetch: Callable[[int], Bundle],
    workers: int,
    start: int,
    counters: Callable[[int, dict], None] | None = None,
) -> Iterator[tuple[int, Bundle, int]]:
    """``(worker, bundle, j)`` for every item, in worker order from ``start`` (0, 1, ..., again
    0), skipping workers that have ended. ``fetch(w)`` returns the next bundle of worker ``w``
    or, where bundles arrive in an order of their own, of any worker: each is filed under its
    worker until that worker's turn. A reader's counters as it ended (records it skipped after
    its last batch) come in an empty last bundle: they go with its last batch still queued, else
    to ``counters(worker, stats)``."""
    queues: list[deque[tuple[Bundle, int]]] = [deque() for _ in range(workers)]
    ended = [False] * workers
    w = start
    while not all(ended[i] and not queues[i] for i in range(workers)):
        while not queues[w] and not ended[w]:
            bundle = fetch(w)
            queue = queues[bundle.worker]
            if not len(bundle) and bundle.stats:
                if queue:
                    queue[-1][0].stats = bundle.stats
                elif counters is not None:
                    counters(bundle.worker, bundle.stats)
            queue.extend((bundle, j) for j in range(len(bundle)))
            ended[bundle.worker] |= bundle.end
        if queues[w]:
            bundle, j = queues[w].popleft()
            yield w, bundle, j
        w = (w + 1) % workers


def steps(items: Iterator[tuple[int, Bundle, int]], workers: int) -> Iterator[list[tuple[int, Bundle, int]]]:
    """Continuous batch rows shared by ``workers`` readers (:mod:`tidal.stages.continuous`): the
    :func:`round_robin` items (from worker 0) in groups of one item of every worker, each group
    one step; they end with the first worker that ends, since no whole step is left then."""
    group: list[tuple[int, Bundle, int]] = []
    for item in items:
        if item[0] != len(group):
            return
        group.append(item)
        if len(group) == workers:
            yield group
            group = []


def side_by_side(parts: list[Any], cat: Callable[[list[Any]], Any]) -> Any:
    """One batch of the rows of several batches, in order: arrays joined along the rows with
    ``cat`` (``np.concatenate``, ``torch.cat``), lists one after the other."""
    first = parts[0]
    if not isinstance(first, dict):
        return [row for part in parts for row in part]
    return {
        key: [row for part in parts for row in part[key]] if isinstance(value, list) else cat([p[key] for p in parts])
        for key, value in first.items()
    }


def check_pickles(stage: Stage, workers: str) -> None:
    """Workers that receive the dataset pickled (spawn, forkserver): say which function does
    not pickle, instead of an error from inside the worker start. ``workers`` names them."""
    for part in walk(stage):
        for what, fn in part.functions():
            try:
                pickle.dumps(fn)
            except Exception as exc:
                raise ArgumentError(
                    f"{what}: {workers} receive the dataset pickled, and this function does not "
                    f"pickle ({exc}); define it at the top level of a module"
                ) from None
