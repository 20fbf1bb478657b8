"""A loader's metrics: flat numbers for where training logs go (``loader.metrics()``).

Two halves, one on each side of the transport:

- in the reader (a worker process, a thread, or the training process with no workers),
  :class:`Marker` marks every batch as it is bundled (:mod:`tidal.transport.bundles`): its
  records (rows), its tokens (``input_ids`` less padding) and, under a mixture, the records
  and tokens each stream has given so far. A mark is three numbers and a small dict, made
  from the batch's numpy arrays: the training process never looks inside a batch to count.
- in the training process, :class:`Meter` adds up the marks of the batches the training
  loop *received* (batches read ahead, in a bundle, a queue or a prefetch thread, count when
  they reach the loop), the seconds the loop waited inside the loader's ``__next__``, and the
  readers' own counters (bytes, retries, cache hits, skipped records) as of each reader's
  latest bundle.

So the counts are the same with 0 workers or with any number, fork or spawn: ``records`` is
the rows of the batches the loop got, ``batches`` the batches it got, ``tokens`` their
non-padding tokens. The readers' I/O counters (``bytes_read``, ``retries``, ``cache_hits``)
are what the readers did, which runs ahead of the loop by the batches in flight.

Metrics describe this process's run of a loader: they start at zero when the loader is made
and are never reset by reading them, by a new pass over the loader, by ``load_state_dict()``
(a resumed run counts from where it resumed; the state's own counts say how far the whole run
has gone) or by ``set_weights()``. Readers count from zero each time they start; the meter keeps
what the readers before them counted, up to the last batch the loop received from each where
new readers take up from there (:meth:`Meter.new_pass`), so ``records == Σ records/<stream>``
holds across all of it. This module imports neither torch nor JAX.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from tidal.stages import add_stats

if TYPE_CHECKING:
    from tidal.iterator import DatasetIterator
    from tidal.stages import Stage


class Streams(NamedTuple):
    """Per stream of a reader's mixture after a batch: the records and tokens it has drawn, the
    weight it draws with at the reader's position, and the records and tokens it had drawn up to
    that position. They differ where a packing stage holds documents drawn ahead: its position is
    where its buffer began, and a reader reopened there (``set_weights``) draws them again."""

    records: dict[str, int]
    tokens: dict[str, int]
    weights: dict[str, float]
    records_at: dict[str, int]
    tokens_at: dict[str, int]


Mark = tuple[int, int, Streams | None]
"""What a batch holds: records (rows), tokens (non-padding), and the reader's streams after it."""

# the readers' counters metrics() reports under their own names (0 where no reader has one: local files, no retries)
READER_COUNTERS = [
    "bytes_read",
    "rows_read",
    "skipped",
    "bad_files",
    "bytes_downloaded",
    "retries",
    "cache_hits",
    "cache_misses",
]


def records_of(item: Any, batched: bool) -> int:
    """Records an item holds: the rows of a batch, else one."""
    if not batched:
        return 1
    values = item.values() if isinstance(item, dict) else [item]
    for value in values:
        try:
            return len(value)
        except TypeError:  # a scalar column
            continue
    return 0


def tokens_of(item: Any) -> int:
    """Non-padding tokens of an item's ``input_ids``: packed rows count where ``segment_ids`` is
    not 0 (padding), a list of documents their lengths, an array its size."""
    if not isinstance(item, dict):
        return 0
    ids = item.get("input_ids")
    if isinstance(ids, np.ndarray):
        segments = item.get("segment_ids")
        if isinstance(segments, np.ndarray) and segments.shape == ids.shape:
            return int(np.count_nonzero(segments))
        return int(ids.size)
    if isinstance(ids, list):
        return sum(len(x) for x in ids if isinstance(x, (np.ndarray, list)))
    return 0


class Marker:
    """Marks each item of a reader (``it``) with what it holds: see :data:`Mark`. Called right
    after ``it.state()``, it takes the mixture's counts at the position that call returned."""

    def __init__(self, it: DatasetIterator):
        from tidal.stages.pack import Pack

        self._it = it
        self._batched = any(s.batch_size() is not None for s in it.stage.main_line())
        # pack(eos=...) above the mixture appends to each document a token no stream's record holds
        self._eos = any(isinstance(s, Pack) and s.config.eos is not None for s in it.stage.main_line())

    def __call__(self, item: Any) -> Mark:
        drawn = self._it.streams()
        streams = Streams(*drawn) if drawn is not None else None
        if streams is not None and self._eos:  # counted as its document's stream's, as tokenize()'s EOS is
            streams = streams._replace(
                tokens=_plus(streams.tokens, streams.records), tokens_at=_plus(streams.tokens_at, streams.records_at)
            )
        return records_of(item, self._batched), tokens_of(item), streams


def _plus(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {name: n + b.get(name, 0) for name, n in a.items()}


def _first_weights(stage: Stage) -> dict[str, float]:
    """The weights a mixture on the main line of ``stage`` starts drawing with, by stream."""
    for s in stage.main_line():
        weights = s.first_weights()
        if weights:
            return weights
    return {}


def _opening(stage: Stage) -> dict:
    """What opening the sources of ``stage`` brought over the network in this process (the files
    indexing downloaded to count them), counted as ``bytes_downloaded`` by the first loader made
    of them (:class:`tidal.stages.plan.Opening`): the readers then find those files in the
    cache, and count none of it."""
    total = sum(plan.opening.claim() for plan in stage.sources().values())  # a source mixed twice: claimed once
    return {"bytes_downloaded": total} if total else {}


class Meter:
    """The training process's side: what the loop received, and the readers' counters.

    ``received(parts, waited)`` for every batch the loop received and the seconds it waited
    for it; ``bundle(worker, stats)`` for each bundle's reader counters; ``new_pass()`` when
    readers start afresh; :meth:`metrics` reads it all. Under a mixture, the weights are those
    the records of the last batch received were drawn with (the mixture's first ones before any).
    """

    def __init__(self, stage: Stage):
        self.batches = self.records = self.tokens = 0
        self.wait_s = 0.0
        self.started: float | None = None  # when the loop first asked for a batch
        self._weights = _first_weights(stage)  # per stream, the weight in force (empty: no mixture)
        self._readers: dict[int, dict] = {}  # per reader, its counters in its latest bundle (this pass)
        self._streams: dict[int, Streams] = {}  # per reader, its streams after the last batch the loop got
        self._before: dict = _opening(stage)  # readers' counters of earlier passes, from what opening it cost
        self._streams_before: tuple[dict[str, int], dict[str, int]] = ({}, {})

    def start(self) -> float:
        """The clock, now; the first call starts the wall time ``data_wait_share`` divides by."""
        now = time.perf_counter()
        if self.started is None:
            self.started = now
        return now

    def bundle(self, worker: int, stats: dict) -> None:
        self._readers[worker] = stats

    def received(self, parts: list[tuple[int, Mark]], waited: float) -> None:
        """The loop received a batch after waiting ``waited`` seconds for it: ``parts``, the
        (worker, mark) of the one batch it is, or of each worker's part of it (continuous rows)."""
        self.batches += 1
        self.wait_s += waited
        for worker, (records, tokens, streams) in parts:
            self.records += records
            self.tokens += tokens
            if streams is not None:
                self._streams[worker] = streams
                self._weights = streams.weights

    def new_pass(self, reopened: bool = False, reported: int | None = None) -> None:
        """Readers start afresh (their counters from zero): keep what the last ones counted.
        ``reopened``: they start where the last ones stood after the last batch the loop got
        (``set_weights``, a state loaded, a pass taken up again), and draw again what a packing
        stage of theirs held beyond it: that is kept out. ``reported``: the bad records the last
        ones reported (:class:`tidal.stages.policy.Reports`), their bundles the loop never fetched
        included: those count as skipped, and their successors skip them without counting them."""
        skipped = self._before.get("skipped", 0)
        self._before = self.readers()
        if reported is not None:
            self._before["skipped"] = max(self._before.get("skipped", 0), skipped + reported)
        self._streams_before = self._stream_totals(at_position=reopened)
        self._readers, self._streams = {}, {}

    def _stream_totals(self, at_position: bool = False) -> tuple[dict[str, int], dict[str, int]]:
        records, tokens = dict(self._streams_before[0]), dict(self._streams_before[1])
        for streams in self._streams.values():
            drawn, toks = (streams.records_at, streams.tokens_at) if at_position else (streams.records, streams.tokens)
            for n, v in drawn.items():
                records[n] = records.get(n, 0) + v
            for n, v in toks.items():
                tokens[n] = tokens.get(n, 0) + v
        return records, tokens

    def readers(self) -> dict:
        """Every reader's counters summed, earlier passes included."""
        return add_stats(self._before, *self._readers.values())

    def seconds(self) -> float:
        """Seconds since the loop first asked for a batch."""
        return time.perf_counter() - self.started if self.started is not None else 0.0

    def metrics(self) -> dict[str, float | int]:
        """The flat dict of :meth:`tidal.DataLoader.metrics`."""
        seconds = self.seconds()
        readers = self.readers()
        out: dict[str, float | int] = {
            "batches": self.batches,
            "records": self.records,
            "tokens": self.tokens,
            "seconds": seconds,
            "data_wait_s": self.wait_s,
            "data_wait_share": min(1.0, self.wait_s / seconds) if seconds > 0 else 0.0,
            "tokens_per_s": self.tokens / seconds if seconds > 0 else 0.0,
        }
        for key in READER_COUNTERS:
            value = readers.get(key, 0)
            out[key] = value if isinstance(value, (int, float)) else 0
        if self._weights:
            records, tokens = self._stream_totals()
            for name, weight in self._weights.items():
                out[f"tokens/{name}"] = tokens.get(name, 0)
                out[f"records/{name}"] = records.get(name, 0)
                out[f"weight/{name}"] = weight
        return out
