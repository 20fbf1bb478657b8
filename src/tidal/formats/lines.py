"""Line-oriented files (JSON lines, plain text), plain or compressed (gzip, zstd, bz2).

A record is a non-empty line; empty lines (and a lone ``\\r``) are not records. For
uncompressed files the index keeps a checkpoint every ``CHECKPOINT_ROWS`` records, and after
every ``CHECKPOINT_BYTES`` of lines (row, byte offset, line number), so a reader opens at any row
after at most that many lines or bytes: a point read of one record (a block's first batch, a
resume) reads a few MB at most, not 4,096 documents of any size.
Compressed files are read from their start: cost bounded by the file, never by the epoch.
Every compressed byte is checked (:mod:`tidal.formats.codecs`): scanning reads the whole
file, so a truncated or corrupt one fails its scan (a FormatError naming the file and the
byte), and the index never counts lines that could not be read back.

``path`` names the file in errors; the bytes are read from ``file`` when it is given (a
remote shard's local copy in the shard cache, passed as ``info["file"]`` or ``file=``), or, for a
large remote file that is not compressed, from a function that opens it for ranged reads: a
reader then reads from the checkpoint before the rows asked for, not the file from its start.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterator
from typing import IO

from tidal.errors import FormatError
from tidal.formats import source
from tidal.formats.codecs import open_stream

CHECKPOINT_ROWS = 4096
CHECKPOINT_BYTES = 2 << 20  # 15 bytes of index per MB of lines; an index made before has rows only
_PIECE = 1 << 20  # read at a time: 4 MB reads fault fresh pages in, and leave the cache before they are parsed


def _iter_lines(f: IO[bytes], offset: int, line: int) -> Iterator[tuple[int, int]]:
    """(byte offset, 1-based line number) of every non-empty line."""
    carry: list[bytes] = []
    start = offset
    while True:
        data = f.read(_PIECE)
        if not data:
            break
        parts, carry = _split(data, carry)
        for part in parts:
            line += 1
            n = len(part)
            if n > 1 or (n == 1 and part[0] != 13):
                yield start, line
            start += n + 1
    tail = b"".join(carry)
    if tail and tail != b"\r":
        yield start, line + 1


def scan(path: str, compression: str | None, file: str | None = None) -> dict:
    if compression is None:
        small = _scan_small(file or path)
        if small is not None:
            return small
    rows = 0
    checkpoints: list[list[int]] = []
    last = -CHECKPOINT_BYTES  # the offset of the last checkpoint
    with open_stream(path, file or path, compression) as f:
        for offset, line in _iter_lines(f, 0, 0):
            if compression is None and (rows % CHECKPOINT_ROWS == 0 or offset - last >= CHECKPOINT_BYTES):
                checkpoints.append([rows, offset, line - 1])
                last = offset
            rows += 1
    info: dict = {"rows": rows}
    if len(checkpoints) > 1:  # the first is where reading from the start begins anyway
        info["checkpoints"] = checkpoints
    return info


def _scan_small(where: str) -> dict | None:
    """What :func:`scan` finds in a plain file of at most one piece, no empty line and no more
    rows than a checkpoint holds (its rows, nothing else), from one read without a file object:
    a corpus of many small files is indexed at the speed of the system calls. ``None`` for any
    other file, which the line-by-line scan reads."""
    fd = os.open(where, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        data = os.read(fd, size + 1) if size <= _PIECE else b""
    finally:
        os.close(fd)
    if len(data) != size or data.startswith((b"\n", b"\r\n")) or b"\n\n" in data or b"\n\r\n" in data:
        return None  # larger, short read, grown since, or with an empty line
    tail = data[data.rfind(b"\n") + 1 :]
    rows = data.count(b"\n") + (tail not in (b"", b"\r"))
    return {"rows": rows} if rows <= CHECKPOINT_ROWS else None


def _split(data: bytes, carry: list[bytes]) -> tuple[list[bytes | memoryview], list[bytes]]:
    """The complete lines of ``carry`` (the pieces of a line begun before) and ``data``,
    without their ends, and what follows the last one. Lines are views of ``data`` (the first
    joined to ``carry``): ``bytes.split`` would copy every byte once more, and joining
    ``carry + data`` once again; a line longer than many pieces is joined once, when it ends."""
    find = data.find
    end = find(b"\n")
    if end < 0:
        return [], [*carry, data]
    view = memoryview(data)
    lines: list[bytes | memoryview] = [b"".join([*carry, data[:end]]) if carry else view[:end]]
    append = lines.append
    start = end + 1
    while (end := find(b"\n", start)) >= 0:
        append(view[start:end])
        start = end + 1
    rest = data[start:]
    return lines, [rest] if rest else []


BOM = b"\xef\xbb\xbf"  # UTF-8's byte order mark


class LineReader:
    """Reads rows ``[start, stop)`` as bytes with their line numbers; cheap when called in order.

    Works a piece of ``_PIECE`` bytes at a time, not line by line.
    """

    def __init__(self, path: str, compression: str | None, info: dict):
        self.path = path
        where = source(path, info)
        if not isinstance(where, str) and (compression is not None or not callable(where)):
            raise FormatError(f"{path}: a compressed line file is read from a local copy, not by ranges")
        self._source = where  # a local path (the file, or a remote shard's copy in the cache), or an opener
        self._compression = compression
        self._checkpoints = info.get("checkpoints", [])
        self._checkpoint_rows = [c[0] for c in self._checkpoints]
        self._file: IO[bytes] | None = None
        self._row = 0  # the row number of self._rows[self._at]
        self._rows: list[bytes | memoryview] = []  # the current piece's rows
        self._index: list[int] | None = []  # their positions among the piece's lines; None: the same
        self._base = 0  # the line number before the current piece's first line
        self._next_base = 0
        self._at = 0
        self._carry: list[bytes] = []  # the start of a line not ended yet, in pieces
        self._at_start = True

    def _open_at(self, row: int) -> None:
        self.close()
        where = self._source
        self._file = open_stream(self.path, where if isinstance(where, str) else where(), self._compression)
        self._row, offset, line = self._checkpoint(row)
        if offset:
            self._file.seek(offset)
        self._rows, self._index, self._at, self._carry = [], [], 0, []
        self._next_base = line
        self._at_start = line == 0  # the file's first bytes come next: a byte order mark is not a record's

    def _checkpoint(self, row: int) -> list[int]:
        """``[row, byte offset, line]`` of the last checkpoint at or before ``row``: the file's start
        where it has none (a compressed file is read from its start)."""
        if self._compression is not None or not self._checkpoints:
            return [0, 0, 0]
        return self._checkpoints[max(bisect.bisect_right(self._checkpoint_rows, row) - 1, 0)]

    def _refill(self) -> bool:
        assert self._file is not None
        data = self._file.read(_PIECE)
        if self._at_start:
            self._at_start = False
            if data.startswith(BOM):  # as editors on Windows write it
                data = data[len(BOM) :]
        if data:
            lines, self._carry = _split(data, self._carry)
        elif self._carry:
            lines, self._carry = [b"".join(self._carry)], []
        else:
            return False
        if lines and (b"\r" in data or not all(lines) or lines[0][-1] == 13):  # CRLF, or blank lines
            kept = [i for i, p in enumerate(lines) if len(p) and not (len(p) == 1 and p[0] == 13)]
            rows = [lines[i] for i in kept]
            self._rows, self._index = [r[:-1] if r[-1] == 13 else r for r in rows], kept
        else:
            self._rows, self._index = lines, None  # every line is a record, as is
        self._at = 0
        self._base, self._next_base = self._next_base, self._next_base + len(lines)
        return True

    def read_rows(self, start: int, stop: int) -> tuple[list[bytes | memoryview], list[int]]:
        """The rows (views of the piece read, mostly: a copy costs as much as parsing) and
        their 1-based line numbers."""
        if stop <= start:
            return [], []
        far = self._checkpoint(start)[0] > self._row  # a checkpoint past where this reader is
        if self._file is None or start < self._row or far:
            self._open_at(start)
        rows: list[bytes | memoryview] = []
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
                if self._index is None:
                    lines += range(base + a, base + z)
                else:
                    lines += [base + i for i in self._index[a:z]]
                self._at, self._row = z, self._row + take
        return rows, lines

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        self._file = None
