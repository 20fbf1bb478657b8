"""The threads a reader reads a block's files with, side by side, and the next block ahead in.

Where decoding releases the GIL (Parquet, Arrow; remote files too: their local copies, or
ranged GETs, which release the GIL as they wait), a block's files are read at once in threads
(one thread decodes Parquet at 0.5 GB/s), and the next block is read in them while the loop
takes the batches of this one. A DataLoader worker reads ahead too: the loop takes batches from
the workers in turn, so one worker decoding its next block in its own thread would hold up the
loop, and every other worker with it. What a thread's read skips is deferred to the policy
until its piece is taken, so the policy sees it in file order. Apart from
:mod:`tidal.stages.blocks`, which decides what to read, because when and where it is read is a
job of its own.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Container, Iterator
from concurrent.futures import Future, wait

from tidal import closing
from tidal.errors import TidalError
from tidal.formats import Piece
from tidal.pools import Threads
from tidal.stages.policy import Policy


def one_per_file(slices: list[tuple[int, int, int]]) -> bool:
    """Whether no two slices read one file: a file's reader reads one slice at a time."""
    return len({s for s, _, _ in slices}) == len(slices)


class ReadThreads:
    """``count`` threads (0: none) reading with ``read_held(shard, a, z)``, made in the process that reads."""

    def __init__(self, count: int, policy: Policy, read_held: Callable[[int, int, int], Piece]):
        self.count = count
        self._policy, self._read_held = policy, read_held
        self._pool: tuple[int, Threads] | None = None  # (the pid it was made in, its threads)
        self._reading: list[Future[Piece]] = []  # reads in flight
        # the next block, being read (see ahead): (pid, its slices, their reads, what they skipped)
        self._ahead: tuple[int, list, dict[int, Future[Piece]], dict[str, list[TidalError]]] | None = None

    def pieces(
        self, slices: list[tuple[int, int, int]], read: Callable[..., Piece], broken: Container[int]
    ) -> Iterator[Piece]:
        """Each slice's rows, in order. Where decoding releases the GIL and the reader has threads
        to spare, the files are read side by side in them (one thread decodes Parquet at 0.5 GB/s).
        The block read ahead (:meth:`ahead`) is taken as it is when it is the one asked for.
        ``read(shard, a, z[, done, deferred])``: a slice's piece, read here or taken from a thread;
        ``broken``: shards that could not be opened, never submitted."""
        ahead, self._ahead = self._ahead, None
        if self._reading:  # reads ahead, or reads an interrupt left running: they use the readers, so they end first
            if self._pool is not None and self._pool[0] == os.getpid():
                wait(self._reading)
            # else made before a fork: their threads are not in this process; the readers they were
            # using are the parent's, closed by OpenReaders when this process first uses it
            self._reading = []
        self._policy.deferred = None
        if ahead is not None and ahead[0] == os.getpid() and ahead[1] == slices:
            reads, deferred = ahead[2], ahead[3]
        elif not self.side_by_side(slices):
            for shard, a, z in slices:
                yield read(shard, a, z)
            return
        else:
            reads, deferred = self._submit(slices, broken)
            try:
                wait(self._reading)
                self._reading = []
            finally:
                self._policy.deferred = None
        for shard, a, z in slices:
            yield read(shard, a, z, reads.get(shard), deferred)

    def side_by_side(self, slices: list[tuple[int, int, int]]) -> bool:
        """Whether the threads read these slices at once (several files, threads to read them)."""
        return self.count >= 2 and len(slices) >= 2 and one_per_file(slices)

    def _submit(
        self, slices: list[tuple[int, int, int]], broken: Container[int]
    ) -> tuple[dict[int, Future[Piece]], dict[str, list[TidalError]]]:
        """Start reading ``slices`` in the threads, each opening its file's reader if none is open;
        what they skip is deferred until each piece is taken (the reader's ``read``), so that the policy
        sees it in file order."""
        pool = self._pool
        if pool is None or pool[0] != os.getpid():  # made in the process that reads (a fork has no threads)
            closing.start()  # the threads a close joins: a dropped iterator may need it (tidal.closing)
            pool = self._pool = (
                os.getpid(),
                Threads(max(1, self.count), thread_name_prefix="tidal-read"),
            )
        deferred: dict[str, list[TidalError]] = {}
        self._policy.deferred = deferred
        reads = {s: pool[1].submit(self._read_held, s, a, z) for s, a, z in slices if s not in broken}
        self._reading = list(reads.values())
        return reads, deferred

    def ahead(self, slices: list[tuple[int, int, int]], broken: Container[int]) -> None:
        """Start reading ``slices``, the block the reader takes next, while the loop takes the
        batches of this one: :meth:`pieces` takes them when that block is asked for."""
        if not one_per_file(slices):
            return
        reads, deferred = self._submit(slices, broken)
        self._ahead = (os.getpid(), slices, reads, deferred)

    def close(self) -> None:
        pool, self._pool = self._pool, None
        try:
            if pool is not None and pool[0] == os.getpid():
                pool[1].shutdown(wait=True)  # a read in flight (the loop was interrupted) ends before its file closes
        except Exception:  # the interpreter is exiting (its globals are gone): the threads were joined already
            pass
