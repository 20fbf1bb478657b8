"""A cell's chain of stages, built from its corpora, and the functions the chain carries.

The functions given to ``map``, ``filter`` and ``errors=`` are defined here, at module level,
so that a chain pickles into spawned workers. The errors function writes each error it is
given to the file named by ``$CONFORMANCE_ERRORS`` (one JSON line each, appended), so the
checks can count, across worker processes, how often each bad record reached it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tidal
from conformance.cells import Cell
from conformance.data import EOS, TOKEN_FORMATS, Corpus

ERRORS_ENV = "CONFORMANCE_ERRORS"
STREAMS = ("a", "b")


def ident(record: dict) -> int:
    """The id of the record a row (unpacked) holds, whatever columns its format and stages left."""
    for key in ("id", "cls"):
        if key in record and record[key] is not None:
            return int(record[key])
    if "input_ids" in record:
        return int(record["input_ids"][0])
    return int(str(record.get("text", record.get("txt"))).split(" ", 1)[0])


def mark(record: dict) -> dict:
    """The map of the matrix: the record with one more field, which the checks look for."""
    return {**record, "mapped": 1}


def keep(record: dict) -> bool:
    """The filter of the matrix: drops every id of 2 modulo 5."""
    return kept(ident(record))


def kept(i: int) -> bool:
    return i % 5 != 2


def note_error(error: Exception) -> None:
    """The ``errors=`` function of the matrix: writes down the error, then skips its record."""
    out = {"type": type(error).__name__, "path": getattr(error, "path", ""), "row": getattr(error, "row", None)}
    with open(os.environ[ERRORS_ENV], "a") as f:
        f.write(json.dumps(out) + "\n")


@dataclass
class Source:
    """A corpus and how tidal reaches it: its URL (a local directory or ``s3://``) and options."""

    corpus: Corpus
    url: str
    storage_options: dict | None = None
    cache_dir: Path | None = None


def policy(cell: Cell) -> Any:
    return note_error if cell.errors == "function" else cell.errors


def build(cell: Cell, sources: list[Source], tokenizer: Path) -> tidal.Dataset:
    """The cell's dataset over ``sources`` (one, or two mixed streams)."""
    streams = [_stream(cell, s, tokenizer, mixed=len(sources) > 1) for s in sources]
    if len(streams) == 1:
        ds = streams[0]
    else:
        ds = tidal.mix(dict(zip(STREAMS, streams, strict=False)), weights=dict(zip(STREAMS, cell.weights, strict=False)),
                       seed=cell.seed % 1000, stop=cell.stop)  # fmt: skip
        if cell.tokenize and not cell.tokenize_before_mix:
            ds = ds.tokenize(str(tokenizer), column=sources[0].corpus.text_column, eos="<eos>")
    if cell.pack:
        eos = EOS if cell.fmt in TOKEN_FORMATS else None  # token files hold no EOS: pack appends it
        ds = ds.pack(cell.seq_len, cell.pack, buffer_size=cell.buffer_size, eos=eos)
    if cell.batch is not None:
        ds = ds.batch(cell.batch, drop_last=cell.drop_last, continuous=cell.continuous)
    return ds


def _stream(cell: Cell, source: Source, tokenizer: Path, mixed: bool) -> tidal.Dataset:
    ds = tidal.Dataset(
        source.url, errors=policy(cell), storage_options=source.storage_options, cache_dir=source.cache_dir
    )
    if cell.shuffle is not None:
        ds = ds.shuffle(seed=cell.shuffle, block_size=cell.block_size)
    if cell.epochs > 1:
        ds = ds.repeat(cell.epochs)
    if cell.map:
        ds = ds.map(mark)
    if cell.filter:
        ds = ds.filter(keep)
    if cell.tokenize and (not mixed or cell.tokenize_before_mix):
        ds = ds.tokenize(str(tokenizer), column=source.corpus.text_column, eos="<eos>")
    return ds
