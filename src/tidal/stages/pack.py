"""Packing: token streams into fixed-length sequences for causal language models.

Every sequence carries ``input_ids``, ``labels``, ``position_ids`` (restarting at each
document, and at the start of the sequence) and ``segment_ids`` (1, 2, ... per document
piece in the sequence, 0 on padding), which varlen attention kernels take as document
boundaries; :func:`cu_seqlens` turns a batch's ``position_ids`` into the cumulative lengths
FlashAttention's varlen functions want.

``labels``: with ``shift_labels=True`` (default) ``labels[i]`` is the token that follows
``input_ids[i]``, ready for a plain cross-entropy; with ``shift_labels=False`` they are
aligned with ``input_ids``, for models that shift internally (Hugging Face). Padding, and
with ``mask_boundaries=True`` every prediction across a document boundary, is ``-100``.

Strategies:

- ``concat``: documents (each ending in EOS) joined and cut every ``seq_len`` tokens. No
  token is lost except the last remainder of the stream, shorter than one sequence.
- ``best_fit``: best-fit-decreasing over a buffer of about ``buffer_size`` sequences' worth of
  documents (pulled a few at a time until they hold ``buffer_size * seq_len`` tokens); a document
  is cut only when it is longer than ``seq_len``. Sequences are padded
  with ``pad_id``; ``stats()`` reports the padding fraction.

State is a position, never a token buffer: the upstream position where the current chunk
(concat) or buffer (best_fit) began, plus an offset into it. A restore re-reads and
re-tokenizes that one chunk or buffer. For an elastic restore, ``used()`` counts (concat) the
documents begun, through the locator of the chunk's upstream table; best_fit's buffer is not
counted: it is packed again.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field, fields
from operator import attrgetter
from typing import Any, cast

import numpy as np
import pyarrow as pa

from tidal.errors import StateError, Untraceable
from tidal.stages import INTERNAL, Context, Locator, Needed, Origin, StageIterator, Step, Traced, Unlocated, add_stats
from tidal.state import keys as k
from tidal.state.view import View
from tidal.tables import Columns, Table, integer_lists, numpy_of, records

IGNORE = -100
OUTPUTS = ("input_ids", "labels", "position_ids", "segment_ids")
AHEAD_TOKENS = 1 << 17  # concat makes sequences up to this many tokens at a time (8 batches of 8 x 2048)


@dataclass(frozen=True)
class PackConfig:
    seq_len: int
    strategy: str = "concat"
    shift_labels: bool = True
    mask_boundaries: bool = False
    pad_id: int = 0
    buffer_size: int = 256
    chunk_docs: int = field(default=256, metadata=INTERNAL)  # documents read at a time: no argument of pack()
    column: str = "input_ids"  # the token ids of each document
    eos: int | None = None  # appended to each document (pre-tokenized data without one)
    outputs: tuple[str, ...] = OUTPUTS  # the arrays each sequence carries: those made, no others


@dataclass(frozen=True, repr=False)
class Pack(Step):
    """Packs the documents of its upstream; the arguments of ``pack()`` are the fields of its :class:`PackConfig`."""

    METHOD = "pack"

    config: PackConfig

    def open(self, ctx: Context, position: View | None) -> StageIterator:
        up = self.upstream.open(ctx, position.view(k.UPSTREAM) if position is not None else None)
        if self.config.strategy == "best_fit":
            return BestFitPackIterator(up, self.config, position, ctx.trace)
        anew = ctx.weights is not None and ctx.weights.switching  # set_weights: draw what is not begun anew
        return ConcatPackIterator(up, self.config, position, ctx.trace, anew)

    def shifts_labels(self) -> bool:
        return self.config.shift_labels

    def facts(self) -> list:  # what sequences hold, not which arrays are made of them: outputs is left out
        return [getattr(self.config, f.name) for f in fields(self.config) if f.name != "outputs"]

    def call(self) -> str:
        c = self.config
        return (
            f"pack({c.seq_len}, {c.strategy!r}, shift_labels={c.shift_labels}, "
            f"mask_boundaries={c.mask_boundaries}, pad_id={c.pad_id}, buffer_size={c.buffer_size}, "
            f"column={c.column!r}, eos={c.eos}{'' if c.outputs == OUTPUTS else f', outputs={c.outputs!r}'})"
        )

    @classmethod
    def fields_of(cls) -> type:
        return PackConfig

    def config_values(self) -> PackConfig:
        return self.config

    def config_args(self) -> dict[str, Any]:
        args = super().config_args()
        args["outputs"] = None if self.config.outputs == OUTPUTS else list(self.config.outputs)  # a list in JSON
        return {k: v for k, v in args.items() if v is not None}


def _documents(
    table: Table, cfg: PackConfig, upstream: StageIterator, needed: Needed, trace: bool = False
) -> tuple[np.ndarray, np.ndarray, list[list[Origin]] | None, list[int] | range]:
    """The documents of ``table``'s ``cfg.column`` end to end, and the length of each (``cfg.eos``
    appended to each when given), with ``trace`` where each came from (``upstream``'s
    :meth:`~tidal.stages.Locator.origins`), and which items of ``table`` they are (those not
    handed to the errors policy). A column of integer lists without nulls, as Arrow holds it
    (Parquet, Arrow, a ``datasets`` table), is read as its values and offsets, with no Python
    object per document; anything else goes record by record through :func:`_doc_tokens`."""
    flat = _flat(table, cfg.column)
    if flat is None:
        docs, kept = _doc_tokens(records(table), cfg, upstream, needed)
        lengths = np.fromiter(map(len, docs), np.int64, len(docs))
        origins = None
        if trace:
            locator = upstream.locate()
            origins = [locator.origins(i) for i in kept]
        return (np.concatenate(docs) if docs else np.zeros(0, np.int64)), lengths, origins, kept
    needed.seen = True
    tokens, lengths = flat
    if cfg.eos is not None:
        tokens = np.insert(tokens, np.cumsum(lengths), np.asarray(cfg.eos, dtype=tokens.dtype))
        lengths = lengths + 1
    everything = range(len(lengths))
    if trace:
        locator = upstream.locate()
        return tokens, lengths, [locator.origins(i) for i in everything], everything
    return tokens, lengths, None, everything


def _flat(table: Table, column: str) -> tuple[np.ndarray, np.ndarray] | None:
    """``column`` as (values, lengths) where it is an Arrow list of integers without nulls; else None."""
    col = table.column(column) if isinstance(table, pa.Table) and column in table.column_names else None
    if isinstance(table, Columns):
        col = table.get(column)
    lists = integer_lists(col)
    if lists is None:
        return None
    return numpy_of(lists.flatten()), numpy_of(lists.value_lengths()).astype(np.int64)  # of the slice only


def _doc_tokens(
    recs: list, cfg: PackConfig, upstream: StageIterator, needed: Needed
) -> tuple[list[np.ndarray], list[int] | range]:
    """Each record's documents as an integer array, with ``cfg.eos`` appended when given, and the
    records they are (those not handed to the errors policy). A record
    without one (a null, no such field, not 1-D integers) goes to the errors policy (``upstream``'s
    :meth:`~tidal.stages.StageIterator.locate`); a column the first records all lack is a
    SchemaError (``needed``)."""
    column = cfg.column
    try:
        values = [r[column] for r in recs]
        needed.seen = True
    except (KeyError, TypeError, IndexError):
        docs = [_tokens(r, column) for r in recs]  # None: the record has no such field
        needed.check(recs)
    else:
        if _token_arrays(values):  # token shards
            return _with_eos(values, cfg), range(len(values))
        docs = [d if isinstance(d, np.ndarray) else _as_array(d) for d in values]
    bad = [i for i, d in enumerate(docs) if d is None or d.ndim != 1 or (d.dtype.kind not in "iu" and d.size)]
    empty = [
        i for i, d in enumerate(docs) if d is not None and d.ndim == 1 and d.size == 0 and d.dtype.kind not in "iu"
    ]
    if empty:  # [] is a document of no tokens (numpy makes it floats): of the others' type
        kind = next((d.dtype for d in docs if d is not None and d.ndim == 1 and d.dtype.kind in "iu"), np.int64)
        for i in empty:
            docs[i] = np.zeros(0, dtype=kind)
    if bad:
        locator = upstream.locate()
        for i in bad:
            d = docs[i]
            if d is None:
                rec = recs[i]
                fields = ", ".join(sorted(rec)) if isinstance(rec, dict) else f"a {type(rec).__name__}, not a dict"
                found = f"no such field (fields: {fields}; tokenize() text first, or pass pack(column=...))"
            else:
                found = "null" if d.dtype == object else f"{d.dtype}{d.shape}"
            why = f"pack(): column {column!r} must hold 1-D integer token ids, found {found}"
            needed.reject(locator, i, why, upstream, cfg.chunk_docs)
    kept: list[int] | range = range(len(docs))
    if bad:
        skip = set(bad)
        kept = [i for i in kept if i not in skip]
        docs = [docs[i] for i in kept]
    return _with_eos(cast("list[np.ndarray]", docs), cfg), kept  # the None were bad


def _token_arrays(values: list) -> bool:
    """Whether every value is a 1-D integer array (checked by C loops: a chunk holds hundreds)."""
    if set(map(type, values)) != {np.ndarray}:
        return not values
    return set(map(_NDIM, values)) == {1} and all(t.kind in "iu" for t in set(map(_DTYPE, values)))


_NDIM, _DTYPE = attrgetter("ndim"), attrgetter("dtype")


def _with_eos(docs: list[np.ndarray], cfg: PackConfig) -> list[np.ndarray]:
    if cfg.eos is None:
        return docs
    return [np.append(d, np.asarray(cfg.eos, dtype=d.dtype)) for d in docs]


def _as_array(value: Any) -> np.ndarray:
    """A record's token ids as an array; an object array of None where they are ragged lists."""
    try:
        return np.asarray(value)
    except (TypeError, ValueError):
        return np.asarray(None)


def _pieces(origins: list[Origin], start: int, end: int) -> list[Origin]:
    """Tokens ``[start, end)`` of document ``origins`` (of one record): where they are in it."""
    if len(origins) != 1 or origins[0].start is not None:
        raise Untraceable("pack(): an item upstream that is not one record (packed twice?) cannot be traced")
    return [origins[0]._replace(start=start, end=end)]


def needed(cfg: PackConfig) -> Needed:
    return Needed(cfg.column, "pack()", "tokenize() text first, or pass pack(column=...) the column of token ids")


def _tokens(rec: Any, column: str) -> np.ndarray | None:
    """The value of ``column`` in ``rec`` as an array; None where it has none."""
    if not isinstance(rec, dict) or column not in rec:
        return None
    return _as_array(rec[column])


def _windows(tokens: np.ndarray, starts: np.ndarray, n: int, cfg: PackConfig) -> Columns:
    """``n`` concat sequences at once from ``n * seq_len`` tokens (one more when labels shift),
    given where documents start among them (sorted offsets): each of ``cfg.outputs`` a 2-D
    array, and only those. Positions and segments are made from the few boundaries, not token
    by token."""
    L, want = cfg.seq_len, cfg.outputs
    T = n * L
    out = Columns()
    if "input_ids" in want:
        out["input_ids"] = tokens[:T].reshape(n, L).copy()
    if "labels" in want:
        if cfg.shift_labels:
            labels = tokens[1 : T + 1].astype(np.int64)
            if cfg.mask_boundaries:  # a document's first token is not predicted from the one before
                labels[starts[(starts >= 1) & (starts <= T)] - 1] = IGNORE
        else:
            labels = tokens[:T].astype(np.int64)
            if cfg.mask_boundaries:  # nor, aligned, at a document start inside a sequence
                labels[starts[(starts < T) & (starts % L != 0)]] = IGNORE
        out["labels"] = labels.reshape(n, L)
    if "position_ids" in want or "segment_ids" in want:
        rows = np.arange(0, T, L)
        bounds = np.union1d(starts[starts < T], rows)  # where each piece of a document begins
        lengths = np.diff(bounds, append=T)
        if "position_ids" in want:
            first_of = np.repeat(bounds, lengths)  # each token's piece's first token, made the positions in place
            out["position_ids"] = np.subtract(_arange(T), first_of, out=first_of).reshape(n, L)
        if "segment_ids" in want:
            first = np.searchsorted(bounds, rows)  # each sequence's first piece
            piece = np.arange(len(bounds)) - np.repeat(first, np.diff(first, append=len(bounds))) + 1
            out["segment_ids"] = np.repeat(piece.astype(np.int32), lengths).reshape(n, L)
    return out


_ARANGE = np.arange(0)


def _arange(n: int) -> np.ndarray:
    """``np.arange(n)`` (int64), read-only, from one made once for the longest asked so far."""
    global _ARANGE
    if len(_ARANGE) < n:
        made = np.arange(n)
        made.flags.writeable = False
        _ARANGE = made
    return _ARANGE[:n]


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
        tokens, lengths, origins, items = _documents(table, self._cfg, self._up, self._needed, self._trace)
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
        return _windows(tokens, starts, n, cfg)

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
                    rows[j] += _pieces(c.origins[d], s - base - a, e - base - a)
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
            tokens, lengths, where, _ = _documents(table, cfg, self._up, self._needed, self._trace)
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
            self._bin_origins = [[p for d, a, z in content for p in _pieces(origins[d], a, z)] for content in bins]
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


def cu_seqlens(position_ids: np.ndarray) -> np.ndarray:
    """Cumulative document lengths of a flattened batch, for FlashAttention's varlen functions.

    >>> cu_seqlens(batch["position_ids"])   # int32 array: [0, len0, len0+len1, ..., B*L]
    """
    flat = np.asarray(position_ids).reshape(-1)
    starts = np.flatnonzero(flat == 0)
    return np.concatenate([starts, [len(flat)]]).astype(np.int32)
