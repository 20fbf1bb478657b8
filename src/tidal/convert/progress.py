"""The progress of a conversion on stderr: a tqdm bar of source records (tqdm: the ``cli`` extra),
else a line per finished shard."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from tidal.convert.task import Job


class Progress:
    """A tqdm bar of source records on stderr (tqdm is the ``cli`` extra), else a line per shard.

    A task in this process reports its records as it reads them; a task elsewhere (another
    process, a Ray worker) counts when its shard is done."""

    def __init__(self, job: Job, done: dict[int, dict], enabled: bool | None):
        self.job = job
        self.done = dict(done)
        self._counted: dict[int, int] = {}  # records already shown of shards in progress here
        self._bar: Any = None
        self._lines = False
        if enabled is None:
            enabled = sys.stderr.isatty()
        if not enabled:
            return
        try:
            from tqdm import tqdm
        except ImportError:
            self._lines = True
            return
        first = sum(b - a for s, (a, b) in enumerate(job.ranges) if s in done)
        self._bar = tqdm(total=job.total, initial=first, unit="rec", unit_scale=True, desc="convert", file=sys.stderr)
        self._bar.set_postfix_str(self._shards())

    def _shards(self) -> str:
        return f"{len(self.done)}/{len(self.job.ranges)} shards"

    def counter(self, shard: int) -> Callable[[int], None]:
        """What a task in this process calls with the records it has read."""

        def count(n: int) -> None:
            self._counted[shard] = self._counted.get(shard, 0) + n
            if self._bar is not None:
                self._bar.update(n)

        return count

    def shard_done(self, result: tuple[int, dict]) -> None:
        shard, entry = result
        self.done[shard] = entry
        a, b = self.job.ranges[shard]
        if self._bar is not None:
            self._bar.update(b - a - self._counted.pop(shard, 0))
            self._bar.set_postfix_str(self._shards())
        elif self._lines:
            print(f"convert: {self._shards()} ({entry.get('name') or 'no records'})", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
