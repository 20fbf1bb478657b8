"""tidal token shards: pre-tokenized documents, memory-mapped, read zero-copy.

One ``.tokens`` file is one shard: every document's token ids in one flat array, and where
each document starts. Little-endian throughout::

    offset  size          field
    0       8             magic b"TIDALTOK"
    8       4   uint32    version (1)
    12      4   uint32    bytes per token id: 2 (uint16) or 4 (uint32)
    16      8   uint64    documents, n
    24      8   uint64    tokens, t
    32      32            zero (reserved)
    64      8 * (n + 1)   int64 document offsets: document i is tokens[off[i]:off[i + 1]]
    ...     width * t     the token ids

The file's size must be exactly what the header says, the offsets must run from 0 to ``t``
without decreasing: anything else (a truncated copy, a hostile file) is a
:class:`~tidal.errors.FormatError` naming the file, raised before any record is read.

A row is a document, ``{"input_ids": ids}`` with the shard's dtype: uint16 when the vocabulary
fits, else uint32, as :meth:`tidal.Dataset.tokenize` yields; in a dataset whose token files are
of several dtypes, the one that holds them all (:mod:`tidal.formats.schemas`: the files of
another are widened to it as they are read). The ids are a view of the mapped file, so reading
costs no copy; :meth:`TokenShard.tokens` gives the flat array of a range of
documents, which is what packing wants.

:class:`TokenWriter` writes shards and an ``index.json`` beside them with each shard's size
and hash (xxh3-128 where ``xxhash`` is installed, else SHA-256; ``"algo:hex"`` as tidal's
shard cache writes them). Scanning a shard that the index lists checks its size and hash,
so a shard altered after writing is an error, not silently different data.
"""

from __future__ import annotations

import builtins
import hashlib
import itertools
import json
import os
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tidal.errors import ArgumentError, FormatError, SchemaError
from tidal.formats import Errors, Options, Piece, schemas, source
from tidal.formats.binary import check_offsets, mapped, view

NAME = "tokens"
__all__ = ["NAME", "TokenShard", "TokenWriter", "columns", "open", "scan"]

MAGIC = b"TIDALTOK"
VERSION = 1
HEADER = struct.Struct("<8sIIQQ32x")  # 64 bytes
INDEX = "index.json"
_DTYPES: dict[int, np.dtype] = {2: np.dtype("<u2"), 4: np.dtype("<u4")}
TOKEN_DTYPE = True  # input_ids of one dtype over the dataset's token files (tidal.formats.schemas)
_CLOSED = np.zeros(0, dtype=np.int64)  # what a closed shard holds (made once: close may run as Python exits)


class TokenShard:
    """One token shard, mapped read-only; a format reader, and the window packing reads from.

    >>> shard = TokenShard("data/shard-00000.tokens")
    >>> ids, offsets = shard.tokens(10, 20)   # documents 10..19: one flat view, offsets from 0
    """

    def __init__(self, path: str, src: Any = None, cast: str | None = None):
        self.path = path
        self._cast = np.dtype(cast) if cast is not None else None  # the dataset's dtype, where it is not this file's
        buf = mapped(path, path if src is None else src)
        if len(buf) < HEADER.size:
            raise FormatError(f"{path}: not a tidal token shard: {len(buf)} bytes, shorter than its header")
        magic, version, width, docs, tokens = HEADER.unpack(buf[: HEADER.size].tobytes())
        if magic != MAGIC:
            raise FormatError(f"{path}: not a tidal token shard (magic {magic!r})")
        if version != VERSION:
            raise FormatError(f"{path}: token shard version {version}; this tidal reads version {VERSION}")
        if width not in _DTYPES:
            raise FormatError(f"{path}: corrupt header: {width} bytes per token (2 or 4 expected)")
        if docs > len(buf) or tokens > len(buf):
            raise FormatError(f"{path}: corrupt header: {docs} documents, {tokens} tokens in {len(buf)} bytes")
        start = HEADER.size + 8 * (docs + 1)
        if len(buf) != start + width * tokens:
            raise FormatError(
                f"{path}: truncated or corrupt: the header says {start + width * tokens} bytes, the file has {len(buf)}"
            )
        self.dtype = _DTYPES[width]
        self.docs, self.num_tokens = int(docs), int(tokens)
        self.offsets = view(path, buf, HEADER.size, "<i8", docs + 1, "the document offsets")
        check_offsets(path, self.offsets, 0, tokens, "document")
        self.ids = view(path, buf, start, self.dtype, tokens, "the tokens")

    def tokens(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Documents ``[start, stop)`` as one flat view of their ids and their ``stop - start + 1``
        offsets into it (from 0): no copy of the ids."""
        if not 0 <= start <= stop <= self.docs:
            raise IndexError(f"{self.path}: documents {start}..{stop} of {self.docs}")
        off = self.offsets[start : stop + 1]
        base = int(off[0])
        return self.ids[base : int(off[-1])], off - base

    def read(self, start: int, stop: int) -> Piece:
        ids, off = self.tokens(start, stop)
        if self._cast is not None:
            ids = schemas.widen(ids, self._cast, self.path, start)
        bounds = off.tolist()
        return Piece([{"input_ids": ids[a:z]} for a, z in itertools.pairwise(bounds)])

    def close(self) -> None:
        """Drop this reader's references; records already read keep the map alive."""
        self.offsets = self.ids = _CLOSED


def scan(path: str, compression: str | None, file: str | None = None) -> dict:
    if compression is not None:
        raise FormatError(f"{path}: token shards are memory-mapped; a {compression} wrapper is not supported")
    shard = TokenShard(path, file)
    info: dict = {"tokens": shard.num_tokens, "dtype": shard.dtype.name}
    listed = _listed(path, file)
    if listed is not None:
        size = os.path.getsize(file or path)
        if listed.get("bytes") != size:
            raise FormatError(f"{path}: {size} bytes, but its index.json says {listed.get('bytes')}")
        digest = listed.get("hash")
        if isinstance(digest, str) and ":" in digest:
            got = _digest(file or path, digest.split(":", 1)[0])
            if got is not None and got != digest:
                raise FormatError(f"{path}: hash {got} differs from {digest} in its index.json: altered or corrupt")
            info["hash"] = digest
    return {"rows": shard.docs, **info}


def _listed(path: str, file: str | None) -> dict | None:
    """This shard's entry in the ``index.json`` beside it, if the writer left one."""
    where = os.path.join(os.path.dirname(file or path), INDEX)
    try:
        with builtins.open(where, "rb") as f:
            index = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(index, dict) or index.get("format") != "tidal-tokens":
        return None
    name = os.path.basename(path)
    for entry in index.get("shards", []):
        if isinstance(entry, dict) and entry.get("name") == name:
            return entry
    return None


def columns(info: dict) -> list[str]:
    return ["input_ids"]


def token_dtype(info: dict, options: Options | None = None) -> str | None:
    """The dtype of the shard's ids, as its scan found it."""
    return info.get("dtype")


def open(  # noqa: A001
    path: str,
    compression: str | None,
    info: dict,
    columns: list[str] | None,
    errors: Errors,
    options: Options | None = None,
) -> TokenShard:
    if columns is not None and list(columns) != ["input_ids"]:
        raise SchemaError(f"{path}: a token shard has one column, 'input_ids'; asked for {columns}")
    return TokenShard(path, source(path, info), info.get("cast"))


def _hasher(algorithm: str) -> Any:
    if algorithm.startswith("xxh"):
        try:
            import xxhash
        except ImportError:
            return None
        return getattr(xxhash, algorithm, lambda: None)()
    try:
        return hashlib.new(algorithm)
    except ValueError:
        return None


def _digest(path: str, algorithm: str) -> str | None:
    """``"algo:hex"`` of a file, or None where this machine lacks the algorithm."""
    h = _hasher(algorithm)
    if h is None:
        return None
    with builtins.open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return f"{algorithm}:{h.hexdigest()}"


class TokenWriter:
    """Writes documents of token ids into ``.tokens`` shards and an ``index.json`` with their hashes.

    >>> with TokenWriter("out/", dtype="uint16") as w:
    ...     for ids in tokenized:
    ...         w.write(ids)

    A shard is closed once its token ids reach ``shard_size`` bytes (documents are never
    split), so memory holds at most one shard's ids. Files appear atomically (written to a
    temporary name, then renamed); ``index.json`` is written last, on :meth:`close`.
    """

    def __init__(self, directory: str | os.PathLike, dtype: Any = "uint16", shard_size: int = 256 << 20):
        self.dir = Path(directory)
        self.dtype = np.dtype(dtype).newbyteorder("<")
        if self.dtype.itemsize not in _DTYPES or self.dtype.kind != "u":
            raise ArgumentError(f"token ids are stored as uint16 or uint32, not {np.dtype(dtype)}")
        if shard_size < 1:
            raise ArgumentError("shard_size must be at least 1 byte")
        self.shard_size = shard_size
        self.dir.mkdir(parents=True, exist_ok=True)
        self._docs: list[np.ndarray] = []
        self._bytes = 0
        self._shards: list[dict] = []
        self._algorithm = "xxh3_128" if _hasher("xxh3_128") is not None else "sha256"
        self._closed = False

    def write(self, ids: Sequence[int] | np.ndarray) -> None:
        """Add one document."""
        if self._closed:
            raise ArgumentError("write() after close()")
        arr = np.asarray(ids)
        if arr.ndim != 1:
            raise ArgumentError(f"a document is a 1-D sequence of token ids, not shape {arr.shape}")
        if arr.dtype != self.dtype:
            if len(arr) and (arr.dtype.kind not in "iu" or arr.min() < 0 or arr.max() > np.iinfo(self.dtype).max):
                raise ArgumentError(
                    f"token ids must be integers in 0..{np.iinfo(self.dtype).max} for {self.dtype.name}"
                )
            arr = arr.astype(self.dtype)
        self._docs.append(arr)
        self._bytes += arr.nbytes
        if self._bytes >= self.shard_size:
            self._flush()

    def _flush(self) -> None:
        if not self._docs:
            return
        name = f"shard-{len(self._shards):05d}.tokens"
        lengths = np.fromiter((len(d) for d in self._docs), dtype=np.int64, count=len(self._docs))
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype("<i8")
        tokens = int(offsets[-1])
        header = HEADER.pack(MAGIC, VERSION, self.dtype.itemsize, len(self._docs), tokens)
        final = self.dir / name
        tmp = final.with_name(f".{name}.{os.getpid()}.tmp")
        h = _hasher(self._algorithm)
        with builtins.open(tmp, "wb") as f:
            for part in (header, offsets.tobytes(), *(d.tobytes() for d in self._docs)):
                f.write(part)
                h.update(part)
        os.replace(tmp, final)
        size = HEADER.size + offsets.nbytes + tokens * self.dtype.itemsize
        entry = {"name": name, "docs": len(self._docs), "tokens": tokens, "bytes": size}
        self._shards.append({**entry, "hash": f"{self._algorithm}:{h.hexdigest()}"})
        self._docs, self._bytes = [], 0

    def close(self) -> None:
        """Write the last shard and the index."""
        if self._closed:
            return
        self._flush()
        index = {"format": "tidal-tokens", "version": VERSION, "dtype": self.dtype.name, "shards": self._shards}
        tmp = self.dir / f".{INDEX}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(index, indent=1))
        os.replace(tmp, self.dir / INDEX)
        self._closed = True

    def __enter__(self) -> TokenWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
