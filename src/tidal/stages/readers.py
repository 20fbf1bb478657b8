"""The format readers one read stage has open: bounded when idle, never closed while in use.

A shuffle block may read hundreds of files (books, code repositories, per-domain dumps hold
few records each), and the threads of :mod:`tidal.stages.blocks` read them side by side. A
reader is *taken* for each read and *given back* after it; only readers nobody holds count
against ``limit`` and are closed, least recently used first, when there are more. So the
files open at once are the idle ``limit`` plus one per read in flight (one per thread), at
any number of files per block, and no read ever finds its file closed under it.

Each reader is opened by the thread that first takes it (opening a Parquet footer or waiting
for a remote shard's download then runs beside the others' reads). ``closed(index)`` is
called after a reader is closed, so a remote shard's copy can be let go.

>>> readers = OpenReaders(open_reader, closed, limit=64)
>>> with readers.using(3) as reader:
...     piece = reader.read(0, 100)
"""

from __future__ import annotations

import contextlib
import os
from collections import OrderedDict
from collections.abc import Callable, Iterator

from tidal import fork_safe
from tidal.formats import Reader


class NotOpened(Exception):
    """Opening a file's reader failed: ``cause`` is why. Told apart from a failed read because
    a file that cannot be opened is skipped from then on, while a bad read may be retried."""

    def __init__(self, cause: Exception):
        super().__init__(str(cause))
        self.cause = cause


class OpenReaders:
    """Readers by shard index: ``limit`` idle ones kept open (LRU), any number in use.

    Thread-safe (its lock free again in a child of ``fork``: :mod:`tidal.fork_safe`). After
    ``fork`` the child's readers were the parent's, possibly mid-read in threads the child does
    not have: the child closes them and opens its own (see :meth:`_forked`)."""

    def __init__(self, open_reader: Callable[[int], Reader], closed: Callable[[int], None], limit: int = 64):
        self._open_reader = open_reader
        self._closed = closed
        self.limit = limit
        self._lock = fork_safe.Lock()
        self._getpid = os.getpid  # kept: at interpreter exit a reader left open closes after ``os`` is torn down
        self._pid = self._getpid()
        self._idle: OrderedDict[int, Reader] = OrderedDict()  # open, held by no read; least recent first
        self._busy: dict[int, tuple[Reader, int]] = {}  # held: the reader and how many hold it

    def __len__(self) -> int:
        with self._lock:
            return len(self._idle) + len(self._busy)

    def indices(self) -> list[int]:
        """The shards with a reader open."""
        self._forked()
        with self._lock:
            return [*self._idle, *self._busy]

    @contextlib.contextmanager
    def using(self, index: int) -> Iterator[Reader]:
        """Shard ``index``'s reader, held for the ``with`` block; a failure inside closes it, so
        the next read opens the file afresh. :class:`NotOpened` if it cannot be opened."""
        reader = self.take(index)
        try:
            yield reader
        except BaseException:
            self.drop(index, reader)
            raise
        self.give(index, reader)

    def take(self, index: int) -> Reader:
        """Hold shard ``index``'s reader, opening it if none is open."""
        self._forked()
        with self._lock:
            reader = self._idle.pop(index, None)
            if reader is None and index in self._busy:
                reader, holders = self._busy[index]
                self._busy[index] = (reader, holders + 1)
                return reader
            if reader is not None:
                self._busy[index] = (reader, 1)
                return reader
        try:  # outside the lock: a slow open (a footer, a download) does not stop the other threads
            reader = self._open_reader(index)
        except Exception as exc:
            raise NotOpened(exc) from exc
        with self._lock:
            if index not in self._busy:
                self._busy[index] = (reader, 1)
        return reader  # opened twice at once: the second one is closed when given back

    def give(self, index: int, reader: Reader) -> None:
        """Done with ``reader``: it stays open, idle, while the idle ones are within the limit."""
        self._forked()
        with self._lock:
            held = self._busy.get(index)
            if held is None or held[0] is not reader:
                surplus = [(index, reader)]
            else:
                if held[1] > 1:
                    self._busy[index] = (reader, held[1] - 1)
                    return
                del self._busy[index]
                self._idle[index] = reader
                surplus = []
                while len(self._idle) > self.limit:
                    surplus.append(self._idle.popitem(last=False))
        self._close(surplus)

    def drop(self, index: int, reader: Reader | None = None) -> None:
        """Close shard ``index``'s reader (``reader``, or whichever is open) now: it failed, and a
        later read opens the file afresh."""
        self._forked()
        with self._lock:
            if reader is None:
                held = self._busy.pop(index, None)
                reader = held[0] if held is not None else self._idle.pop(index, None)
            elif index in self._busy and self._busy[index][0] is reader:
                del self._busy[index]
            elif self._idle.get(index) is reader:
                del self._idle[index]
        if reader is not None:
            self._close([(index, reader)], quiet=True)

    def close_idle(self, keep: Callable[[int], bool]) -> None:
        """Close the idle readers for which ``keep`` is false."""
        self._forked()
        with self._lock:
            surplus = [(i, r) for i, r in self._idle.items() if not keep(i)]
            for i, _ in surplus:
                del self._idle[i]
        self._close(surplus)

    def close(self) -> None:
        """Close every reader (reads in flight must have ended)."""
        self._forked()
        with self._lock:
            everything = [*self._idle.items(), *((i, r) for i, (r, _) in self._busy.items())]
            self._idle.clear()
            self._busy.clear()
        self._close(everything)

    def _close(self, readers: list[tuple[int, Reader]], quiet: bool = False) -> None:
        for index, reader in readers:
            try:
                reader.close()
            except Exception:
                if not quiet:
                    raise
            finally:
                self._closed(index)

    def _forked(self) -> None:
        """In a child of ``fork``: the parent's readers closed (they may have been mid-read)."""
        if self._pid == self._getpid():
            return
        self._pid = self._getpid()
        everything = [*self._idle.items(), *((i, r) for i, (r, _) in self._busy.items())]
        self._idle.clear()
        self._busy.clear()
        self._close(everything, quiet=True)
