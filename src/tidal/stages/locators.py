"""Locators: where the records of a table came from, to hand one back as bad or say what it is made of.

A stage that finds a record it cannot use hands it back with ``upstream.locate().reject(i, why)``;
the source stage names its file and row and puts it to the reader's ``errors`` policy, and
stages in between map the index to theirs (:class:`Kept` after a filter, :class:`Joined` over
tables put together, :class:`Batched` for a batch's rows). ``origins(i)`` is what item ``i`` is
made of, as :class:`Origin` values (:mod:`tidal.provenance`). Apart from :mod:`tidal.stages`
because a locator is what a stage's table carries, not what a stage is.
"""

from __future__ import annotations

import bisect
from typing import NamedTuple

from tidal.errors import RecordError, Untraceable


class Origin(NamedTuple):
    """Where (part of) an item came from: record ``row`` (0-based) of ``file``; for a packed
    row, the token range ``[start, end)`` of that document it holds (else None); the mixture
    ``stream`` it was drawn from (else None); the ``epoch`` it was read in and its source key."""

    file: str
    row: int
    start: int | None = None
    end: int | None = None
    stream: str | None = None
    epoch: int = 0
    source: str = ""

    def segment(self) -> dict:
        """The public form: ``{"file", "row", "start", "end", "stream"}``."""
        return {"file": self.file, "row": self.row, "start": self.start, "end": self.end, "stream": self.stream}


class Locator:
    """The records of one table as they came from the source: :meth:`reject` hands one back as
    bad, :meth:`origins` says where one came from."""

    def reject(self, i: int, why: str) -> None:
        """Item ``i`` cannot be used, for reason ``why``: a :class:`~tidal.RecordError` naming its
        file and row goes to the ``errors`` policy of the reader it came from, which raises it or
        skips it (counted in ``stats()["skipped"]``); the caller drops the item when this returns."""
        raise NotImplementedError

    def origins(self, i: int) -> list[Origin]:
        """What item ``i`` is made of: one record, or the pieces of documents of a packed row."""
        raise Untraceable("this stage does not say where its items came from")

    def rows(self, i: int) -> list[list[Origin]]:
        """The rows of item ``i``, each as :meth:`origins` gives it: one row, or a batch's rows."""
        return [self.origins(i)]

    def used(self, n: int) -> dict[str, list[int]] | None:
        """What the table's first ``n`` items (``n >= 1``) use up of the sources they came from, as
        :meth:`StageIterator.used` says it (``{source key: [epoch, offset]}``), for those sources
        only: where a packer that has begun ``n`` of them stands, for an elastic restore. None
        where this locator cannot tell."""
        return None


class Unlocated(Locator):
    """Items that stand for no one record (batches, packed sequences): an error with no place."""

    def reject(self, i: int, why: str) -> None:
        raise RecordError(why)


class Traced(Unlocated):
    """Items whose provenance a stage opened with ``trace=True`` worked out: ``rows[i]`` for item ``i``."""

    def __init__(self, rows: list[list[Origin]]):
        self._rows = rows

    def origins(self, i: int) -> list[Origin]:
        return self._rows[i]


class Batched(Unlocated):
    """One batch (item 0) of the ``count`` items of ``parts`` (see :class:`Joined`), row by row."""

    def __init__(self, parts: list[tuple[int, Locator]], count: int):
        self._joined, self._count = Joined(parts), count

    def rows(self, i: int) -> list[list[Origin]]:
        return [self._joined.origins(j) for j in range(self._count)]


class Kept(Locator):
    """The items a stage kept of its upstream's table: item ``i`` is upstream's ``kept[i]``."""

    def __init__(self, upstream: Locator, kept: list[int]):
        self._up, self._kept = upstream, kept

    def reject(self, i: int, why: str) -> None:
        self._up.reject(self._kept[i], why)

    def origins(self, i: int) -> list[Origin]:
        return self._up.origins(self._kept[i])

    def used(self, n: int) -> dict[str, list[int]] | None:
        return self._up.used(self._kept[n - 1] + 1)


class Joined(Locator):
    """Items taken from several tables one after the other: ``parts`` of (first item, its locator)."""

    def __init__(self, parts: list[tuple[int, Locator]]):
        self._parts = parts

    def reject(self, i: int, why: str) -> None:
        first, locator = self._part(i)
        locator.reject(i - first, why)

    def origins(self, i: int) -> list[Origin]:
        first, locator = self._part(i)
        return locator.origins(i - first)

    def used(self, n: int) -> dict[str, list[int]] | None:
        """Per source, what the last of the first ``n`` items taken from it uses up (a mixture's
        streams: each where its last item among them left it)."""
        out: dict[str, list[int]] = {}
        end = n
        for first, locator in reversed(self._parts):
            if first < n:
                part = locator.used(end - first)
                if part is None:
                    return None
                for key, value in part.items():
                    out.setdefault(key, value)
            end = min(end, first)
        return out

    def _part(self, i: int) -> tuple[int, Locator]:
        return self._parts[bisect.bisect_right([f for f, _ in self._parts], i) - 1]
