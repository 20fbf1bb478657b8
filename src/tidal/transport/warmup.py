"""Workers warm up in the order the training loop asks for their batches, a few at a time.

Torch starts every DataLoader worker at once, and the loop takes batches round robin from
the first. With more workers than cores, all of them fill their first shuffle block side by
side and the first batch waits for a share of the cores that shrinks with every worker
added (2.5 s with 2 workers, 5.2 s with 8, on 2 cores). Here a worker makes its first batch
only once fewer than ``slots`` workers before it in the loop's order are still making theirs
(:func:`tidal.env.warmup_workers`):
the first batches come as soon as with as many workers as cores, and the later workers fill
their blocks while the loop works through the first batches. A worker waiting for its turn
makes its reader only when the turn comes, so that it takes no core from the training process
forking the rest, or from the first workers reading (8 forked workers: 0.218 -> 0.196 s to the
first batch). Within that, the workers read their first records by point reads one at a time
(:mod:`tidal.stages.turns`): the gate gives each its turn.

What every reader imports on first use (numpy's ``random`` and ``ma``, imported by numpy only when
asked for; the modules of the data's formats; pack's, which the loader's metrics look for) is
imported once in the process the workers start from, not once in each worker
(:func:`preload_readers`): 85 ms of CPU time a worker for numpy's two, and 40 ms for Parquet's and
the line formats' modules, which 8 workers on 2 cores paid before their first batch, 0.5 s; so is
what a format works out once a process (its ``preload()``: Parquet's check of pyarrow, 10-35 ms). A
spawned worker starts afresh and imports everything, torch above all (2.6 s of its 3.0 s):
started early (``start_early``) that is spent while the script restores its model, and beyond
the cores spawned workers import in turn as well (:mod:`tidal.transport.spawn_turns`).
"""

from __future__ import annotations

import importlib
import multiprocessing
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from tidal import env
from tidal.stages import turns

T = TypeVar("T")
PATIENCE_S = 60.0  # how long a worker waits for one ahead that never reports (killed)
POLL_S = 0.005


class WarmupGate:
    """How many workers have made their first batch, shared by the workers of one loader pass.

    Made in the training process from its multiprocessing context (so it crosses to workers
    started with spawn or forkserver as the dataset does); ``first`` is the worker the loop
    asks first, so a resumed pass warms up from the worker it continues with.
    """

    def __init__(self, context: Any, workers: int, first: int, slots: int):
        self.ready = context.Value("i", 0)
        self.pointed = context.Value("i", 0)  # workers whose first point reads are done (tidal.stages.turns)
        self.workers, self.first, self.slots = workers, first, slots

    def gated(self, opened: Callable[[], Iterator[T]], worker: int) -> Iterator[T]:
        """The batches ``opened()`` makes, opened once this worker's turn to warm up has come."""
        turn = (worker - self.first) % self.workers
        points = _PointTurn(self.pointed, turn)
        turns.take(points)
        deadline = time.monotonic() + PATIENCE_S
        # a worker whose training process was killed is ended by tidal.transport.orphans
        while turn >= self.ready.value + self.slots and time.monotonic() < deadline:
            time.sleep(POLL_S)
        try:
            batches = opened()
            first = next(batches, None)
        finally:  # made, ended or failed: the next worker's turn either way
            points.done()
            with self.ready.get_lock():
                self.ready.value += 1
        if first is None:
            return
        yield first
        yield from batches


class _PointTurn:
    """A worker's turn to read its first records by point reads (:mod:`tidal.stages.turns`), the
    ``place``-th in the loop's order."""

    def __init__(self, pointed: Any, place: int):
        self._pointed, self.place, self._done = pointed, place, False

    def wait(self, behind: int) -> None:
        deadline = time.monotonic() + PATIENCE_S
        while self._pointed.value < behind and time.monotonic() < deadline:
            time.sleep(POLL_S)

    def done(self) -> None:
        if not self._done:
            self._done = True
            with self._pointed.get_lock():
                self._pointed.value += 1


def start_gate(context: Any, workers: int, first: int) -> WarmupGate | None:
    """The gate of a pass of ``workers`` started from ``context`` (None: the default), or None
    where there is one worker."""
    if workers < 2:
        return None
    return WarmupGate(context or multiprocessing.get_context(), workers, first, env.warmup_workers())


# numpy imports the first two when first used (order.rng, np.unique); the loader's metrics look
# for pack() in every worker's chain (tidal.metrics.Marker), packed or not
READERS_IMPORT = ("numpy.random", "numpy.ma", "tidal.stages.pack")


def preload_readers(context: Any) -> None:
    """Import what every reader imports on first use in the process the workers of ``context``
    (None: the default) start from: here, before they are forked; in the forkserver, with torch
    and tidal (:func:`preload_forkserver`). Spawned workers import everything themselves."""
    method = context.get_start_method() if context is not None else multiprocessing.get_start_method()
    if method == "fork":
        for name in READERS_IMPORT:
            if name not in sys.modules:
                importlib.import_module(name)
        for name, imported in list(sys.modules.items()):  # the data's formats: what each works out once
            if name.startswith("tidal.formats.") and callable(getattr(imported, "preload", None)):
                imported.preload()
    elif method == "forkserver":
        preload_forkserver(context)


def preload_forkserver(context: Any) -> None:
    """Have the forkserver (Python 3.14's default start method on Linux) import torch and tidal,
    numpy's modules readers use and the format modules this process has imported (its data's),
    before it forks the workers, so that each starts with them in a moment instead of importing
    them all at once, as spawned workers do. Added to what it preloads already; no effect once
    the server runs (it started with what was asked then)."""
    method = context.get_start_method() if context is not None else multiprocessing.get_start_method()
    if method != "forkserver":
        return
    from multiprocessing import forkserver

    preload = list(getattr(forkserver._forkserver, "_preload_modules", ["__main__"]))
    formats = sorted(m for m in sys.modules if m.startswith("tidal.formats."))
    modules = ("torch", "tidal.loader", "tidal.iterator", *READERS_IMPORT, *formats)
    wanted = [*preload, *(m for m in modules if m not in preload)]
    if wanted != preload:
        (context or multiprocessing).set_forkserver_preload(wanted)
