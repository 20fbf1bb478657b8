"""Helpers the binary formats share: whole-file reads, read-only memory maps, bounds checks.

Every failure of the underlying libraries (a truncated zstd frame, an unmappable file) becomes
a :class:`~tidal.errors.FormatError` that names the file, so no raw exception from a
dependency leaves a format module.
"""

from __future__ import annotations

import mmap
from typing import IO, Any

import numpy as np

from tidal import fork_safe
from tidal.errors import FormatError, StorageError
from tidal.formats import codecs


def read_all(path: str, src: Any, compression: str | None) -> bytes:
    """The whole (decompressed) content of ``src``; errors name ``path``."""
    try:
        if hasattr(src, "read"):
            data = src.read()
        elif callable(src):
            with src() as f:
                data = f.read()
        else:
            with open(src, "rb") as f:
                data = f.read()
        return decompress(path, data, compression)
    except (FormatError, StorageError):
        raise
    except OSError as exc:
        raise FormatError(f"{path}: cannot read: {exc}") from None


def decompress(path: str, data: bytes, compression: str | None) -> bytes:
    """``data`` decompressed, every byte checked (see :mod:`tidal.formats.codecs`)."""
    return codecs.decompress(path, data, compression)


def mapped(path: str, src: Any) -> np.ndarray:
    """A read-only ``uint8`` view of a local file's bytes, zero-copy through ``mmap``.

    The map is never closed explicitly: arrays cut from it (records handed to the user) keep
    it alive, and it goes when the last of them does.
    """
    if not isinstance(src, str):
        data = src.read() if hasattr(src, "read") else src().read() if callable(src) else None
        if data is None:
            raise FormatError(f"{path}: cannot read from {type(src).__name__}")
        return np.frombuffer(data, dtype=np.uint8)
    try:
        with open(src, "rb") as f:
            if f.seek(0, 2) == 0:
                return np.zeros(0, dtype=np.uint8)
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError) as exc:
        raise FormatError(f"{path}: cannot map the file: {exc}") from None
    return np.frombuffer(mm, dtype=np.uint8)


def view(path: str, buf: np.ndarray, offset: int, dtype: Any, count: int, what: str) -> np.ndarray:
    """``count`` items of ``dtype`` at byte ``offset`` of ``buf``, or a FormatError saying what is cut off."""
    dt = np.dtype(dtype)
    end = offset + dt.itemsize * count
    if offset < 0 or count < 0 or end > len(buf):
        raise FormatError(f"{path}: truncated or corrupt: {what} needs bytes {offset}..{end}, the file has {len(buf)}")
    return buf[offset:end].view(dt)


def check_offsets(path: str, offsets: np.ndarray, low: int, high: int, what: str) -> None:
    """Offsets must start at ``low``, never decrease and end at ``high`` (a hostile file fails here)."""
    if len(offsets) == 0:
        raise FormatError(f"{path}: no {what} offsets")
    if int(offsets[0]) != low or int(offsets[-1]) != high:
        raise FormatError(
            f"{path}: corrupt {what} offsets: they run {int(offsets[0])}..{int(offsets[-1])}, expected {low}..{high}"
        )
    if len(offsets) > 1:
        bad = np.flatnonzero(np.diff(offsets.astype(np.int64)) < 0)
        if len(bad):
            i = int(bad[0])
            raise FormatError(
                f"{path}: corrupt {what} offsets: offset {i + 1} ({int(offsets[i + 1])}) is before offset {i}"
            )


def open_stream(path: str, src: Any) -> IO[bytes]:
    """A binary file object for ``src`` (a local path, a file object or an opener)."""
    try:
        if hasattr(src, "read"):
            return src
        if callable(src):
            return src()
        return open(src, "rb")
    except OSError as exc:
        raise FormatError(f"{path}: cannot open: {exc}") from None


_NPY_HEADER_LOCK = fork_safe.Lock()


def npy_header(f: IO[bytes]) -> tuple[tuple[int, ...], bool, np.dtype]:
    """``(shape, fortran_order, dtype)`` of the ``.npy`` header at ``f``'s position; ``f`` is left
    at the data. One thread at a time: numpy parses the header with ``ast.literal_eval``, and
    CPython 3.11's parser is not safe in several threads at once (it fails with "AST constructor
    recursion depth mismatch" when shards are indexed in parallel)."""
    with _NPY_HEADER_LOCK:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            return np.lib.format.read_array_header_1_0(f)
        return np.lib.format.read_array_header_2_0(f)
