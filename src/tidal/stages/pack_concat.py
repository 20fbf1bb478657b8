"""``pack(strategy="concat")``: documents end to end, cut every ``seq_len`` tokens; its state is
where the chunk in progress began upstream and an offset into it (:mod:`tidal.stages.pack`)."""

from __future__ import annotations

from collections import deque

import numpy as np

from tidal.errors import StateError
from tidal.stages import Locator, StageIterator, Unlocated, add_stats
from tidal.stages.locators import Origin, Traced
from tidal.stages.packing import AHEAD_TOKENS, PackConfig, documents, needed, origins_between, windows
from tidal.state import keys as k
from tidal.state.view import View
from tidal.tables import Columns, Table


class _Chunk:
    """Documents pulled in one upstream call, end to end, and where that call started; ``items``:
    the item of the call's table each document is, and ``locator`` the table's (what its first
    items use up of the sources: :meth:`~tidal.stages.Locator.used`)."""

    def __init__(
        self,
        position: dict,
        used: dict,
        tokens: np.ndarray,
        lengths: np.ndarray,
        origins: list[list[Origin]] | None = None,
        items: list[int] | range = range(0),
        locator: Locator | None = None,
    ):
        self.position, self.used = position, used
        self.tokens = tokens
        nonempty = lengths > 0
        self.first = (np.cumsum(lengths) - lengths)[nonempty]  # where each document starts
        self.origins = [o for o, n in zip(origins, lengths, strict=True) if n] if origins is not None else None
        self.items = np.asarray(items, dtype=np.int64)[nonempty] if len(lengths) else np.zeros(0, np.int64)
        self.locator = locator

    def used_by(self, begun: int) -> dict:
        """What upstream had used up once the first ``begun`` documents were taken: where the
        call started, and for the sources they came from, each past the last of them it gave."""
        if begun == 0 or self.locator is None:
            return self.used
        spent = self.locator.used(int(self.items[begun - 1]) + 1)
        return self.used if spent is None else {**self.used, **spent}


class ConcatPackIterator(StageIterator):
    """``anew``: opened at ``position`` where the weights of the mixture above change (``set_weights``),
    it reads again only the documents the rows had begun, one at a time, so that the documents after
    them are drawn under the new weights; the positions it then reports (the upstream's before each
    of them) restore as any."""

    def __init__(
        self, upstream: StageIterator, cfg: PackConfig, position: View | None, trace: bool = False, anew: bool = False
    ):
        self._up, self._cfg = upstream, cfg
        self._trace = trace
        self._located: Locator = Unlocated()
        self._chunks: deque[_Chunk] = deque()
        self._pos = 0  # token offset into the first chunk
        self._ready: Columns | None = None  # sequences made from token _pos on, the first _served of them out
        self._served = 0
        self._ended = False
        self._dtype = np.dtype(np.int64)
        self._needed = needed(cfg)
        self.sequences = self.tokens = 0
        if position is not None:
            token = position.integer(k.TOKEN)
            if anew:
                while self._available() < token and not self._ended:
                    self._pull(1)  # the documents begun; the one that starts at token is not
            else:
                self._pull()
            if token > self._available():
                size = self._available()
                raise StateError(f"{position.where(k.TOKEN)}: token {token} is past the chunk's {size} tokens")
            self._pos = token
            while self._chunks and self._pos >= len(self._chunks[0].tokens) and (anew or len(self._chunks) > 1):
                self._pos -= len(self._chunks.popleft().tokens)

    def _pull(self, docs: int | None = None) -> None:
        state, consumed = self._up.position(), self._up.used()
        try:
            table = self._up.next(docs or self._cfg.chunk_docs)
        except StopIteration:
            self._ended = True
            self._needed.ended()
            return
        tokens, lengths, origins, items = documents(table, self._cfg, self._up, self._needed, self._trace)
        if len(lengths):
            self._dtype = tokens.dtype
        else:
            tokens = tokens.astype(self._dtype)
        self._chunks.append(_Chunk(state, consumed, tokens, lengths, origins, items, self._up.locate()))

    def _available(self) -> int:
        return sum(len(c.tokens) for c in self._chunks) - self._pos

    def next(self, max_items: int) -> Table:
        L = self._cfg.seq_len
        if self._ready is None or self._served == len(self._ready):
            self._ready, self._served = self._windows_ahead(max_items), 0
        n = min(max_items, len(self._ready) - self._served)
        out = Columns({name: rows[self._served : self._served + n] for name, rows in self._ready.items()})
        self._served += n
        if self._trace:
            self._located = Traced(self._origins(n))
        self._pos += n * L
        while self._chunks and self._pos >= len(self._chunks[0].tokens):
            self._pos -= len(self._chunks.popleft().tokens)
        self.sequences += n
        self.tokens += n * L
        return out

    def _windows_ahead(self, max_items: int) -> Columns:
        """The next sequences: up to 8 calls' worth of ``max_items``, or :data:`AHEAD_TOKENS` tokens,
        where the stream has them, made in one go so that each numpy call's cost is paid once
        for several batches. Only made, not taken: the position moves as they are served."""
        cfg = self._cfg
        shift = 1 if cfg.shift_labels else 0
        want = max_items * max(1, min(8, AHEAD_TOKENS // (max_items * cfg.seq_len)))
        while self._available() < want * cfg.seq_len + shift and not self._ended:
            self._pull()
        n = min(want, max(0, self._available() - shift) // cfg.seq_len)
        if n == 0:
            raise StopIteration  # the remainder of the stream, shorter than a sequence
        tokens, starts = self._gather(n * cfg.seq_len + shift)
        return windows(tokens, starts, n, cfg)

    def _origins(self, n: int) -> list[list[Origin]]:
        """Where the tokens of the next ``n`` sequences are in their documents."""
        L = self._cfg.seq_len
        rows: list[list[Origin]] = [[] for _ in range(n)]
        base = -self._pos  # where the chunk starts, from the first sequence's first token
        for c in self._chunks:
            assert c.origins is not None
            first = c.first
            ends = np.append(first[1:], len(c.tokens))
            # the documents of this chunk that overlap tokens [0, n * L) of the sequences
            d0 = max(int(np.searchsorted(ends, -base, side="right")), 0)
            d1 = int(np.searchsorted(first, n * L - base, side="left"))
            for d in range(d0, d1):
                a, z = int(first[d]), int(ends[d])
                lo, hi = max(base + a, 0), min(base + z, n * L)  # the document's tokens in the sequences
                for j in range(lo // L, -(-hi // L) if hi > lo else 0):
                    s, e = max(lo, j * L), min(hi, (j + 1) * L)
                    rows[j] += origins_between(c.origins[d], s - base - a, e - base - a)
            base += len(c.tokens)
            if base >= n * L:
                break
        return rows

    def locate(self) -> Locator:
        return self._located

    def _gather(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The next ``n`` tokens and where documents start among them."""
        toks: list[np.ndarray] = []
        starts: list[np.ndarray] = []
        pos, have = self._pos, 0
        for c in self._chunks:
            if pos >= len(c.tokens):
                pos -= len(c.tokens)
                continue
            take = min(n - have, len(c.tokens) - pos)
            toks.append(c.tokens[pos : pos + take])
            a, z = np.searchsorted(c.first, [pos, pos + take])
            starts.append(c.first[a:z] - pos + have)
            pos, have = 0, have + take
            if have == n:
                break
        return (toks[0] if len(toks) == 1 else np.concatenate(toks)), np.concatenate(starts)

    def position(self) -> dict:
        if not self._chunks:  # the next chunk starts where upstream is now
            return {k.UPSTREAM: self._up.position(), k.TOKEN: 0}
        return {k.UPSTREAM: self._chunks[0].position, k.TOKEN: self._pos}

    def used(self) -> dict[str, list[int]]:
        """Documents whose first token went out are used up (an elastic restore drops the rest
        of the one in progress), with the source records before them (filtered out, or bad),
        counted through the locator of the chunk's upstream call (:meth:`~tidal.stages.Locator.used`):
        per source, just past the last document begun that came from it. Where the locator cannot
        tell (a source of another kind), the chunk is not counted and is read again."""
        if not self._chunks:
            return self._up.used()
        chunk = self._chunks[0]
        return chunk.used_by(int(np.searchsorted(chunk.first, self._pos)))  # documents begun

    def stats(self) -> dict:
        return add_stats(self._up.stats(), {"sequences": self.sequences, "packed_tokens": self.tokens})

    def close(self) -> None:
        self._up.close()
