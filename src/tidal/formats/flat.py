"""Flat token files: nanoGPT's headerless ``.bin`` (uint16) and 1-D ``.npy`` arrays of token ids.

These files are one stream of tokens with no document boundaries, so there is no natural
record. A row is a fixed slice of the stream: ``ROW_BYTES`` (8 KiB) of it, that is 4,096
uint16 ids (2,048 uint32), the last row shorter. That gives thousands of rows per file, so
a resume, a shuffle and the split over ranks and workers are as fine-grained as with any
other format, while each row is still a zero-copy view of the memory-mapped file
(``{"input_ids": ids}``). Shuffling moves whole slices, never tokens within one; packing
(``pack()``) joins slices back into one stream, with no separator added between them: the
file already holds whatever separators it was written with.

A ``.bin`` has no header, so its token type is an option: ``dtype`` (default ``"uint16"``, as
nanoGPT's ``prepare.py`` writes it; ``"uint32"`` for vocabularies past 65,536). A ``.npy``
says its own type; it must be a 1-D integer array. In a dataset whose token files are of
several dtypes, the ids of every file are of the one that holds them all (those of the others
widened as they are read: :mod:`tidal.formats.schemas`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tidal.errors import FormatError, SchemaError
from tidal.formats import Errors, Options, Piece, check_options, schemas, source
from tidal.formats.bad_data import data_errors
from tidal.formats.binary import mapped, npy_header, open_stream

NAME = "flat"
__all__ = ["NAME", "ROW_BYTES", "columns", "open", "scan"]

ROW_BYTES = 8192
_BIN_DTYPES = {"uint16": "<u2", "uint32": "<u4", "int32": "<i4", "int64": "<i8"}
TOKEN_DTYPE = True  # input_ids of one dtype over the dataset's token files (tidal.formats.schemas)


def _npy_header(path: str, src: Any) -> tuple[np.dtype, int, int]:
    """``(dtype, length, data offset)`` of a ``.npy`` file, checked to be 1-D integers."""
    f = open_stream(path, src)
    try:
        shape, _, dtype = npy_header(f)
        offset = f.tell()
    except data_errors() as exc:
        raise FormatError(f"{path}: not a readable .npy file: {exc}") from None
    finally:
        f.close()
    if len(shape) != 1 or dtype.kind not in "iu":
        raise FormatError(f"{path}: a token file is a 1-D integer array, not {dtype} of shape {shape}")
    return dtype, int(shape[0]), offset


class FlatReader:
    def __init__(self, path: str, src: Any, npy: bool, dtype: Any, cast: str | None = None):
        self.path = path
        self._cast = np.dtype(cast) if cast is not None else None  # the dataset's dtype, where it is not this file's
        buf = mapped(path, src)
        if npy:
            dt, n, offset = _npy_header(path, src)
            if len(buf) < offset + n * dt.itemsize:
                raise FormatError(
                    f"{path}: truncated: {n} {dt} ids need {offset + n * dt.itemsize} bytes, the file has {len(buf)}"
                )
            self.ids = buf[offset : offset + n * dt.itemsize].view(dt)
        else:
            dt = np.dtype(dtype)
            if len(buf) % dt.itemsize:
                raise FormatError(f"{path}: {len(buf)} bytes is not a whole number of {dt.name} token ids")
            self.ids = buf.view(dt)
        self.per_row = max(ROW_BYTES // dt.itemsize, 1)

    def read(self, start: int, stop: int) -> Piece:
        ids, n = self.ids, self.per_row
        if self._cast is not None:  # the rows are one span of the file: widened at once
            span = schemas.widen(ids[start * n : stop * n], self._cast, self.path, start)
            return Piece([{"input_ids": span[i * n : (i + 1) * n]} for i in range(stop - start)])
        return Piece([{"input_ids": ids[i * n : (i + 1) * n]} for i in range(start, stop)])

    def close(self) -> None:
        pass


def _rows(tokens: int, itemsize: int) -> int:
    per_row = max(ROW_BYTES // itemsize, 1)
    return -(-tokens // per_row)


def scan(path: str, compression: str | None, file: str | None = None) -> dict:
    if compression is not None:
        raise FormatError(f"{path}: token files are memory-mapped; a {compression} wrapper is not supported")
    src = file or path
    size = len(mapped(path, src))
    if path.lower().endswith(".npy"):
        dt, n, offset = _npy_header(path, src)
        if size < offset + n * dt.itemsize:
            raise FormatError(
                f"{path}: truncated: {n} {dt} ids need {offset + n * dt.itemsize} bytes, the file has {size}"
            )
        return {"rows": _rows(n, dt.itemsize), "tokens": n, "dtype": dt.name}
    if size % 2:  # every dtype a .bin may hold is 2 bytes or more: an odd size is a cut file
        raise FormatError(f"{path}: {size} bytes is not a whole number of uint16 (or wider) token ids; truncated?")
    # rows are 8 KiB whatever the dtype, so the count does not depend on the dtype option
    return {"rows": -(-size // ROW_BYTES)}


def columns(info: dict) -> list[str]:
    return ["input_ids"]


def token_dtype(info: dict, options: Options | None = None) -> str | None:
    """The dtype of the file's ids: a ``.npy``'s own, a ``.bin``'s the ``dtype`` option's."""
    if "dtype" in info:
        return info["dtype"]
    named = str((options or {}).get("dtype", "uint16"))
    return np.dtype(_BIN_DTYPES[named]).name if named in _BIN_DTYPES else None


def open(  # noqa: A001
    path: str,
    compression: str | None,
    info: dict,
    columns: list[str] | None,
    errors: Errors,
    options: Options | None = None,
) -> FlatReader:
    if columns is not None and list(columns) != ["input_ids"]:
        raise SchemaError(f"{path}: a token file has one column, 'input_ids'; asked for {columns}")
    dtype = check_options(NAME, options).get("dtype", "uint16")
    if str(dtype) not in _BIN_DTYPES:
        raise FormatError(f"{path}: dtype must be one of {', '.join(_BIN_DTYPES)}, not {dtype!r}")
    npy = path.lower().endswith(".npy")
    return FlatReader(path, source(path, info), npy, _BIN_DTYPES[str(dtype)], info.get("cast"))
