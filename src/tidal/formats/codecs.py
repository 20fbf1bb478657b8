"""Compressed files whose every byte is checked: a truncated or corrupt one is an error, never a short read.

What each codec checks (and so what tidal can promise about a file that decompresses):

- gzip: the CRC-32 and the length of every member, and that the last member is complete.
- bz2: the CRC of every block and of every stream, and that the last stream is complete.
- zstd: that every frame is complete, its content size where the frame says it, and its
  content checksum where the frame has one (the ``zstd`` command writes one by default;
  ``zstandard.ZstdCompressor(write_checksum=True)`` too).

Files of several gzip members, bz2 streams or zstd frames (as parallel compressors and
``cat`` write them) are read whole, and bytes after the last one that do not start another
are an error (Python's ``bz2`` module would ignore them, and with them a damaged stream).
An empty file is an error too: compressing nothing writes a header, so an empty file is one
whose writing never began (Python's ``gzip`` module would read it as no data).
- brotli and snappy (read whole, by the binary formats): what their decoders check.

A failure is a :class:`~tidal.errors.FormatError` naming the file and the compressed byte
offset: the frame's start for zstd, the position reached in the file for gzip and bz2.

A CRC or checksum comes at the end of what it covers, so a stream's bytes are known good only
once it is read to its end. The index scan does that for every compressed file, so damage
there is found before any record is read. A file damaged after indexing while keeping its
size and modification time (bit rot) is caught as it is read, at the end of its member or
frame: in a large file, records before that point may already have been read.
"""

from __future__ import annotations

import bz2
import gzip
import io
import zlib
from typing import IO, Any, cast

from tidal.errors import FormatError, StorageError, needs

_CHUNK = 1 << 17  # compressed bytes fed to the zstd decoder at a time


def open_stream(path: str, src: Any, compression: str | None) -> IO[bytes]:
    """A binary file object of the decompressed bytes of ``src`` (a local path or a binary
    file object); ``path`` names the file in errors. The caller closes it."""
    raw = open(src, "rb") if isinstance(src, str) else src  # noqa: SIM115 - the caller closes it
    if compression is None:
        return cast(IO[bytes], raw)
    if compression == "gzip":
        inner: Any = gzip.GzipFile(fileobj=raw, mode="rb")
    elif compression in ("bz2", "zstd"):
        inner = io.BufferedReader(_Frames(raw, path, compression), buffer_size=1 << 20)
    else:
        raw.close()
        raise FormatError(f"{path}: {compression} is read whole by the formats that use it, not as a stream")
    return cast(IO[bytes], _Checked(inner, raw, path, compression))


def decompress(path: str, data: bytes, compression: str | None) -> bytes:
    """The decompressed ``data`` of the file ``path``, checked as the module docstring says."""
    if compression is None:
        return data
    if compression in ("gzip", "bz2", "zstd"):
        with open_stream(path, io.BytesIO(data), compression) as f:
            return f.read()
    packages = {"brotli": "brotli", "snappy": "python-snappy"}
    if compression not in packages:
        raise FormatError(f"{path}: unsupported compression {compression!r}")
    codec = needs(compression, f"reading {compression} files ({path})", package=packages[compression])
    try:
        return bytes(codec.decompress(data))
    except Exception as exc:  # each codec raises its own error type for corrupt input
        raise FormatError(f"{path}: not valid {compression} data: {exc}") from None


class _Checked(io.RawIOBase):
    """A decompressing reader whose failures are FormatErrors naming the file and the offset."""

    def __init__(self, inner: Any, raw: Any, path: str, compression: str):
        self._inner, self._raw, self._path, self._compression = inner, raw, path, compression
        self._empty = True  # nothing read yet

    def readable(self) -> bool:
        return True

    def _fail(self, exc: BaseException) -> FormatError:
        try:
            at = f" (near compressed byte {self._raw.tell()})"
        except (OSError, ValueError):
            at = ""
        return FormatError(f"{self._path}: truncated or corrupt {self._compression} data{at}: {exc}")

    def read(self, size: int | None = -1) -> bytes:
        try:
            data = cast(bytes, self._inner.read(-1 if size is None else size))
        except (FormatError, StorageError):
            raise
        except (OSError, EOFError, ValueError, zlib.error) as exc:  # BadGzipFile is an OSError
            raise self._fail(exc) from None
        if self._empty and not data and size != 0:
            if self._raw.tell() == 0:
                raise FormatError(f"{self._path}: empty: a {self._compression} file holds at least a header")
            self._empty = False
        elif data:
            self._empty = False
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            try:
                self._inner.close()
            finally:
                self._raw.close()
        super().close()


class _Frames(io.RawIOBase):
    """zstd frames (or bz2 streams) decoded one after another; one the file ends inside is an error.

    ``zstandard``'s ``stream_reader`` returns what it decoded and stops when the input ends,
    complete frame or not; a frame decoder tells (``eof``), so one is used per frame.
    """

    def __init__(self, raw: Any, path: str, compression: str):
        self._raw, self._path, self._name = raw, path, compression
        if compression == "zstd":
            import zstandard

            self._new: Any = zstandard.ZstdDecompressor().decompressobj
            self._error: Any = zstandard.ZstdError
        else:
            self._new, self._error = bz2.BZ2Decompressor, (OSError, ValueError, EOFError)
        self._frame: Any = None  # the decoder of the frame being read; None between frames
        self._frame_at = 0  # the compressed byte that frame starts at
        self._fed = 0  # compressed bytes decoded so far
        self._input = b""  # compressed bytes read but not yet decoded
        self._out = memoryview(b"")
        self._ended = False

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while not self._out:
            if not self._decode():
                return 0
        n = min(len(b), len(self._out))
        b[:n] = self._out[:n]
        self._out = self._out[n:]
        return n

    def _decode(self) -> bool:
        if self._ended:
            return False
        if not self._input:
            self._input = self._raw.read(_CHUNK)
            if not self._input:
                self._ended = True
                if self._frame is not None:
                    raise FormatError(
                        f"{self._path}: truncated {self._name} data: the {self._unit} at byte {self._frame_at} is cut off "
                        f"at byte {self._fed}, the end of the file"
                    )
                return False
        if self._frame is None:
            self._frame, self._frame_at = self._new(), self._fed
        data, self._input = self._input, b""
        try:
            out = self._frame.decompress(data)
        except self._error as exc:
            raise FormatError(
                f"{self._path}: corrupt {self._name} data in the {self._unit} at byte {self._frame_at}: {exc}"
            ) from None
        if self._frame.eof:  # the frame ended (its checksum checked): what follows starts another
            self._input = self._frame.unused_data
            self._fed += len(data) - len(self._input)
            self._frame = None
        else:
            self._fed += len(data)
        self._out = memoryview(out)
        return True

    @property
    def _unit(self) -> str:
        return "frame" if self._name == "zstd" else "stream"

    def close(self) -> None:
        self._out = memoryview(b"")
        super().close()
