"""Mosaic ``streaming`` MDS shards (``shard.NNNNN.mds``, also ``.mds.zstd``/``.gz``/``.bz2``/``.br``/``.snappy``).

An MDS shard describes itself, so a shard is read without the ``index.json`` beside it
(which tidal's listing leaves out); a remote shard is counted from that ``index.json`` where it
describes it (:func:`counts`: no download to count), and checked against it when read::

    uint32          samples, n
    uint32[n + 1]   byte offsets of the samples in the (decompressed) shard
    JSON            the writer's config: column_names, column_encodings, column_sizes
    samples         each: a uint32 size for every variable-size column, then the column values

The offsets are checked when a shard is scanned or opened (the first just past the config,
never decreasing, the last at the end of the shard), so a damaged or hostile shard is a
:class:`~tidal.errors.FormatError` naming the file before any sample is decoded.

Encodings read: ``bytes``, ``str``, ``int``, ``int8``..``int64``, ``uint8``..``uint64``,
``float16``/``32``/``64`` (numpy scalars, their width kept), ``str_int``, ``str_float``,
``str_decimal``, ``json``, ``ndarray`` with or without a fixed dtype and shape (a zero-copy
view for an uncompressed shard), and the image encodings ``jpeg``, ``png``, ``pil``,
``jpeg_array``, ``list[jpeg]``, ``list[png]``, ``list[pil]``: their bytes as stored (lists
split into one ``bytes`` per image) unless ``decode_images=True`` (``options``), which opens
them with Pillow. ``pkl`` columns are unpickling, that is running code from the data: a
reader that would return one refuses unless ``allow_pickle=True``; leave the column out
with ``columns=`` to read the rest.

Shards of a dataset (several MDS directories, say) may differ in their columns: a column some
shards lack is None in their samples (and with ``columns=``), and a column of two encodings is a
:class:`~tidal.errors.SchemaError` naming the column and a shard of each, when the dataset is
opened (:func:`tidal.formats.agreement.check_schemas`).

A compressed shard is decompressed into memory when a reader opens it (Mosaic's shards are
64 MB by default), every byte checked (:mod:`tidal.formats.codecs`); an uncompressed one is
memory-mapped. MDS has no checksum of its own: a sample that does not decode is a
:class:`~tidal.errors.RecordError` naming the file and row, for the ``errors`` policy.
"""

from __future__ import annotations

import io
import json
import pickle
import posixpath
from decimal import Decimal
from typing import Any

import numpy as np
import orjson

from tidal.errors import FormatError, RecordError, needs
from tidal.formats import Errors, Options, Piece, check_options, source
from tidal.formats.bad_data import bad, data_errors
from tidal.formats.binary import check_offsets, mapped, read_all, view

NAME = "mds"
__all__ = ["COUNTS", "NAME", "columns", "counts", "open", "scan"]

SCALARS = {
    "int": "<i8",
    "int8": "i1",
    "int16": "<i2",
    "int32": "<i4",
    "int64": "<i8",
    "uint8": "u1",
    "uint16": "<u2",
    "uint32": "<u4",
    "uint64": "<u8",
    "float16": "<f2",
    "float32": "<f4",
    "float64": "<f8",
}
_NDARRAY_DTYPES = {
    8: "u1",
    9: "i1",
    16: "<u2",
    17: "<i2",
    18: "<f2",
    32: "<u4",
    33: "<i4",
    34: "<f4",
    64: "<u8",
    65: "<i8",
    66: "<f8",
}
_NDARRAY_NAMES = {np.dtype(v).name: v for v in _NDARRAY_DTYPES.values()}
_TEXT = {"bytes", "str", "str_int", "str_float", "str_decimal", "json"}
IMAGES = {"jpeg", "png", "pil", "jpeg_array", "jpegarray", "list[jpeg]", "list[png]", "list[pil]"}
UNSAFE = {"pkl"}
COLUMNS_OPTIONAL = True  # a column some shards of a dataset lack is None in their samples


def _known(encoding: str) -> bool:
    name = encoding.split(":", 1)[0]
    return encoding in SCALARS or encoding in _TEXT or encoding in IMAGES or encoding in UNSAFE or name == "ndarray"


class Shard:
    """A parsed shard: its bytes, sample offsets and columns, all checked."""

    def __init__(self, path: str, src: Any, compression: str | None):
        self.path = path
        if compression is None:
            self.data = mapped(path, src)
        else:
            self.data = np.frombuffer(read_all(path, src, compression), dtype=np.uint8)
        data = self.data
        if len(data) < 8:
            raise FormatError(f"{path}: not an MDS shard: {len(data)} bytes")
        n = int(view(path, data, 0, "<u4", 1, "the sample count")[0])
        if 4 * (n + 2) > len(data):
            raise FormatError(f"{path}: corrupt MDS shard: {n} samples cannot fit in {len(data)} bytes")
        self.offsets = view(path, data, 4, "<u4", n + 1, "the sample offsets").astype(np.int64)
        head = 4 * (n + 2)
        first = int(self.offsets[0])
        if not head <= first <= len(data):
            raise FormatError(
                f"{path}: corrupt MDS shard: samples start at byte {first}, inside its header (0..{head})"
            )
        check_offsets(path, self.offsets, first, len(data), "sample")
        try:
            config = json.loads(data[head:first].tobytes())
            names, encodings = list(config["column_names"]), list(config["column_encodings"])
            sizes = list(config["column_sizes"])
        except (ValueError, LookupError, TypeError) as exc:
            raise FormatError(f"{path}: corrupt MDS shard: unreadable column config ({exc})") from None
        if not (len(names) == len(encodings) == len(sizes)) or not all(isinstance(e, str) for e in encodings):
            raise FormatError(f"{path}: corrupt MDS shard: column config does not line up")
        unknown = [e for e in encodings if not _known(e)]
        if unknown:
            raise FormatError(f"{path}: unknown MDS encoding {unknown[0]!r}")
        self.names: list[str] = names
        self.encodings: list[str] = encodings
        self.sizes: list[int | None] = [int(s) if s else None for s in sizes]

    @property
    def rows(self) -> int:
        return len(self.offsets) - 1


def scan(path: str, compression: str | None, file: str | None = None) -> dict:
    shard = Shard(path, file or path, compression)
    return {"rows": shard.rows, "columns": dict(zip(shard.names, shard.encodings, strict=True))}


COUNTS = "index.json"  # where a remote shard is counted from without a download (tidal.sources.counting)


def counts(path: str, compression: str | None, manifest: bytes) -> dict | None:
    """The scan of the shard ``path`` as the ``index.json`` beside it says (Mosaic writes each
    shard's samples and columns there), so a remote shard is counted without downloading it;
    None where the index does not describe it. A reader checks the shard against it when it
    opens it (``samples``)."""
    try:
        index = json.loads(manifest)
    except ValueError:
        return None
    shards = index.get("shards") if isinstance(index, dict) else None
    name = posixpath.basename(path)
    for shard in shards if isinstance(shards, list) else []:
        data = shard.get("zip_data" if compression is not None else "raw_data") if isinstance(shard, dict) else None
        if not isinstance(data, dict) or data.get("basename") != name or shard.get("format", "mds") != "mds":
            continue
        names, encodings, samples = shard.get("column_names"), shard.get("column_encodings"), shard.get("samples")
        if type(samples) is not int or samples < 0 or not isinstance(names, list) or not isinstance(encodings, list):
            return None
        if len(names) != len(encodings) or not all(isinstance(x, str) for x in names + encodings):
            return None
        if not all(_known(e) for e in encodings):
            return None
        return {"rows": samples, "columns": dict(zip(names, encodings, strict=True)), "samples": samples}
    return None


def columns(info: dict) -> list[str]:
    return list(info["columns"])


def _image(encoding: str, data: bytes) -> Any:
    Image = needs("PIL.Image", "the MDS format option decode_images=True", package="pillow")

    try:
        if encoding == "pil":
            width, height, mode_size = np.frombuffer(data[:12], "<u4").tolist()
            mode = data[12 : 12 + mode_size].decode()
            return Image.frombytes(mode, (width, height), data[12 + mode_size :])
        image = Image.open(io.BytesIO(data))
        image.load()
        return image
    except Exception as exc:  # Pillow raises many kinds (DecompressionBombError is no ValueError)
        raise ValueError(f"undecodable {encoding} image: {exc}") from None


def _split_list(data: bytes, head: int) -> list[bytes]:
    """An image list: ``head`` bytes before a uint32 count, the uint32 sizes, then the images."""
    count = int(np.frombuffer(data[head - 4 : head], "<u4")[0])
    sizes = np.frombuffer(data[head : head + 4 * count], "<u4").astype(np.int64)
    if len(sizes) != count:
        raise ValueError(f"an image list of {count} is cut short")
    ends = head + 4 * count + np.cumsum(sizes)
    if count and ends[-1] > len(data):
        raise ValueError("an image list runs past its value")
    starts = np.concatenate([[head + 4 * count], ends[:-1]])
    return [data[a:z] for a, z in zip(starts.tolist(), ends.tolist(), strict=True)]


def _ndarray(encoding: str, value: np.ndarray) -> np.ndarray:
    parts = encoding.split(":")
    i = 0
    if len(parts) > 1 and parts[1]:
        dtype = np.dtype(_NDARRAY_NAMES.get(parts[1], parts[1]))
    else:
        dtype = np.dtype(_NDARRAY_DTYPES[int(value[0])])
        i = 1
    if len(parts) > 2 and parts[2]:
        shape = tuple(int(d) for d in parts[2].split(","))
    else:
        byte = int(value[i])
        ndim, width = byte >> 2, 1 << (byte & 3)
        shape = tuple(value[i + 1 : i + 1 + ndim * width].view(f"<u{width}").tolist())
        i += 1 + ndim * width
    return value[i:].view(dtype).reshape(shape)


class MdsReader:
    def __init__(
        self,
        path: str,
        compression: str | None,
        info: dict,
        columns: list[str] | None,
        errors: Errors,
        options: Options | None,
    ):
        opts = check_options(NAME, options)
        self.path = path
        self._shard = Shard(path, source(path, info), compression)
        names = self._shard.names
        found = dict(zip(names, self._shard.encodings, strict=True))
        if "columns" in info and found != info["columns"]:
            raise FormatError(
                f"{path}: its columns {found} are not the {info['columns']} it was indexed with; damaged?"
            )
        if "samples" in info and self._shard.rows != info["samples"]:  # counted from the index.json beside it
            raise FormatError(
                f"{path}: {self._shard.rows} samples, not the {info['samples']} the index.json beside it says "
                "(it was counted from that); damaged, or the index.json of other shards?"
            )
        # the columns of its records: those asked for, else the dataset's (tidal.formats.agreement.agree), in
        # that order, None where this shard lacks one; None: its own, as they are
        order = columns if columns is not None else info.get("dataset_columns")
        refill = order is not None and (any(c not in names for c in order) or (columns is None and order != names))
        self._order = list(order) if refill and order is not None else None
        wanted = set(columns or names)
        self._keep = [(i, n) for i, n in enumerate(names) if n in wanted]
        if columns is not None:  # in the order asked
            self._keep.sort(key=lambda item: columns.index(item[1]))
        pickled = [n for i, n in self._keep if self._shard.encodings[i] in UNSAFE]
        if pickled and not opts.get("allow_pickle", False):
            raise FormatError(
                f"{path}: column {pickled[0]!r} is pickled; unpickling runs code from the data. "
                "Leave it out with columns=, or pass the format option allow_pickle=True if you trust this data"
            )
        self._decode_images = bool(opts.get("decode_images", False))
        self._errors = errors

    def _value(self, encoding: str, value: np.ndarray) -> Any:
        if encoding in SCALARS:
            if len(value) != np.dtype(SCALARS[encoding]).itemsize:
                raise ValueError(f"{len(value)} bytes for an {encoding}")
            scalar = value.view(SCALARS[encoding])[0]
            return int(scalar) if encoding == "int" else scalar
        if encoding.startswith("ndarray"):
            return _ndarray(encoding, value)
        data = value.tobytes()
        if encoding == "bytes":
            return data
        if encoding == "str":
            return data.decode()
        if encoding == "str_int":
            return int(data.decode())
        if encoding == "str_float":
            return float(data.decode())
        if encoding == "str_decimal":
            return Decimal(data.decode())
        if encoding == "json":
            return orjson.loads(data)
        if encoding in UNSAFE:
            return pickle.loads(data)  # refused at open unless allow_pickle
        # images
        if encoding in ("jpeg_array", "jpegarray"):
            images = _split_list(data, 4)
        elif encoding.startswith("list["):
            images = _split_list(data, 8)
        else:
            return _image(encoding, data) if self._decode_images else data
        if self._decode_images:
            inner = "pil" if encoding == "list[pil]" else "jpeg"
            return [_image(inner, d) for d in images]
        return images

    def _sample(self, row: int) -> dict[str, Any]:
        shard = self._shard
        a, z = int(shard.offsets[row]), int(shard.offsets[row + 1])
        sample = shard.data[a:z]
        sizes, at = [], 0
        for size in shard.sizes:
            if size is None:
                if at + 4 > len(sample):
                    raise ValueError("sample cut short in its sizes")
                size = int(sample[at : at + 4].view("<u4")[0])
                at += 4
            sizes.append(size)
        starts = np.cumsum([at, *sizes]).tolist()
        if starts[-1] != len(sample):
            raise ValueError(f"its columns take {starts[-1]} bytes, the sample has {len(sample)}")
        out = {}
        for i, name in self._keep:
            out[name] = self._value(shard.encodings[i], sample[starts[i] : starts[i + 1]])
        return out if self._order is None else {name: out.get(name) for name in self._order}

    def read(self, start: int, stop: int) -> Piece:
        records: list[Any] = []
        valid: np.ndarray | None = None
        for row in range(start, stop):
            try:
                records.append(self._sample(row))
            except data_errors() as exc:  # a pickle may raise anything: allow_pickle trusts the data
                bad(self._errors, RecordError(f"undecodable MDS sample: {exc}", path=self.path, row=row))
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
) -> MdsReader:
    return MdsReader(path, compression, info, columns, errors, options)
