"""A LitData chunk file's bytes: its item offsets (checked), its compression, its Arrow footer.

The layouts LitData writes (see :mod:`tidal.formats.litdata`) differ only in where an item's
bytes are: a slice of the file, of the chunk decompressed when opened (whole-chunk zstd), of
its zstd frame decompressed the first time one of its rows is read (batch), or an item's own
zstd frame (sample). Apart from :mod:`tidal.formats.litdata`, which turns items into records
through the directory's config, because finding an item's bytes is a job of its own.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pyarrow as pa

from tidal.errors import FormatError
from tidal.formats.bad_data import data_errors
from tidal.formats.binary import check_offsets, mapped, read_all, view

FOOTER_MAGIC = b"LDARW01\x00"
FRAMED_MAGIC = b"LDFZ01\x00\x00"  # the batch layout's first bytes
_FRAME = np.dtype([("first", "<u4"), ("items", "<u4"), ("at", "<u8"), ("compressed", "<u4"), ("inflated", "<u4")])


class Chunk:
    """One chunk's item bytes, item offsets (checked) and, when there is one, its Arrow footer.

    ``item(row)`` gives an item's (decompressed) bytes. The layouts LitData writes (see the
    module docstring) differ only in where those bytes are: a slice of the file (plain), of
    the chunk decompressed when opened (whole-chunk zstd), of its zstd frame decompressed
    the first time one of its rows is read (batch), or an item's own zstd frame (sample).
    """

    def __init__(self, path: str, src: Any, config: dict):
        self.path = path
        compression = config.get("compression")
        level = config.get("compression_level") or "chunk"
        if compression and level == "chunk":
            self.data = np.frombuffer(read_all(path, src, str(compression).split(":")[0]), dtype=np.uint8)
        else:
            self.data = mapped(path, src)
        self.footer: pa.Table | None = None
        self._frames: np.ndarray | None = None  # batch: the frame table
        self._sample = False  # sample: every item its own zstd frame
        self._zstd: Any = None
        if len(self.data) >= 8 and self.data[:8].tobytes() == FRAMED_MAGIC:
            self._framed()
            return
        data = self.data
        end = len(data)
        if end >= 12 and data[-8:].tobytes() == FOOTER_MAGIC:
            (size,) = struct.unpack("<I", data[-12:-8].tobytes())
            end = len(data) - 12 - size
            if end < 0:
                raise FormatError(f"{path}: corrupt Arrow footer: {size} bytes in a {len(data)}-byte chunk")
            try:
                self.footer = pa.ipc.open_file(pa.py_buffer(data[end : len(data) - 12])).read_all()
                self.footer.validate(full=True)
            except data_errors() as exc:
                raise FormatError(f"{path}: corrupt Arrow footer: {exc}") from None
        if end < 4:
            raise FormatError(f"{path}: not a LitData chunk: {end} bytes")
        n = int(view(path, data, 0, "<u4", 1, "the item count")[0])
        if 4 * (n + 2) > end:
            raise FormatError(f"{path}: corrupt LitData chunk: {n} items cannot fit in {end} bytes")
        self.offsets = view(path, data, 4, "<u4", n + 1, "the item offsets").astype(np.int64)
        head = 4 * (n + 2)
        if int(self.offsets[0]) != head or int(self.offsets[-1]) > end:
            raise FormatError(
                f"{path}: corrupt item offsets: they run {int(self.offsets[0])}..{int(self.offsets[-1])}, "
                f"expected {head}..(at most) {end}"
            )
        check_offsets(path, self.offsets, head, int(self.offsets[-1]), "item")
        if self.footer is not None and self.footer.num_rows != n:
            raise FormatError(f"{path}: {n} items but {self.footer.num_rows} rows in its Arrow footer")
        self._sample = bool(compression) and level == "sample" and self.footer is None
        self.rows = n

    def _framed(self) -> None:
        """The batch layout: its uncompressed header and frame table, checked; no frame decoded."""
        path, data = self.path, self.data
        head = view(path, data, 0, "u1", 24, "the framed header").tobytes()
        _magic, version, _flags, n, k, count = struct.unpack("<8sHHIII", head)
        if version != 1:
            raise FormatError(f"{path}: LitData framed zstd chunk of version {version}; this reader knows version 1")
        if n < 1 or k < 1 or count != -(-n // k):
            raise FormatError(f"{path}: corrupt framed chunk header: {n} items, {k} a frame, {count} frames")
        self.offsets = view(path, data, 24, "<u4", n + 1, "the item offsets").astype(np.int64)
        frames = view(path, data, 24 + 4 * (n + 1), _FRAME, count, "the frame table")
        table_end = 24 + 4 * (n + 1) + _FRAME.itemsize * count
        first = frames["first"].astype(np.int64)
        size = frames["items"].astype(np.int64)
        at = frames["at"].astype(np.int64)
        ends = at + frames["compressed"].astype(np.int64)
        starts = np.arange(count, dtype=np.int64) * k
        lo, hi = np.clip(first, 0, n), np.clip(first + size, 0, n)  # a damaged table indexes nothing outside
        wrong = np.flatnonzero(
            (first != starts)
            | (size != np.minimum(k, n - starts))
            | (at < table_end)
            | (ends > len(data))
            | (frames["inflated"].astype(np.int64) != self.offsets[hi] - self.offsets[lo])
        )
        if len(wrong):
            i = int(wrong[0])
            raise FormatError(
                f"{path}: corrupt framed chunk: frame {i} (items {int(first[i])}..{int(first[i] + size[i])}, "
                f"bytes {int(at[i])}..{int(ends[i])} of {len(data)}) does not fit its header"
            )
        check_offsets(path, self.offsets, 0, int(self.offsets[-1]), "item")
        self._frames, self._k = frames, k
        self._done = np.zeros(count, dtype=bool)
        self._failed: dict[int, str] = {}
        self._raw, self.data = data, np.empty(int(self.offsets[-1]), dtype=np.uint8)
        self.rows = n

    def _inflate(self, compressed: np.ndarray, size: int | None) -> np.ndarray:
        """One zstd frame's bytes, checked whole: complete, nothing after it, ``size`` bytes."""
        if self._zstd is None:
            import zstandard

            self._zstd = zstandard.ZstdDecompressor()
        frame = self._zstd.decompressobj()
        out = frame.decompress(compressed.tobytes())
        if not frame.eof:
            raise ValueError("its zstd frame is cut short")
        if frame.unused_data:
            raise ValueError(f"{len(frame.unused_data)} bytes follow its zstd frame")
        if size is not None and len(out) != size:
            raise ValueError(f"its zstd frame holds {len(out)} bytes, not {size}")
        return np.frombuffer(out, dtype=np.uint8)

    def item(self, row: int) -> np.ndarray:
        """The bytes of item ``row``; a ValueError (or zstd's error) if they do not decompress."""
        a, z = int(self.offsets[row]), int(self.offsets[row + 1])
        if self._sample:
            return self._inflate(self.data[a:z], None)
        if self._frames is not None:
            i = row // self._k
            if not self._done[i]:
                self._frame(i)
        return self.data[a:z]

    def _frame(self, i: int) -> None:
        frames = self._frames
        assert frames is not None
        first, items = int(frames["first"][i]), int(frames["items"][i])
        if i not in self._failed:
            at, end = int(frames["at"][i]), int(frames["at"][i]) + int(frames["compressed"][i])
            lo, hi = int(self.offsets[first]), int(self.offsets[first + items])
            try:
                self.data[lo:hi] = self._inflate(self._raw[at:end], hi - lo)
                self._done[i] = True
                return
            except data_errors() as exc:
                self._failed[i] = f"{exc}"
        raise ValueError(f"zstd frame {i} (items {first}..{first + items}) does not decompress: {self._failed[i]}")
