"""LitData optimized directories (``litdata.optimize`` output): ``index.json`` and ``chunk-*.bin``.

Each chunk file is a shard; what its bytes mean is in the directory's ``index.json``
(``config``: the leaves' serializers ``data_format``, the pytree ``data_spec``, the item
loader, the compression), which scanning reads once and keeps in the index with the chunk's
row count, so a reader needs only the chunk. A chunk::

    uint32          items, n
    uint32[n + 1]   byte offsets of the items (checked: past the header, never decreasing,
                    inside the file)
    items           PyTreeLoader: a uint32 size per leaf, then the leaves' bytes;
                    TokensLoader: the token ids of one document, raw
    [Arrow IPC file, uint32 its length, b"LDARW01\\0"]   rows written as an Arrow footer

Records:

- ``TokensLoader`` chunks: one row per document written, ``{"input_ids": ids}`` (a
  zero-copy view). LitData's loader cuts the concatenated tokens into ``block_size``
  windows; in tidal that is ``pack()``'s job, and rows stay documents so resuming and
  splitting work at document granularity.
- rows kept as an Arrow footer (LitData's choice for flat or nested records of plain
  values): the Arrow table, with column projection.
- other ``PyTreeLoader`` chunks: the item rebuilt from its pytree spec; a dict is the record,
  anything else (a tuple, a single array) is ``{"data": item}``. Leaves: ``str``, ``text``,
  ``int``, ``float``, ``bool``, ``bytes``, ``numpy``, ``no_header_numpy``, ``tensor`` and
  ``no_header_tensor`` (as numpy arrays: torch is not needed), image leaves (``pil``,
  ``jpeg``, ``image``, ``jpeg_array``) as their bytes, ``pickle`` only with the format option
  ``allow_pickle=True``. Other serializers (video, audio, graph, LitData's binary ``json``)
  and encrypted chunks are refused with a FormatError naming the file.

Compression, every way ``litdata.optimize(..., compression="zstd"`` or ``"zstd:N")`` writes it;
``index.json``'s ``compression`` and ``compression_level`` say which (zstd is the only codec
LitData registers):

- ``compression_level="batch"`` (LitData's default for zstd on pytree chunks): a ``.bin``
  that starts ``b"LDFZ01\\0\\0"``; an uncompressed header (items, items a frame, frames), the
  item offsets within the decompressed items, a table of frames (first item, items,
  compressed offset and length, decompressed length), then one zstd frame of the items'
  bytes per ``compression_batch_size`` items. Scanning reads and checks the header and the
  table only; a frame is decompressed the first time one of its rows is read, and kept for
  the life of the reader (at most the chunk's decompressed size).
- ``compression_level="sample"``: the plain layout, each item's bytes its own zstd frame,
  decompressed as the item is read.
- ``compression_level="chunk"`` (and every index.json without a level): the whole file
  (``chunk-*.zstd.bin``) is one zstd stream, decompressed into memory when the chunk is
  opened, every byte checked (:mod:`tidal.formats.codecs`). The index scan reads and
  decompresses the whole file once too. It is the only level LitData writes
  ``TokensLoader`` chunks with.
- rows kept as an Arrow footer compress the footer's buffers (``ipc_compression``), which
  pyarrow decompresses as it reads the footer.

Each chunk's scan keeps its columns with their types (an Arrow footer's types; a pytree leaf's
serializer, ``int``, ``str``, ``numpy``...): chunks of a dataset (several LitData directories,
say) whose column is of two types are a :class:`~tidal.errors.SchemaError` naming the column
and a chunk of each, when the dataset is opened; a column some chunks lack is None in their
records. Token chunks of several dtypes (uint16 and
int32 ids) read as the one that holds them all (:mod:`tidal.formats.schemas`).

LitData keeps no checksum of its own: an item or a zstd frame that does not decode (a frame
that is cut short, is followed by stray bytes or decompresses to another length than its
table says) is a :class:`~tidal.errors.RecordError` naming the file and row (for a frame,
each of its rows, naming the frame), for the ``errors`` policy; a whole-chunk stream that is
truncated or corrupt, or a frame table that does not fit the file, is a FormatError naming
the file; an Arrow footer is validated whole when the chunk is opened.
"""

from __future__ import annotations

import builtins
import itertools
import json
import os
import pickle
import posixpath
import struct
from collections.abc import Callable, Collection
from typing import Any

import numpy as np
import pyarrow as pa

from tidal.errors import FormatError, RecordError
from tidal.formats import Errors, Options, Piece, check_options, schemas, source
from tidal.formats.bad_data import bad, data_errors
from tidal.formats.litdata_chunks import Chunk
from tidal.tables import conform

NAME = "litdata"
__all__ = ["NAME", "claims", "columns", "files", "open", "scan"]

INDEX = "index.json"
TOKEN_DTYPE = True  # TokensLoader chunks: input_ids of one dtype over the dataset's token files (tidal.formats.schemas)
COLUMNS_OPTIONAL = True  # a column some chunks of a dataset lack is None in their records
MANIFEST = INDEX  # what a remote chunk's scan is given the bytes of (tidal.sources.counting)
_LEVELS = ("chunk", "batch", "sample")
_NUMPY = ["i1", "<i2", "<i4", "<i8", "u1", "<u2", "<u4", "<u8", "<f2", "<f4", "<f8", "<c8", "<c16", "?"]
_TORCH = {0: "<f4", 1: "<f4", 2: "<f8", 3: "<f8", 4: "<c8", 5: "<c8", 6: "<c16", 7: "<c16", 8: "<f2", 9: "<f2",
          11: "u1", 12: "i1", 13: "<i2", 14: "<i2", 15: "<i4", 16: "<i4", 17: "<i8", 18: "<i8", 19: "?", 20: "<u2"}  # fmt: skip
_BYTES = {"bytes", "pil", "jpeg", "image", "file"}
_PLAIN = {
    "str",
    "text",
    "int",
    "float",
    "bool",
    "numpy",
    "tensor",
    "no_header_numpy",
    "no_header_tensor",
    "jpeg_array",
    "pickle",
}


def claims(path: str, exists: Callable[[str], bool]) -> bool:
    """A ``chunk-*.bin`` with an ``index.json`` beside it."""
    name = os.path.basename(path)
    return name.startswith("chunk-") and name.endswith(".bin") and exists(os.path.join(os.path.dirname(path), INDEX))


def files(root: str) -> tuple[list[str], None] | None:
    """A local LitData directory's chunks in the order its ``index.json`` lists them (the order
    LitData wrote and reads them: ``chunk-0-2.bin`` before ``chunk-0-10.bin``), or None for a
    directory without a LitData ``index.json``. See :func:`tidal.formats.ordered.in_order`."""
    where = os.path.join(root, INDEX)
    if not os.path.isfile(where):
        return None
    try:
        with builtins.open(where, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise FormatError(f"{where}: unreadable: {exc}") from None
    names = _chunks(where, data)
    return ([os.path.join(root, name) for name in names], None) if names else None


def listed(root: str, names: Collection[str], read: Callable[[str], bytes | None]) -> tuple[list[str], None] | None:
    """:func:`files` of a remote directory, from its listing (``names``: the files directly in
    it, which never hold an ``index.json``) and ``read(url)`` of its ``index.json`` (None where
    there is none), asked for only where chunks are listed."""
    if not any(n.startswith("chunk-") and n.endswith(".bin") for n in names):
        return None
    where = posixpath.join(root, INDEX)
    data = read(where)
    if data is None:
        return None
    chunks = _chunks(where, data)
    missing = [name for name in chunks or [] if name not in names]
    if missing:
        raise FormatError(f"{where}: lists {missing[0]}, which is not in {root}")
    return ([posixpath.join(root, name) for name in chunks], None) if chunks else None


def _chunks(where: str, data: bytes) -> list[str] | None:
    """The chunk names a LitData ``index.json`` lists, in order; None for another ``index.json``."""
    try:
        index = json.loads(data)
    except ValueError as exc:
        raise FormatError(f"{where}: unreadable: {exc}") from None
    if not isinstance(index, dict) or not isinstance(index.get("config"), dict) or "chunks" not in index:
        return None  # the index.json of MDS or tidal token shards: their names sort in order
    out = []
    for entry in index["chunks"] if isinstance(index["chunks"], list) else [None]:
        name = entry.get("filename") if isinstance(entry, dict) else None
        if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or os.sep in name:
            raise FormatError(f"{where}: chunk {name!r} is not a file name in its directory")
        out.append(name)
    return out


def _config(path: str, src: Any, manifest: bytes | None = None) -> tuple[dict, dict]:
    """The directory's config and this chunk's entry in ``index.json`` (``manifest``: its bytes,
    fetched beside a remote chunk; else the file beside ``src``)."""
    where = os.path.join(os.path.dirname(path if manifest is not None or not isinstance(src, str) else src), INDEX)
    try:
        if manifest is not None:
            index = json.loads(manifest)
        else:
            with builtins.open(where, "rb") as f:
                index = json.load(f)
        config, chunks = index["config"], index["chunks"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise FormatError(f"{path}: a LitData chunk is read with the index.json beside it: {exc}") from None
    name = os.path.basename(path)
    entry = next((c for c in chunks if isinstance(c, dict) and c.get("filename") == name), None)
    if entry is None:
        raise FormatError(f"{path}: not listed in {where}")
    return config, entry


def _leaf_names(data_format: list[str]) -> list[str]:
    return [f.split(":", 1)[0] for f in data_format]


def scan(path: str, compression: str | None, file: str | None = None, manifest: bytes | None = None) -> dict:
    src = file or path
    config, entry = _config(path, src, manifest)
    if config.get("encryption"):
        raise FormatError(f"{path}: encrypted LitData chunks are not supported")
    level = config.get("compression_level") or "chunk"
    if level not in _LEVELS:
        raise FormatError(f"{path}: LitData compression_level {level!r} is not one of {', '.join(_LEVELS)}")
    codec = str(config.get("compression") or "zstd").split(":")[0]
    if codec != "zstd":
        raise FormatError(f"{path}: LitData chunks compressed with {codec!r} are not supported (zstd is)")
    data_format = list(config.get("data_format") or [])
    unknown = [f for f in _leaf_names(data_format) if f not in _PLAIN and f not in _BYTES]
    if unknown:
        raise FormatError(f"{path}: LitData serializer {unknown[0]!r} is not supported")
    keep = {
        "data_format": data_format,
        "data_spec": config.get("data_spec"),
        "item_loader": config.get("item_loader", "PyTreeLoader"),
        "compression": config.get("compression"),
        "compression_level": config.get("compression_level"),
    }
    chunk = Chunk(path, src, keep)
    if chunk.rows != int(entry.get("chunk_size", chunk.rows)):
        raise FormatError(f"{path}: {chunk.rows} items, but index.json says {entry.get('chunk_size')}")
    if chunk.footer is not None:
        columns = {f.name: _FOOTER_TYPES.get(str(f.type), str(f.type)) for f in chunk.footer.schema}
    elif keep["item_loader"] == "TokensLoader":
        columns = {"input_ids": "tokens"}  # its dtype: agreed over the dataset (token_dtype)
    else:
        columns = _encodings(keep["data_spec"], data_format)
    return {"rows": chunk.rows, "config": keep, "columns": columns}


def columns(info: dict) -> list[str]:
    return list(info["columns"])


def token_dtype(info: dict, options: Options | None = None) -> str | None:
    """The dtype of a TokensLoader chunk's ids where its serializer says it; None for others."""
    config = info.get("config") or {}
    found = list(config.get("data_format") or [])
    if config.get("item_loader") != "TokensLoader" or len(found) != 1:
        return None
    name, _, arg = found[0].partition(":")
    if name not in ("no_header_numpy", "no_header_tensor") or not arg.isdigit():
        return None
    named = (dict(enumerate(_NUMPY)) if name == "no_header_numpy" else _TORCH).get(int(arg))
    return np.dtype(named).name if named is not None else None


# The leaves that give the Python values an Arrow footer's columns give, named alike: a dataset of
# chunks of both kinds (LitData keeps plain records in a footer, others as a pytree) agrees
_LEAF_TYPES = {"str": "str", "text": "str", "int": "int", "float": "float", "bool": "bool", "bytes": "bytes"}
_FOOTER_TYPES = {"string": "str", "large_string": "str", "int64": "int", "double": "float", "bool": "bool",
                 "binary": "bytes", "large_binary": "bytes"}  # fmt: skip


def _encodings(spec: Any, data_format: list[str]) -> dict[str, str]:
    """Each column of a pytree record and the serializers of its leaves (``int``, ``str``,
    ``numpy``; several, comma-separated, for a nested value): its type, as far as the chunk says."""
    tree = _spec(spec)
    names = _keys(spec)
    leaves = [_LEAF_TYPES.get(f, f) for f in data_format]
    if names == ["data"] or tree is None:
        return {"data": ",".join(leaves)}
    out, at = {}, 0
    for name, child in zip(names, tree.get("children_spec") or [], strict=False):
        n = _leaves(child)
        out[name] = ",".join(leaves[at : at + n])
        at += n
    return out if len(out) == len(names) else dict.fromkeys(names, "")


def _leaves(tree: Any) -> int:
    """How many leaves a pytree spec holds."""
    children = tree.get("children_spec") if isinstance(tree, dict) else None
    return sum(_leaves(c) for c in children) if children else 1


def _keys(spec: Any) -> list[str]:
    tree = _spec(spec)
    if tree is not None and tree.get("type") in ("builtins.dict", "collections.OrderedDict"):
        return [str(k) for k in json.loads(tree["context"])]
    return ["data"]


def _spec(spec: Any) -> dict | None:
    if not spec:
        return None
    try:
        parsed = json.loads(spec) if isinstance(spec, str) else spec
        return parsed[1] if isinstance(parsed, list) else parsed
    except (ValueError, IndexError, TypeError):
        return None


def _array(data: np.ndarray, dtype: str) -> np.ndarray:
    return data.view(dtype) if len(data) else np.zeros(0, dtype=dtype)


class LitdataReader:
    def __init__(self, path: str, info: dict, columns: list[str] | None, errors: Errors, options: Options | None):
        opts = check_options(NAME, options)
        self.path = path
        config = info["config"]
        self._chunk = Chunk(path, source(path, info), config)
        self._formats: list[str] = list(config.get("data_format") or [])
        self._tokens = config.get("item_loader") == "TokensLoader"
        self._tree = _spec(config.get("data_spec"))
        names = list(info.get("columns") or {})
        # the columns of its records: those asked for, else the dataset's (tidal.formats.agreement.agree), in
        # that order, None where this chunk lacks one; None: its own, as they are
        order = columns if columns is not None else info.get("dataset_columns")
        refill = order is not None and (any(c not in names for c in order) or (columns is None and order != names))
        self._order = list(order) if refill and order is not None else None
        self._columns = columns
        if "pickle" in _leaf_names(self._formats) and not opts.get("allow_pickle", False):
            raise FormatError(
                f"{path}: some leaves are pickled; unpickling runs code from the data. "
                "Pass the format option allow_pickle=True if you trust this data"
            )
        self._errors = errors
        self._ids = self._flat_ids(columns)
        self._cast = np.dtype(info["cast"]) if self._tokens and info.get("cast") else None  # the dataset's dtype

    def _flat_ids(self, columns: list[str] | None) -> np.ndarray | None:
        """A chunk of token documents (``TokensLoader``) stored plain: all its items, as one view
        of token ids, so that a read makes one view per document instead of parsing each item.
        Where every item starts on a token boundary; else (or compressed) None."""
        chunk = self._chunk
        if not self._tokens or chunk.footer is not None or chunk._sample or chunk._frames is not None:
            return None
        if columns not in (None, ["input_ids"]) or len(self._formats) != 1:
            return None
        name, _, arg = self._formats[0].partition(":")
        if name not in ("no_header_numpy", "no_header_tensor") or not arg.isdigit():
            return None
        named = (dict(enumerate(_NUMPY)) if name == "no_header_numpy" else _TORCH).get(int(arg))
        dtype = np.dtype(named or "O")
        if dtype.kind not in "iu" or (chunk.offsets % dtype.itemsize).any():
            return None
        data = chunk.data
        return data[: len(data) // dtype.itemsize * dtype.itemsize].view(dtype)

    def _leaf(self, fmt: str, value: np.ndarray) -> Any:
        name, _, arg = fmt.partition(":")
        if name in ("str", "text"):
            return value.tobytes().decode()
        if name == "int":
            return int(value.view("<i8")[0])
        if name == "float":
            return float(value.view("<f8")[0])
        if name == "bool":
            return bool(value[0])
        if name in _BYTES:
            return value.tobytes()
        if name == "no_header_numpy":
            return _array(value, _NUMPY[int(arg)])
        if name == "no_header_tensor":
            return _array(value, _TORCH[int(arg)])
        if name == "numpy":
            head = value[:8].view("<u4")
            dtype, ndim = _NUMPY[int(head[0])], int(head[1])
            shape = tuple(value[8 : 8 + 4 * ndim].view("<u4").tolist())
            return _array(value[8 + 4 * ndim :], dtype).reshape(shape)
        if name == "tensor":
            code, ndim = struct.unpack(">II", value[:8].tobytes())
            shape = struct.unpack(f">{ndim}I", value[8 : 8 + 4 * ndim].tobytes())
            return _array(value[8 + 4 * ndim :], _TORCH[code]).reshape(shape)
        if name == "jpeg_array":
            count = int(value[:4].view("<u4")[0])
            sizes = value[4 : 4 + 4 * count].view("<u4").astype(np.int64)
            ends = 4 + 4 * count + np.cumsum(sizes)
            starts = np.concatenate([[4 + 4 * count], ends[:-1]])
            return [value[a:z].tobytes() for a, z in zip(starts.tolist(), ends.tolist(), strict=True)]
        if name == "pickle":
            return pickle.loads(value.tobytes())  # refused at open unless allow_pickle
        raise ValueError(f"unsupported leaf {fmt!r}")

    def _build(self, tree: dict | None, leaves: list[Any], at: list[int]) -> Any:
        if tree is None or not tree.get("children_spec"):
            at[0] += 1
            return leaves[at[0] - 1]
        children = [self._build(c, leaves, at) for c in tree["children_spec"]]
        kind = tree.get("type")
        if kind in ("builtins.dict", "collections.OrderedDict"):
            return dict(zip(json.loads(tree["context"]), children, strict=True))
        return tuple(children) if kind == "builtins.tuple" else children

    def _item(self, row: int) -> Any:
        item = self._chunk.item(row)
        if self._tokens:
            ids = self._leaf(self._formats[0], item)
            return {"input_ids": ids if self._cast is None else schemas.widen(ids, self._cast, self.path, row)}
        count = len(self._formats)
        if len(item) < 4 * count:
            raise ValueError("item cut short in its sizes")
        sizes = item[: 4 * count].view("<u4").astype(np.int64)
        bounds = np.concatenate([[4 * count], 4 * count + np.cumsum(sizes)]).tolist()
        if bounds[-1] != len(item):
            raise ValueError(f"its leaves take {bounds[-1]} bytes, the item has {len(item)}")
        leaves = [self._leaf(f, item[bounds[i] : bounds[i + 1]]) for i, f in enumerate(self._formats)]
        value = self._build(self._tree, leaves, [0])
        return value if isinstance(value, dict) else {"data": value}

    def read(self, start: int, stop: int) -> Piece:
        footer = self._chunk.footer
        if footer is not None:
            table = footer.slice(start, stop - start)
            if self._order is not None:  # the columns it lacks: null (of no type: joined in the block)
                have = table.schema
                fields = [have.field(c) if c in have.names else pa.field(c, pa.null()) for c in self._order]
                return Piece(conform(table, pa.schema(fields)))
            return Piece(table.select(self._columns) if self._columns is not None else table)
        if self._ids is not None:  # token documents: a view each, bounds checked when the chunk opened
            ids, bounds = self._ids, (self._chunk.offsets[start : stop + 1] // self._ids.itemsize).tolist()
            if self._cast is not None:  # the documents are one span of the chunk: widened at once
                ids = schemas.widen(ids[bounds[0] : bounds[-1]], self._cast, self.path, start)
                bounds = [b - bounds[0] for b in bounds]
            if self._order is not None:  # the dataset's other columns: None
                blank = dict.fromkeys(self._order)
                return Piece([{**blank, "input_ids": ids[a:z]} for a, z in itertools.pairwise(bounds)])
            return Piece([{"input_ids": ids[a:z]} for a, z in itertools.pairwise(bounds)])
        records: list[Any] = []
        valid: np.ndarray | None = None
        for row in range(start, stop):
            try:
                rec = self._item(row)
                if self._order is not None:
                    rec = {c: rec.get(c) for c in self._order}
                elif self._columns is not None:
                    rec = {c: rec[c] for c in self._columns}
                records.append(rec)
            except data_errors() as exc:  # a pickle may raise anything: allow_pickle trusts the data
                bad(self._errors, RecordError(f"undecodable LitData item: {exc}", path=self.path, row=row))
                if valid is None:
                    valid = np.ones(stop - start, dtype=bool)
                valid[row - start] = False
        return Piece(records, valid)

    def close(self) -> None:
        pass


def open(  # noqa: A001
    path: str,
    compression: str | None,
    info: dict,
    columns: list[str] | None,
    errors: Errors,
    options: Options | None = None,
) -> LitdataReader:
    return LitdataReader(path, info, columns, errors, options)
