"""Workers warm up in the order the training loop asks for their batches, a few at a time.

Torch starts every DataLoader worker at once, and the loop takes batches round robin from
the first. With more workers than cores, all of them fill their first shuffle block side by
side and the first batch waits for a share of the cores that shrinks with every worker
added (2.5 s with 2 workers, 5.2 s with 8, on 2 cores). Here a worker makes its first batch
only once fewer than ``slots`` workers before it in the loop's order are still making theirs
(:func:`tidal.env.warmup_workers`):
the first batches come as soon as with as many workers as cores, and the later workers fill
their blocks while the loop works through the first batches.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any, TypeVar

T = TypeVar("T")
PATIENCE_S = 60.0  # how long a worker waits for one ahead that never reports (killed)
_POLL_S = 0.005


class WarmupGate:
    """How many workers have made their first batch, shared by the workers of one loader pass.

    Made in the training process from its multiprocessing context (so it crosses to workers
    started with spawn or forkserver as the dataset does); ``first`` is the worker the loop
    asks first, so a resumed pass warms up from the worker it continues with.
    """

    def __init__(self, context: Any, workers: int, first: int, slots: int):
        self.ready = context.Value("i", 0)
        self.workers, self.first, self.slots = workers, first, slots
        self.loop = os.getpid()  # the training process: a worker whose parent it is no longer waits no longer

    def gated(self, batches: Iterator[T], worker: int) -> Iterator[T]:
        """``batches``, their first made once this worker's turn to warm up has come."""
        turn = (worker - self.first) % self.workers
        deadline = time.monotonic() + PATIENCE_S
        while turn >= self.ready.value + self.slots and time.monotonic() < deadline and os.getppid() == self.loop:
            time.sleep(_POLL_S)
        try:
            first = next(batches, None)
        finally:  # made, ended or failed: the next worker's turn either way
            with self.ready.get_lock():
                self.ready.value += 1
        if first is None:
            return
        yield first
        yield from batches
