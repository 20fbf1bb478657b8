"""Line-oriented files (JSON lines, plain text), plain, gzip or zstd.

A record is a non-empty line; empty lines (and a lone ``\\r``) are not records. For
uncompressed files the index keeps a checkpoint every ``CHECKPOINT_ROWS`` records (row,
byte offset, line number), so a reader opens at any row after at most that many lines.
Compressed files are read from their start: cost bounded by the file, never by the epoch.

``path`` names the file in errors; the bytes are read from ``file`` when it is given (a
remote shard's local copy in the shard cache, passed as ``info["file"]`` or ``file=``).
"""

from __future__ import annotations

import gzip
import io
from collections.abc import Iterator
from typing import IO, cast

from tidal.errors import TidalError

CHECKPOINT_ROWS = 4096
_PIECE = 1 << 22


def open_binary(path: str, compression: str | None) -> IO[bytes]:
    if compression == "gzip":
        return cast(IO[bytes], gzip.open(path, "rb"))
    raw = open(path, "rb")  # noqa: SIM115 - the caller closes it
    if compression is None:
        return raw
    import zstandard

    return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True, closefd=True))


def _iter_lines(f: IO[bytes], offset: int, line: int) -> Iterator[tuple[int, int, bytes]]:
    """(byte offset, 1-based line number, line without its end) for every non-empty line."""
    carry = b""
    start = offset
    while True:
        data = f.read(_PIECE)
        if not data:
            break
        parts = (carry + data).split(b"\n")
        carry = parts.pop()
        for part in parts:
            line += 1
            n = len(part) + 1
            if part and part != b"\r":
                yield start, line, part[:-1] if part.endswith(b"\r") else part
            start += n
    if carry and carry != b"\r":
        yield start, line + 1, carry[:-1] if carry.endswith(b"\r") else carry


def scan(path: str, compression: str | None, file: str | None = None) -> dict:
    rows = 0
    checkpoints: list[list[int]] = []
    with open_binary(file or path, compression) as f:
        for offset, line, _ in _iter_lines(f, 0, 0):
            if compression is None and rows % CHECKPOINT_ROWS == 0:
                checkpoints.append([rows, offset, line - 1])
            rows += 1
    info: dict = {"rows": rows}
    if checkpoints:
        info["checkpoints"] = checkpoints
    return info


class LineReader:
    """Reads rows ``[start, stop)`` as ``(line number, bytes)``; cheap when called in order."""

    def __init__(self, path: str, compression: str | None, info: dict):
        self.path = path
        self._source = info.get("file", path)  # where the bytes are: a local path
        self._compression = compression
        self._checkpoints = info.get("checkpoints", [])
        self._file: IO[bytes] | None = None
        self._lines: Iterator[tuple[int, int, bytes]] | None = None
        self._row = 0

    def _seek(self, row: int) -> None:
        if (
            self._file is not None
            and self._row <= row
            and (self._compression is not None or row - self._row <= CHECKPOINT_ROWS)
        ):
            return  # reading on from here is no dearer than a fresh seek
        self.close()
        self._file = open_binary(self._source, self._compression)
        offset = line = self._row = 0
        if self._compression is None and self._checkpoints:
            k = min(row // CHECKPOINT_ROWS, len(self._checkpoints) - 1)
            self._row, offset, line = self._checkpoints[k]
            self._file.seek(offset)
        self._lines = _iter_lines(self._file, offset, line)

    def read_lines(self, start: int, stop: int) -> list[tuple[int, bytes]]:
        if stop <= start:
            return []
        self._seek(start)
        assert self._lines is not None
        out = []
        for _, line, data in self._lines:
            row = self._row
            self._row += 1
            if row >= start:
                out.append((line, data))
                if self._row >= stop:
                    break
        if len(out) != stop - start:
            raise TidalError(
                f"{self.path}: ended after {self._row} records, expected {stop}; was it changed after indexing?"
            )
        return out

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        self._file = self._lines = None
