"""Line-oriented files (JSON lines, plain text), plain or compressed (gzip, zstd, bz2).

A record is a non-empty line; empty lines (and a lone ``\\r``) are not records. For
uncompressed files the index keeps a checkpoint every ``CHECKPOINT_ROWS`` records (row,
byte offset, line number), so a reader opens at any row after at most that many lines.
Compressed files are read from their start: cost bounded by the file, never by the epoch.
Every compressed byte is checked (:mod:`tidal.formats.codecs`): scanning reads the whole
file, so a truncated or corrupt one fails its scan (a FormatError naming the file and the
byte), and the index never counts lines that could not be read back.

``path`` names the file in errors; the bytes are read from ``file`` when it is given (a
remote shard's local copy in the shard cache, passed as ``info["file"]`` or ``file=``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import IO

from tidal.errors import FormatError
from tidal.formats import source
from tidal.formats.codecs import open_stream

CHECKPOINT_ROWS = 4096
_PIECE = 1 << 22


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
    with open_stream(path, file or path, compression) as f:
        for offset, line, _ in _iter_lines(f, 0, 0):
            if compression is None and rows % CHECKPOINT_ROWS == 0:
                checkpoints.append([rows, offset, line - 1])
            rows += 1
    info: dict = {"rows": rows}
    if len(checkpoints) > 1:  # the first is where reading from the start begins anyway
        info["checkpoints"] = checkpoints
    return info


class LineReader:
    """Reads rows ``[start, stop)`` as bytes with their line numbers; cheap when called in order.

    Works a piece of ``_PIECE`` bytes at a time with ``bytes.split``, not line by line.
    """

    def __init__(self, path: str, compression: str | None, info: dict):
        self.path = path
        where = source(path, info)
        if not isinstance(where, str):
            raise FormatError(f"{path}: line files are read from a local copy, not by ranges")
        self._source = where  # a local path: the file, or a remote shard's copy in the cache
        self._compression = compression
        self._checkpoints = info.get("checkpoints", [])
        self._file: IO[bytes] | None = None
        self._row = 0  # the row number of self._rows[self._at]
        self._rows: list[bytes] = []  # the current piece's rows
        self._index: list[int] = []  # their positions among the piece's lines
        self._base = 0  # the line number before the current piece's first line
        self._next_base = 0
        self._at = 0
        self._carry = b""

    def _open_at(self, row: int) -> None:
        self.close()
        self._file = open_stream(self.path, self._source, self._compression)
        self._row = line = 0
        if self._compression is None and self._checkpoints:
            k = min(row // CHECKPOINT_ROWS, len(self._checkpoints) - 1)
            self._row, offset, line = self._checkpoints[k]
            self._file.seek(offset)
        self._rows, self._index, self._at, self._carry = [], [], 0, b""
        self._next_base = line

    def _refill(self) -> bool:
        assert self._file is not None
        data = self._file.read(_PIECE)
        if data:
            parts = (self._carry + data).split(b"\n")
            self._carry = parts.pop()
        elif self._carry:
            parts, self._carry = [self._carry], b""
        else:
            return False
        index = [i for i, p in enumerate(parts) if p and p != b"\r"]
        rows = [parts[i] for i in index]
        if any(r.endswith(b"\r") for r in rows):
            rows = [r[:-1] if r.endswith(b"\r") else r for r in rows]
        self._rows, self._index, self._at = rows, index, 0
        self._base, self._next_base = self._next_base, self._next_base + len(parts)
        return True

    def read_rows(self, start: int, stop: int) -> tuple[list[bytes], list[int]]:
        """The rows and their 1-based line numbers."""
        if stop <= start:
            return [], []
        far = self._compression is None and start - self._row > CHECKPOINT_ROWS
        if self._file is None or start < self._row or far:
            self._open_at(start)
        rows: list[bytes] = []
        lines: list[int] = []
        while self._row < stop:
            if self._at >= len(self._rows) and not self._refill():
                raise FormatError(
                    f"{self.path}: ended after {self._row} records, expected {stop}; was it changed after indexing?"
                )
            available = len(self._rows) - self._at
            skip = min(max(start - self._row, 0), available)
            self._at += skip
            self._row += skip
            take = min(stop - self._row, len(self._rows) - self._at)
            if take > 0:
                a, z = self._at, self._at + take
                rows += self._rows[a:z]
                base = self._base + 1
                lines += [base + i for i in self._index[a:z]]
                self._at, self._row = z, self._row + take
        return rows, lines

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        self._file = None
