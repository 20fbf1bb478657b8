"""Skipping the pages of a Parquet row group before a slice: the file pyarrow is handed, and the guard.

pyarrow 26 decodes a row group from its first row: it has no row-range read and
uses no page index. A slice that starts deep in a row group (a resume, or the first block of a
worker whose share starts in the middle of a group) would decode every row before it. But a
data page's header says how many rows it holds (a column that is not repeated), and pyarrow
passes over pages of a kind it does not decode (``INDEX_PAGE``) unread. So the file handed to
pyarrow (:class:`Retyped`) says ``INDEX_PAGE`` in the header of each page wholly before the
slice: one byte changed in what is read, never in the file. Each top-level column is then
decoded from the page its slice starts in.

That pyarrow passes over such pages is what it does, not what it promises. So skipping is
guarded (:func:`skipping`): once a process, the first time a slice could skip pages, a small
file of each page layout is read through :class:`Retyped` and must give exactly the rows
expected. Where the installed pyarrow decodes or refuses such pages, skipping is off, said in
one log line: every slice is then decoded from its group's first row (slower, never wrong).

Apart from :mod:`tidal.formats.parquet_pages`, which reads and checks the page headers,
because this relies on what pyarrow does rather than what it promises, and is kept, with
its guard, in one place that can be turned off or deleted whole.
"""

from __future__ import annotations

import functools
import io
import logging
import os
import tempfile
from bisect import bisect_left
from typing import Any

from tidal.formats.parquet_pages import INDEX_PAGE, ZIGZAG, Pages

_log = logging.getLogger("tidal")


class Retyped(io.RawIOBase):
    """The open file ``fd`` read as it is, except that each page header at ``patches`` says
    ``INDEX_PAGE``."""

    def __init__(self, fd: int, patches: list[int]):
        self._fd = os.dup(fd)
        self._close = os.close  # held: a reader may be closed at interpreter exit, its modules gone
        self._size = os.fstat(self._fd).st_size
        self._at = 0
        self._patches = sorted(p + 1 for p in patches)  # the byte after the field header: the type's value

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._at, io.SEEK_END: self._size}[whence]
        self._at = max(0, base + offset)
        return self._at

    def tell(self) -> int:
        return self._at

    def read(self, size: int = -1) -> bytes:
        """One ``pread``: pyarrow reads a buffer at a time, and a copy more would cost as much."""
        size = self._size - self._at if size < 0 else size
        data = os.pread(self._fd, size, self._at)
        lo, hi = bisect_left(self._patches, self._at), bisect_left(self._patches, self._at + len(data))
        if lo < hi:
            patched = bytearray(data)
            for p in self._patches[lo:hi]:
                patched[p - self._at] = ZIGZAG[INDEX_PAGE]
            data = bytes(patched)
        self._at += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self.read(len(view))
        view[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            self._close(self._fd)
        super().close()


@functools.cache
def skipping() -> bool:
    """Whether pages before a slice may be skipped (:class:`Retyped`): whether the installed
    pyarrow reads a column retyped so from the page its slice starts in, exactly, in each page
    layout writers use (v1 with a dictionary, one that falls back to plain pages, its dictionary
    page passed over too, and v2 with page checksums). Checked once a process,
    when first asked (about 10 ms); where not, one log line says so and slices are decoded from
    their group's first row."""
    try:
        why = _retyped_reads_wrong()
    except Exception as exc:  # anything at all: the slow path is never wrong
        why = f"{type(exc).__name__}: {exc}"
    if why is not None:
        import pyarrow

        _log.warning(
            "Parquet: pages before a slice are decoded, not skipped: pyarrow %s does not pass over pages "
            "retyped INDEX_PAGE as tidal expects (%s); resuming deep in a row group is slower, never wrong",
            pyarrow.__version__,
            why,
        )
    return why is None


def _retyped_reads_wrong() -> str | None:
    """What :class:`Retyped` gets wrong on a small file of each layout, or None."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows, row = 600, 401
    # made from buffers: pa.array() and pa.table() import pandas (0.4 s) on their first call
    ids = pa.Array.from_buffers(pa.int64(), rows, [None, pa.py_buffer(np.arange(rows, dtype=np.int64))])
    texts = [None if i % 11 == 0 else f"{i}:".encode() + b"x" * (i % 9) for i in range(rows)]
    valid = np.packbits([t is not None for t in texts], bitorder="little")
    offsets = np.cumsum([0] + [len(t or b"") for t in texts], dtype=np.int32)
    data = b"".join(t or b"" for t in texts)
    text = pa.Array.from_buffers(pa.string(), rows, [pa.py_buffer(valid), pa.py_buffer(offsets), pa.py_buffer(data)])
    table = pa.Table.from_arrays([ids, text], names=["id", "text"])
    layouts: list[dict[str, Any]] = [
        {},
        {"dictionary_pagesize_limit": 128},  # a dictionary full after a few pages: the rest plain
        {"data_page_version": "2.0", "use_dictionary": False, "write_page_checksum": True},
    ]
    with tempfile.TemporaryDirectory(prefix="tidal-pages-") as scratch:
        for n, layout in enumerate(layouts):
            path = os.path.join(scratch, f"{n}.parquet")
            pq.write_table(table, path, data_page_size=256, write_batch_size=20, **layout)
            metadata = pq.ParquetFile(path).metadata
            pages = Pages(path, metadata, [False, False], path)
            try:
                if pages.damage(0, rows) is not None:
                    return f"layout {layout}: {pages.damage(0, rows)}"
                starts, patches = pages.skips(0, row)
                if not patches or not all(0 < starts.get(c, 0) <= row for c in table.column_names):
                    return f"layout {layout}: no page to skip in the check's own file"
                dictionaries = {leaf.pages[0].at for leaf in pages.leaves(0) or [] if leaf.pages}
                if "dictionary_pagesize_limit" in layout and not dictionaries & set(patches):
                    return f"layout {layout}: no dictionary page to pass over in the check's own file"
                retyped = pq.ParquetFile(
                    Retyped(pages.fd, patches), metadata=metadata, pre_buffer=False, page_checksum_verification=True
                )
                try:
                    for column in table.column_names:
                        got = pa.Table.from_batches(
                            list(retyped.iter_batches(64, row_groups=[0], columns=[column], use_threads=False))
                        ).column(0)
                        want = table.column(column).slice(starts[column])
                        if not got.equals(want):
                            return (
                                f"layout {layout}: column {column!r} read {len(got)} rows, not rows {starts[column]}.."
                            )
                finally:
                    retyped.close(force=True)
            finally:
                pages.close()
    return None
