"""Parquet: column projection, opened at any row through its row groups.

``path`` names the file in errors. The bytes are read from ``file`` when it is given
(``info["file"]`` or ``file=``): a local path (a remote shard's copy in the shard cache), a
binary file, or a function that opens one (a remote file read in place by byte ranges, for
a few columns of a large file). The index keeps each top-level column's compressed size,
which is how the reader decides between the two.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import IO, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tidal.errors import FormatError, RecordError, StorageError
from tidal.formats import Errors, Options, Piece, source

NAME = "parquet"

Source = str | IO[bytes] | Callable[[], IO[bytes]]


def _open_file(path: str, file: Any = None) -> pq.ParquetFile:
    source = path if file is None else file() if callable(file) else file
    try:
        return pq.ParquetFile(source, pre_buffer=not isinstance(source, str))
    except StorageError:
        raise
    except (pa.ArrowException, OSError) as exc:
        raise FormatError(f"{path}: not a readable Parquet file: {exc}") from None


def scan(path: str, compression: str | None, file: Source | None = None) -> dict:
    if compression is not None:
        raise FormatError(f"{path}: Parquet compresses inside the file; a {compression} wrapper is not supported")
    meta = _open_file(path, file).metadata
    groups = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    sizes: dict[str, int] = {}
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        for c in range(rg.num_columns):
            col = rg.column(c)
            top = col.path_in_schema.split(".", 1)[0]
            sizes[top] = sizes.get(top, 0) + col.total_compressed_size
    return {"rows": meta.num_rows, "row_groups": groups, "column_bytes": sizes}


class ParquetReader:
    def __init__(self, path: str, info: dict, columns: list[str] | None, errors: Errors):
        self._path = path
        self._file = _open_file(path, source(path, info))
        names = self._file.schema_arrow.names
        missing = [c for c in columns or [] if c not in names]
        if missing:
            raise FormatError(f"{path}: no column {missing[0]!r} (columns: {', '.join(names)})")
        self._columns = columns
        self._errors = errors
        self._starts = np.concatenate([[0], np.cumsum(info["row_groups"])]).astype(np.int64)
        # The decoded row group the last read ended in: the next slice of this file (the next
        # block of its group) usually starts there. Dropped once read to its end, so memory
        # holds one row group per file of the block being read, not per open file.
        self._cached: tuple[int, pa.Table | None] = (-1, None)

    def _group(self, g: int) -> pa.Table | None:
        if self._cached[0] != g:
            try:
                table = self._file.read_row_group(g, columns=self._columns)
            except StorageError:
                raise  # the network, not the data: never skipped as a bad row group
            except (pa.ArrowException, OSError) as exc:
                if self._errors == "raise":
                    row = int(self._starts[g])
                    raise RecordError(
                        f"unreadable row group {g} (rows {row}..{self._starts[g + 1]}): {exc}", path=self._path, row=row
                    ) from None
                table = None
            self._cached = (g, table)
        return self._cached[1]

    def read(self, start: int, stop: int) -> Piece:
        parts: list[pa.Table] = []
        valid: np.ndarray | None = None
        pos = start
        g = int(np.searchsorted(self._starts, start, side="right")) - 1
        while pos < stop:
            g_start, g_stop = int(self._starts[g]), int(self._starts[g + 1])
            end = min(stop, g_stop)
            table = self._group(g)
            if table is None:  # skipped: its rows are counted, not yielded
                if valid is None:
                    valid = np.ones(stop - start, dtype=bool)
                valid[pos - start : end - start] = False
            else:
                parts.append(table.slice(pos - g_start, end - pos))
            pos, g = end, g + 1
        if self._cached[0] >= 0 and stop >= self._starts[self._cached[0] + 1]:
            self._cached = (-1, None)  # read to its end: in epoch order no slice comes back to it
        if not parts:
            schema = self._file.schema_arrow
            parts = [schema.empty_table().select(self._columns or schema.names)]
        return Piece(pa.concat_tables(parts), valid)

    def close(self) -> None:
        self._file.close(force=True)  # also a file object it was given


def open(  # noqa: A001
    path: str,
    compression: str | None,
    info: dict,
    columns: list[str] | None,
    errors: Errors,
    options: Options | None = None,
) -> ParquetReader:
    return ParquetReader(path, info, columns, errors)
