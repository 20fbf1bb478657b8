"""Whose bad records a block's are: the rows of its files that fall in what this reader reads.

Every reader of a block reads it whole (:mod:`tidal.stages.blocks`) and yields its share of it,
so a bad record is raised or counted by the reader that would have yielded it, once in the job,
and never again by a reader that replaces one that reported it already (``set_weights``). Apart
from the block reader because it is a question of the epoch's order and the policy, not of
reading.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from tidal.order import EpochOrder, Intervals
from tidal.stages.policy import Policy
from tidal.storage.retry import redact_urls

if TYPE_CHECKING:
    from tidal.sources.shards import Shards


class Owned:
    """Which rows of a block's files fall in what this reader reads of the epoch (its share, and
    the remainder where it reads that): every reader reads the whole block and yields its share
    of it, so a bad record is raised or counted by the reader that would have yielded it, once
    in the job (worked out only for bad rows)."""

    def __init__(
        self,
        policy: Policy,
        owns: Callable[[int], Intervals],  # the positions of an epoch whose bad records are this reader's
        shards: Shards,
        order: EpochOrder,
        b: int,
        slices: list[tuple[int, int, int]],
        perm: np.ndarray | None,
        intervals: Intervals | None = None,  # the positions whose bad records are its own (else asked)
    ):
        self.epoch = order.epoch
        self._base = int(order.starts[b])
        self._n = int(order.starts[b + 1]) - self._base
        self._before = policy.reported_before(order.epoch)  # reported by the readers it replaces
        intervals = owns(order.epoch) if intervals is None else intervals
        self._intervals = [
            (a - self._base, z - self._base) for a, z in intervals if a < self._base + self._n and z > self._base
        ]
        self._perm = perm
        self._files: dict[str, list[tuple[int, int, int]]] = {}  # path: (first row, stop, where in the block)
        at = 0
        for shard, a, z in slices:
            self._files.setdefault(redact_urls(shards[shard].path), []).append((a, z, at))
            at += z - a
        self._mine: np.ndarray | None = None

    def mine(self) -> np.ndarray:
        """Per row of the block (in file order), whether it is in this reader's share."""
        if self._mine is None:
            positions = np.zeros(self._n, dtype=bool)
            for a, z in self._intervals:
                positions[max(a, 0) : min(z, self._n)] = True
            if self._perm is None:
                self._mine = positions
            else:  # position j yields row perm[j]
                self._mine = np.zeros(self._n, dtype=bool)
                self._mine[self._perm[positions]] = True
            for path, rows in self._before.items():  # reported in the pass already (set_weights): not again
                for a, z, at in self._files.get(path, ()):
                    for row in rows:
                        if a <= row < z:
                            self._mine[at + row - a] = False
        return self._mine

    def count(self, bad: np.ndarray) -> int:
        return int((bad & self.mine()).sum())

    def __call__(self, path: str, row: int) -> bool:
        for a, z, at in self._files.get(path, ()):
            if a <= row < z:
                return bool(self.mine()[at + row - a])
        return True  # not a row of this block: it cannot be told, so it is this reader's
