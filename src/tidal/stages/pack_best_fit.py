"""``pack(strategy="best_fit")``: best-fit-decreasing over a buffer of about ``buffer_size``
sequences' worth of documents, padded; its state is where the buffer began upstream and the
sequences of it already given (:mod:`tidal.stages.pack`)."""

from __future__ import annotations

import bisect

import numpy as np

from tidal.errors import StateError
from tidal.stages import Locator, StageIterator, Unlocated, add_stats
from tidal.stages.locators import Origin, Traced
from tidal.stages.packing import IGNORE, PackConfig, documents, needed, origins_between
from tidal.state import keys as k
from tidal.state.view import View
from tidal.tables import Table


class BestFitPackIterator(StageIterator):
    def __init__(self, upstream: StageIterator, cfg: PackConfig, position: View | None, trace: bool = False):
        self._up, self._cfg = upstream, cfg
        self._trace = trace
        self._located: Locator = Unlocated()
        self._bins: list[dict] = []
        self._bin_origins: list[list[Origin]] = []  # with trace: where each bin's pieces are in their documents
        self._emitted = 0
        self._buffer_position: dict | None = None
        self._buffer_used: dict = {}
        self._needed = needed(cfg)
        self.sequences = self.tokens = self.padding = 0
        if position is not None:
            emitted = position.integer(k.EMITTED)
            self._fill()
            if emitted > len(self._bins):
                where = position.where(k.EMITTED)
                raise StateError(f"{where}: {emitted} sequences is past the buffer's {len(self._bins)}")
            self._emitted = emitted

    def _fill(self) -> None:
        cfg = self._cfg
        self._buffer_position, self._buffer_used = self._up.position(), self._up.used()
        self._bins, self._emitted = [], 0
        docs: list[np.ndarray] = []
        origins: list[list[Origin]] = []
        budget = cfg.buffer_size * cfg.seq_len
        total = longest = 0
        while total < budget:
            # as many documents as fill what is left at seq_len tokens each (or the buffer's longest
            # yet: a function of the buffer alone, so a restore pulls it again alike); shorter ones
            # leave room for the next call, so the buffer ends with the document that fills it
            want = max(1, min(cfg.chunk_docs, (budget - total) // max(cfg.seq_len, longest)))
            try:
                table = self._up.next(want)
            except StopIteration:
                self._needed.ended()
                break
            tokens, lengths, where, _ = documents(table, cfg, self._up, self._needed, self._trace)
            docs += np.split(tokens, np.cumsum(lengths)[:-1]) if len(lengths) else []
            origins += where or []
            total += len(tokens)
            if len(lengths):
                longest = max(longest, int(lengths.max()))
        if docs:
            self._bins = self._pack(docs, origins if self._trace else None)

    def _pack(self, docs: list[np.ndarray], origins: list[list[Origin]] | None = None) -> list[dict]:
        L = self._cfg.seq_len
        pieces = [(d, a, min(a + L, len(doc))) for d, doc in enumerate(docs) for a in range(0, len(doc), L)]
        pieces.sort(key=lambda p: p[1] - p[2])  # longest first; stable, so ties keep stream order
        free: list[tuple[int, int]] = []  # (room left, bin) sorted
        bins: list[list[tuple[int, int, int]]] = []
        for piece in pieces:
            size = piece[2] - piece[1]
            k = bisect.bisect_left(free, (size, -1))
            if k == len(free):
                bins.append([piece])
                room, b = L - size, len(bins) - 1
            else:
                room, b = free.pop(k)
                bins[b].append(piece)
                room -= size
            if room > 0:
                bisect.insort(free, (room, b))
        if origins is not None:
            self._bin_origins = [
                [p for d, a, z in content for p in origins_between(origins[d], a, z)] for content in bins
            ]
        return [self._sequence(docs, content) for content in bins]

    def _sequence(self, docs: list[np.ndarray], pieces: list[tuple[int, int, int]]) -> dict:
        cfg, L = self._cfg, self._cfg.seq_len
        input_ids = np.full(L, cfg.pad_id, dtype=docs[0].dtype)
        labels = np.full(L, IGNORE, dtype=np.int64)
        position_ids = np.zeros(L, dtype=np.int64)
        segment_ids = np.zeros(L, dtype=np.int32)
        at = 0
        for n_piece, (d, a, z) in enumerate(pieces):
            doc, n = docs[d], z - a
            input_ids[at : at + n] = doc[a:z]
            position_ids[at : at + n] = np.arange(n)
            segment_ids[at : at + n] = n_piece + 1
            if cfg.shift_labels:  # the last label is the document's next token if it goes on past the cut
                labels[at : at + n - 1] = doc[a + 1 : z]
                labels[at + n - 1] = doc[z] if z < len(doc) else IGNORE
            else:  # the first token of a piece cannot be predicted from the piece before it
                labels[at + 1 : at + n] = doc[a + 1 : z]
            at += n
        self.padding += L - at
        made = {"input_ids": input_ids, "labels": labels, "position_ids": position_ids, "segment_ids": segment_ids}
        return {name: made[name] for name in cfg.outputs}

    def locate(self) -> Locator:
        return self._located

    def next(self, max_items: int) -> Table:
        out: list[dict] = []
        where: list[list[Origin]] = []
        while len(out) < max_items:
            if self._emitted >= len(self._bins):
                self._fill()
                if not self._bins:
                    break
            take = self._bins[self._emitted : self._emitted + max_items - len(out)]
            if self._trace:
                where += self._bin_origins[self._emitted : self._emitted + len(take)]
            out += take
            self._emitted += len(take)
        if not out:
            raise StopIteration
        if self._trace:
            self._located = Traced(where)
        self.sequences += len(out)
        self.tokens += len(out) * self._cfg.seq_len
        return out

    def position(self) -> dict:
        if self._emitted >= len(self._bins) or self._buffer_position is None:
            return {k.UPSTREAM: self._up.position(), k.EMITTED: 0}
        return {k.UPSTREAM: self._buffer_position, k.EMITTED: self._emitted}

    def used(self) -> dict[str, list[int]]:
        """The buffer in progress is not counted: an elastic restore packs it again."""
        if self._emitted >= len(self._bins) or self._buffer_position is None:
            return self._up.used()
        return self._buffer_used

    def stats(self) -> dict:
        total = self.tokens
        mine = {"sequences": self.sequences, "padding": self.padding / total if total else 0.0}
        return add_stats(self._up.stats(), mine)

    def close(self) -> None:
        self._up.close()
