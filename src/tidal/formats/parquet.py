"""Parquet: column projection, opened at any row through its row groups."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tidal.errors import FormatError, RecordError
from tidal.formats import Errors, Piece

NAME = "parquet"


def _open_file(path: str) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise FormatError(f"{path}: not a readable Parquet file: {exc}") from None


def scan(path: str, compression: str | None) -> dict:
    if compression is not None:
        raise FormatError(f"{path}: Parquet compresses inside the file; a {compression} wrapper is not supported")
    meta = _open_file(path).metadata
    groups = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    return {"rows": meta.num_rows, "row_groups": groups}


class ParquetReader:
    def __init__(self, path: str, info: dict, columns: list[str] | None, errors: Errors):
        self._path = path
        self._file = _open_file(path)
        names = self._file.schema_arrow.names
        missing = [c for c in columns or [] if c not in names]
        if missing:
            raise FormatError(f"{path}: no column {missing[0]!r} (columns: {', '.join(names)})")
        self._columns = columns
        self._errors = errors
        self._starts = np.concatenate([[0], np.cumsum(info["row_groups"])]).astype(np.int64)
        self._cached: tuple[int, pa.Table | None] = (-1, None)

    def _group(self, g: int) -> pa.Table | None:
        if self._cached[0] != g:
            try:
                table = self._file.read_row_group(g, columns=self._columns)
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
        if not parts:
            schema = self._file.schema_arrow
            parts = [schema.empty_table().select(self._columns or schema.names)]
        return Piece(pa.concat_tables(parts), valid)

    def close(self) -> None:
        self._file.close()


def open(path: str, compression: str | None, info: dict, columns: list[str] | None, errors: Errors) -> ParquetReader:  # noqa: A001
    return ParquetReader(path, info, columns, errors)
