"""WebDataset tar shards: members grouped into samples by key, decoded by extension.

As in the webdataset convention, a member ``dir/abc.seg.png`` belongs to the sample with key
``dir/abc`` (its path up to the first dot of its file name) under the field ``seg.png``;
consecutive members with one key make one sample. A record is ``{"__key__": key, field:
value, ...}``, the value decoded by the field's last extension:

========================  ====================================================
``txt``, ``text``         ``str`` (UTF-8)
``json``                  the parsed JSON value
``cls``, ``cls2``,        ``int``
``index``
``npy``                   a numpy array (never unpickled)
anything else             ``bytes`` as stored: images, audio, ``.pyd``/``.pickle``
========================  ====================================================

Images and other media are left as bytes on purpose: decoding them is the costly part of a
vision pipeline and belongs in ``.map()`` (run in the DataLoader workers), where the user
picks the library and the output type. This keeps the format free of a decoder registry
(which would be global state or a new argument): ``ds.map(decode_jpg)`` is the hook.

Scanning records the byte offset of each sample's first member, so a reader of an
uncompressed tar seeks straight to the sample it wants. A ``.tar.gz``/``.tar.zst`` is read
from its start instead (sequentially, which is how such shards are read anyway). A tar cut
short (a member's data past the end of the file, a partial header, no end-of-archive
blocks) is a :class:`~tidal.errors.FormatError` naming the file and the byte offset. A tar
has a checksum on each header only; a compressed one is decompressed to its end when
scanned, so its codec's checks (:mod:`tidal.formats.codecs`) cover every byte. A member
that does not decode (bad UTF-8, JSON, ``.npy``) is a :class:`~tidal.errors.RecordError`
naming the sample's row, for the ``errors`` policy.
"""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Mapping
from typing import IO, Any

import numpy as np
import orjson

from tidal.errors import FormatError, RecordError, StorageError
from tidal.formats import Errors, Options, Piece, source
from tidal.formats.bad_data import bad, data_errors
from tidal.formats.binary import npy_header, open_stream
from tidal.formats.codecs import open_stream as open_decompressed

NAME = "webdataset"
__all__ = ["FIELDS_OPTIONAL", "NAME", "columns", "decode", "open", "scan"]
FIELDS_OPTIONAL = True  # a sample without a field asked for has None there

_BLOCK = 512


def split(name: str) -> tuple[str, str]:
    """``(key, field)`` of a member name: ``"a/b.seg.png"`` -> ``("a/b", "seg.png")``."""
    directory, _, base = name.rpartition("/")
    stem, _, field = base.partition(".")
    return (f"{directory}/{stem}" if directory else stem), field


def decode(field: str, data: bytes) -> Any:
    """A member's value by its field's last extension (see the module docstring)."""
    ext = field.rsplit(".", 1)[-1].lower()
    if ext in ("txt", "text"):
        return data.decode()
    if ext == "json":
        return orjson.loads(data)
    if ext in ("cls", "cls2", "index"):
        return int(data.decode().strip())
    if ext == "npy":
        return _npy(data)
    return data


def _npy(data: bytes) -> np.ndarray:
    """A ``.npy`` member, its header checked against its size before anything is allocated."""
    f = io.BytesIO(data)
    shape, fortran, dtype = npy_header(f)
    need = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if dtype.hasobject or need != len(data) - f.tell():
        raise ValueError(f"a .npy of {dtype} {shape} in {len(data) - f.tell()} bytes of data")
    flat = np.frombuffer(data, dtype=dtype, offset=f.tell())
    return flat.reshape(shape, order="F" if fortran else "C").copy()  # writable, as np.load gives it


def _members(path: str, tf: tarfile.TarFile, size: int | None) -> Any:
    """Regular members, each checked to lie inside the file; damage becomes a FormatError."""
    while True:
        at = tf.offset
        try:
            m = tf.next()
        except (FormatError, StorageError):
            raise
        except data_errors() as exc:
            raise FormatError(f"{path}: truncated or corrupt tar at byte {at}: {exc}") from None
        if m is None:
            return
        if size is not None and m.offset_data + m.size > size:
            raise FormatError(
                f"{path}: truncated tar at byte {size}: member {m.name!r} needs bytes up to {m.offset_data + m.size}"
            )
        if m.isfile():
            yield m


def _open_tar(path: str, src: Any, compression: str | None) -> tuple[tarfile.TarFile, IO[bytes]]:
    if compression is not None and not isinstance(src, str):
        raise FormatError(f"{path}: a compressed tar is read from a local file")
    f = open_stream(path, src) if compression is None else open_decompressed(path, src, compression)
    try:
        return tarfile.open(fileobj=f, mode="r:" if compression is None else "r|"), f
    except (FormatError, StorageError):
        f.close()
        raise
    except data_errors() as exc:
        f.close()
        raise FormatError(f"{path}: not a readable tar: {exc}") from None


def scan(path: str, compression: str | None, file: str | None = None) -> dict:
    src = file or path
    size = os.path.getsize(src) if compression is None and isinstance(src, str) else None
    tf, f = _open_tar(path, src, compression)
    offsets: list[int] = []
    fields: set[str] = set()
    key = None
    end = 0
    with f, tf:
        for m in _members(path, tf, size):
            k, field = split(m.name)
            if k != key:
                offsets.append(m.offset)
                key = k
            fields.add(field)
            end = m.offset_data + -(-m.size // _BLOCK) * _BLOCK
        if compression is not None:
            _drain(path, f)
    if size is not None and offsets and size - end < 2 * _BLOCK:
        raise FormatError(f"{path}: truncated tar at byte {size}: no end-of-archive blocks after the last member")
    return {"rows": len(offsets), "offsets": offsets, "fields": sorted(fields)}


def _drain(path: str, f: IO[bytes]) -> None:
    """Read a compressed tar to its end, past the end-of-archive blocks the tar reader stops
    at, so the codec checks its last bytes (gzip's CRC and length, zstd's frame end)."""
    try:
        while f.read(1 << 20):
            pass
    except (FormatError, StorageError):
        raise
    except data_errors() as exc:
        raise FormatError(f"{path}: truncated or corrupt: {exc}") from None


def columns(info: dict) -> list[str] | None:
    """``__key__`` and every field some sample has (unknown in an index from before tidal kept them)."""
    return ["__key__", *info["fields"]] if "fields" in info else None


class TarReader:
    def __init__(self, path: str, compression: str | None, info: dict, columns: list[str] | None, errors: Errors):
        self.path = path
        self._src = source(path, info)
        self._compression = compression
        self._offsets: list[int] = info["offsets"]
        self._columns = columns
        self._errors = errors
        self._tar: tarfile.TarFile | None = None
        self._file: IO[bytes] | None = None
        # a compressed tar's open stream: the sample its pending (already read) member starts
        self._next = 0
        self._pending: tuple[tarfile.TarInfo, bytes] | None = None
        self._iter: Any = iter(())

    def _samples_plain(self, start: int, stop: int) -> list[tuple[str, dict[str, bytes]]]:
        if self._file is None:
            self._file = open_stream(self.path, self._src)
        end = self._offsets[stop] if stop < len(self._offsets) else None
        self._file.seek(self._offsets[start])
        out: list[tuple[str, dict[str, bytes]]] = []
        try:
            with tarfile.open(fileobj=self._file, mode="r:") as tf:  # leaves the file open: it is ours
                for m in _members(self.path, tf, None):
                    if end is not None and m.offset >= end:
                        break
                    self._add(out, m, tf)
                    if len(out) > stop - start:
                        out.pop()
                        break
        except (FormatError, StorageError):
            raise
        except data_errors() as exc:
            raise FormatError(f"{self.path}: corrupt tar at byte {self._offsets[start]}: {exc}") from None
        return out

    def _add(self, out: list[tuple[str, dict[str, bytes]]], m: tarfile.TarInfo, tf: tarfile.TarFile) -> None:
        key, field = split(m.name)
        try:
            member = tf.extractfile(m)
            data = member.read() if member is not None else b""
        except StorageError:
            raise
        except data_errors() as exc:
            raise FormatError(f"{self.path}: truncated or corrupt tar at byte {m.offset_data}: {exc}") from None
        if not out or out[-1][0] != key:
            out.append((key, {}))
        out[-1][1][field] = data

    def _pull(self) -> tuple[tarfile.TarInfo, bytes] | None:
        """The next member of a compressed tar's stream, with its data (streams must read it now)."""
        assert self._tar is not None and self._file is not None
        m = next(self._iter, None)
        if m is None:  # the last member: read on to the end, so the codec checks the last bytes too
            _drain(self.path, self._file)
            return None
        try:
            f = self._tar.extractfile(m)
            return m, f.read() if f is not None else b""
        except (FormatError, StorageError):
            raise
        except data_errors() as exc:
            raise FormatError(f"{self.path}: truncated or corrupt tar at member {m.name!r}: {exc}") from None

    def _samples_stream(self, start: int, stop: int) -> list[tuple[str, dict[str, bytes]]]:
        if self._tar is None or start < self._next:
            self.close()
            self._tar, self._file = _open_tar(self.path, self._src, self._compression)
            self._iter = _members(self.path, self._tar, None)
            self._next, self._pending = 0, self._pull()
        out: list[tuple[str, dict[str, bytes]]] = []
        while self._pending is not None and self._next < stop:
            m, data = self._pending
            key, field = split(m.name)
            fields = {field: data}
            while (nxt := self._pull()) is not None and split(nxt[0].name)[0] == key:
                fields[split(nxt[0].name)[1]] = nxt[1]
            self._pending = nxt
            if self._next >= start:
                out.append((key, fields))
            self._next += 1
        return out

    def read(self, start: int, stop: int) -> Piece:
        if stop <= start:
            return Piece([])
        samples = self._samples_plain(start, stop) if self._compression is None else self._samples_stream(start, stop)
        if len(samples) != stop - start:
            raise FormatError(f"{self.path}: {len(samples)} samples from {start}, expected {stop - start}; changed?")
        records: list[Any] = []
        valid: np.ndarray | None = None
        asked = [c for c in self._columns or [] if c != "__key__"]
        missed: dict[str, str] = {}  # columns some sample lacked: where first
        found: set[str] = set()  # columns some sample had
        for i, (key, members) in enumerate(samples):
            error: RecordError | None = None
            fields: Mapping[str, bytes | None] = members
            if self._columns is not None:
                for c in asked:
                    if c in members:
                        found.add(c)
                    elif c not in missed:
                        missed[c] = f"{self.path}, sample {key!r} has the fields {', '.join(sorted(members))}"
                fields = {c: members.get(c) for c in asked}
            try:
                rec = {"__key__": key, **{f: d if d is None else decode(f, d) for f, d in fields.items()}}
            except data_errors() as exc:  # UnicodeDecodeError, orjson's JSONDecodeError: ValueErrors
                error = RecordError(f"sample {key!r}: {exc}", path=self.path, row=start + i)
            if error is not None:
                bad(self._errors, error)
                if valid is None:
                    valid = np.ones(stop - start, dtype=bool)
                valid[i] = False
                continue
            records.append(rec)
        return Piece(records, valid, {c: where for c, where in missed.items() if c not in found})

    def close(self) -> None:
        if self._tar is not None:
            self._tar.close()
        if self._file is not None:
            self._file.close()
        self._tar = self._file = None


def open(  # noqa: A001
    path: str,
    compression: str | None,
    info: dict,
    columns: list[str] | None,
    errors: Errors,
    options: Options | None = None,
) -> TarReader:
    return TarReader(path, compression, info, columns, errors)
