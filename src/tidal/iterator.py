"""One reader's items, one by one, with an exact state after each.

Items are pulled from the stages in chunks; the state is the chain's position at the start
of the current chunk plus how many of its items were yielded (``within``). A chunk pulled
from a given position is always the same, so that pair names the position exactly. Chunks
of many items are pulled only where each item stands for one source record (``exact``);
elsewhere a chunk is one item and ``within`` is 0.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from typing import Any

from tidal.closing import close_at_exit, close_dropped
from tidal.errors import StateError, TidalError
from tidal.stages import Context, Stage
from tidal.stages.locators import Locator, Origin, Unlocated
from tidal.stages.weights import Live
from tidal.state import keys as k
from tidal.state.schema import check_dataset
from tidal.state.view import View
from tidal.tables import records
from tidal.world import World


class DatasetIterator(Iterator[Any]):
    """Yields one reader's items; ``state()`` restores to exactly the next one.

    >>> it = ds.iterator()
    >>> first = next(it); state = it.state()         # JSON-able
    >>> ds.iterator(state=state)                      # continues with the second item
    """

    CHUNK = 256

    def __init__(
        self,
        stage: Stage,
        fingerprint: str,
        world: World,
        state: dict | None,
        first_epoch: int,
        origin: dict | None,
        where: str = "state",
        weights: Mapping[str, float] | None = None,
        trace: bool = False,
        replay: bool = False,
    ):
        self.world = world
        self.stage = stage
        self._fingerprint = fingerprint
        position: View | None = None
        within = 0
        self.items = 0
        self.stats_at_state: dict | None = None  # the chain's counters when state() was last called
        saved = None
        if state is not None:
            view = View(state, where)
            check_dataset(view, fingerprint)
            saved = view.entries(k.READER, length=4)
            here = [world.rank, world.world_size, world.worker, world.num_workers]
            if saved != here:
                raise StateError(f"this state was saved by reader {saved} (rank, ranks, worker, workers), not {here}")
            origin = view.get(k.ORIGIN, origin)  # a loader keeps the origin once, beside its readers
            if origin is not None:
                View(origin, view.where(k.ORIGIN))
            position = view.view(k.POSITION)
            within = view.integer(k.WITHIN)
            self.items = view.view(k.COUNTS).integer(k.ITEMS)
            saved = view.get(k.WEIGHTS, None)
        self._origin = origin
        self._trace = trace
        self._located: Locator = Unlocated()  # with trace, or chunks of many: where the chunk's items came from
        self._live = Live(saved, f"{where}['{k.WEIGHTS}']")
        self._live.coming = weights
        ctx = Context(world, first_epoch, origin, weights=self._live, trace=trace, replay=replay)
        self._top = stage.open(ctx, position)
        self._reader: threading.Thread | None = None  # the thread that read with it last (see at_exit)
        close_at_exit(self)
        self._live.check_attached()
        if weights is not None:  # set on the loader: from the next draw past this state on
            self._live.switch(weights)
        self._chunk_size = self.CHUNK if self._top.exact else 1
        self._chunk: list[Any] = []
        self._at = 0
        self._chunk_position = self._top.position()
        self._chunk_used = self._top.used()
        self._stated = self._chunk_position  # the position of the last state()
        self._done = False
        if within:
            self._fill()
            if within > len(self._chunk):
                raise StateError(f"{where}['{k.WITHIN}']: {within} items is past the chunk's {len(self._chunk)}")
            self._at = within

    def _fill(self) -> None:
        self._chunk_position, self._chunk_used = self._top.position(), self._top.used()
        self._reader = threading.current_thread()
        try:
            self._chunk = records(self._top.next(self._chunk_size))
            if self._trace or self._chunk_size > 1:
                self._located = self._top.locate()
        except StopIteration:
            self._chunk, self._done = [], True
        except TidalError:
            self.close()  # the pass ends here: its files close now, not when the iterator is collected
            raise
        self._at = 0

    def __next__(self) -> Any:
        if self._at >= len(self._chunk):
            if not self._done:
                self._fill()
            if not self._chunk:
                self.close()
                raise StopIteration
        item = self._chunk[self._at]
        self._at += 1
        self.items += 1
        return item

    def rows(self) -> list[list[Origin]]:
        """With ``trace=True``: where the item yielded last came from, row by row (see :mod:`tidal.provenance`)."""
        return self._located.rows(self._at - 1)

    def stats(self) -> dict:
        """Counters: items yielded, rows read, bad records skipped, tokens, padding, downloads."""
        return {"items": self.items, **self._top.stats()}

    def state(self) -> dict:
        """Small and JSON-able: restores to exactly the next item."""
        if self._at >= len(self._chunk):
            position, within = self._top.position(), 0
        else:
            position, within = self._chunk_position, self._at
        state = {
            k.DATASET: self._fingerprint,
            k.READER: [self.world.rank, self.world.world_size, self.world.worker, self.world.num_workers],
            k.POSITION: position,
            k.WITHIN: within,
            k.USED: self.used(),
            k.COUNTS: {k.ITEMS: self.items, k.RECORDS: self._passed()},
        }
        if self._origin:
            state[k.ORIGIN] = self._origin
        changes = self._live.saved(position)
        if changes is not None:
            state[k.WEIGHTS] = changes
        self._stated = position
        return state

    def streams(self) -> tuple[dict, dict, dict, dict, dict] | None:
        """The top mixture's counts per stream, now and at the position of the last ``state()``, and
        its weights there (:meth:`tidal.stages.weights.Live.streams`); None without a mixture."""
        return self._live.streams(self._stated)

    def _passed(self) -> int:
        self.stats_at_state = stats = self._top.stats()  # kept for the batch's mark (tidal.metrics.Marker)
        passed = stats.get("passed", 0)
        if self._at < len(self._chunk) and self._top.exact:
            passed -= len(self._chunk) - self._at  # the chunk's items not yet yielded
        return int(passed)

    def used(self) -> dict[str, list[int]]:
        """Source positions used up so far, ``{source key: [epoch, offset]}``: see :mod:`tidal.state.elastic`."""
        if self._at >= len(self._chunk):
            return self._top.used()
        if self._at == 0:
            return self._chunk_used
        # just past the items yielded (a chunk may begin at the end of an epoch and hold the next's)
        spent = self._located.used(self._at)
        if spent is not None:
            return {**self._chunk_used, **spent}
        ((key, (epoch, offset)),) = self._chunk_used.items()  # chunks of many only in exact chains
        return {key: [epoch, offset + self._at]}

    def close(self) -> None:
        """Close the files this iterator holds open (also done at its end)."""
        self._top.close()

    def at_exit(self) -> None:
        """Closed as the interpreter exits (:func:`tidal.closing.close_at_exit`), unless another
        thread still running reads with it (a daemon thread of the script's, a reader thread of
        ``tidal.jax``): that thread keeps it, and closing its files under it fails its reads."""
        reader = self._reader
        if reader is None or reader is threading.current_thread() or not reader.is_alive():
            self.close()

    def __del__(self) -> None:
        top = getattr(self, "_top", None)
        if top is not None:
            try:  # noqa: SIM105  (not contextlib: as the interpreter exits, module globals are gone)
                close_dropped(top)  # (tidal.closing)
            except Exception:
                pass
