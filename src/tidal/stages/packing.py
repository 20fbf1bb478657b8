"""What both packing strategies share (:mod:`tidal.stages.pack`): the configuration, a table's
documents as one token array with their lengths, and sequences cut from it with their labels,
positions and segments."""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, cast

import numpy as np
import pyarrow as pa

from tidal.errors import Untraceable
from tidal.stages import INTERNAL, Needed, StageIterator
from tidal.stages.locators import Origin
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


def documents(
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


def origins_between(origins: list[Origin], start: int, end: int) -> list[Origin]:
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


def windows(tokens: np.ndarray, starts: np.ndarray, n: int, cfg: PackConfig) -> Columns:
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
