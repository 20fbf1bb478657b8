"""Megatron-LM indexed datasets: a ``.bin`` of token ids and its ``.idx``, read as they are.

The ``.idx`` (Megatron's ``MMIDIDX`` layout), little-endian::

    9 bytes  magic b"MMIDIDX\\x00\\x00"
    uint64   version (1)
    uint8    dtype code: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16
    uint64   sequences, s
    uint64   document index entries, d (documents + 1)
    int32    s sequence lengths (in tokens)
    int64    s sequence pointers (byte offsets into the .bin)
    int64    d document indices (the first sequence of each document, then s)
    [int8    s sequence modes: only in multimodal indexes; ignored]

A row is a sequence, ``{"input_ids": ids}``, as Megatron's ``IndexedDataset[i]`` gives it;
the ids are a zero-copy view of the memory-mapped ``.bin`` (in a dataset whose token files are
of several dtypes, a copy widened to the one that holds them all: :mod:`tidal.formats.schemas`). Every pointer and length is
checked against the ``.bin``'s size when the file is opened, so a hostile index cannot make
a read leave the file. The ``.bin`` is the shard; its ``.idx`` must sit beside it (which is
how :func:`claims` tells a Megatron ``.bin`` from a flat token file). Remote pairs are read
too: the ``.idx`` is fetched into the shard cache beside the ``.bin`` (:func:`beside`).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from typing import Any

import numpy as np

from tidal.errors import FormatError, SchemaError
from tidal.formats import Errors, Located, Options, Piece, schemas, source
from tidal.formats.binary import check_offsets, mapped, view

NAME = "megatron"
__all__ = ["NAME", "beside", "claims", "columns", "open", "scan"]

MAGIC = b"MMIDIDX\x00\x00"
_HEAD = struct.Struct("<9sQBQQ")  # 34 bytes
DTYPES = {1: "u1", 2: "i1", 3: "<i2", 4: "<i4", 5: "<i8", 6: "<f8", 7: "<f4", 8: "<u2"}
TOKEN_DTYPE = True  # input_ids of one dtype over the dataset's token files (tidal.formats.schemas)


def claims(path: str, exists: Callable[[str], bool]) -> bool:
    """A ``.bin`` with a ``.idx`` of the same name beside it."""
    return path.endswith(".bin") and exists(path[: -len(".bin")] + ".idx")


def beside(path: str) -> str:
    """The file read beside the shard ``path``: its index. A remote one is fetched into the shard
    cache with the ``.bin`` (:class:`~tidal.formats.Located`), whose own copy there has another name."""
    return path[: -len(".bin")] + ".idx"


def _idx_of(path: str, src: Any, idx: str | None) -> str:
    if idx is not None:
        return idx
    if not isinstance(src, str) or not src.endswith(".bin"):
        raise FormatError(f"{path}: a Megatron .bin is read beside its .idx, which was not fetched with it")
    return beside(src)


class MegatronReader:
    def __init__(self, path: str, src: Any, fetched_idx: str | None = None, cast: str | None = None):
        self.path = path
        self._cast = np.dtype(cast) if cast is not None else None  # the dataset's dtype, where it is not this file's
        local = _idx_of(path, src, fetched_idx)
        idx_path = beside(path)  # as errors name it: not its copy in the cache
        if not os.path.exists(local):
            raise FormatError(f"{path}: no {os.path.basename(idx_path)} beside it")
        idx = mapped(idx_path, local)
        if len(idx) < _HEAD.size:
            raise FormatError(f"{idx_path}: not a Megatron index: {len(idx)} bytes, shorter than its header")
        magic, version, code, seqs, docs = _HEAD.unpack(idx[: _HEAD.size].tobytes())
        if magic != MAGIC:
            raise FormatError(f"{idx_path}: not a Megatron index (magic {magic!r})")
        if version != 1:
            raise FormatError(f"{idx_path}: Megatron index version {version}; this tidal reads version 1")
        if code not in DTYPES:
            raise FormatError(f"{idx_path}: unknown dtype code {code}")
        expected = _HEAD.size + 12 * seqs + 8 * docs
        if len(idx) not in (expected, expected + seqs):  # the second: with sequence modes
            raise FormatError(
                f"{idx_path}: truncated or corrupt: the header says {expected} bytes, the file has {len(idx)}"
            )
        self.dtype = np.dtype(DTYPES[code])
        self.lengths = view(idx_path, idx, _HEAD.size, "<i4", seqs, "the sequence lengths")
        self.pointers = view(idx_path, idx, _HEAD.size + 4 * seqs, "<i8", seqs, "the sequence pointers")
        self.documents = view(idx_path, idx, _HEAD.size + 12 * seqs, "<i8", docs, "the document indices")
        self.data = mapped(path, src)
        if seqs:
            ends = self.pointers + self.lengths.astype(np.int64) * self.dtype.itemsize
            bad = np.flatnonzero((self.lengths < 0) | (self.pointers < 0) | (ends > len(self.data)))
            if len(bad):
                i = int(bad[0])
                raise FormatError(
                    f"{idx_path}: corrupt: sequence {i} ({int(self.lengths[i])} tokens at byte "
                    f"{int(self.pointers[i])}) lies outside {os.path.basename(path)} ({len(self.data)} bytes)"
                )
            if (self.pointers % self.dtype.itemsize).any():
                raise FormatError(f"{idx_path}: corrupt: a sequence pointer is not aligned to {self.dtype} tokens")
        if docs:
            check_offsets(idx_path, self.documents, 0, seqs, "document")
        width = self.dtype.itemsize
        self.ids = self.data[: len(self.data) // width * width].view(self.dtype)

    def read(self, start: int, stop: int) -> Piece:
        ids, width = self.ids, self.dtype.itemsize
        first = self.pointers[start:stop] // width
        last = first + self.lengths[start:stop]
        spans = zip(first.tolist(), last.tolist(), strict=True)
        if self._cast is not None:
            to = self._cast
            return Piece(
                [{"input_ids": schemas.widen(ids[a:z], to, self.path, start + i)} for i, (a, z) in enumerate(spans)]
            )
        return Piece([{"input_ids": ids[a:z]} for a, z in spans])

    def close(self) -> None:
        pass


def scan(path: str, compression: str | None, file: str | None = None, beside: str | None = None) -> dict:
    if compression is not None:
        raise FormatError(f"{path}: Megatron datasets are memory-mapped; a {compression} wrapper is not supported")
    r = MegatronReader(path, file or path, beside)
    return {
        "rows": len(r.lengths),
        "tokens": int(r.lengths.sum(dtype=np.int64)),
        "documents": max(len(r.documents) - 1, 0),
        "dtype": r.dtype.name,
    }


def columns(info: dict) -> list[str]:
    return ["input_ids"]


def token_dtype(info: dict, options: Options | None = None) -> str | None:
    """The dtype of the dataset's ids, as its ``.idx`` says."""
    return info.get("dtype")


def open(  # noqa: A001
    path: str,
    compression: str | None,
    info: dict,
    columns: list[str] | None,
    errors: Errors,
    options: Options | None = None,
) -> MegatronReader:
    if columns is not None and list(columns) != ["input_ids"]:
        raise SchemaError(f"{path}: a Megatron dataset has one column, 'input_ids'; asked for {columns}")
    where = info.get("file")
    beside = where.beside if isinstance(where, Located) else None
    return MegatronReader(path, source(path, info), beside, info.get("cast"))
