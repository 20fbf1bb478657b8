"""Arrow tables held in memory: the shards of a source that has no files, such as a Hugging Face
``datasets.Dataset`` built in memory (``Dataset.from_dict``, ``from_pandas``, ``from_list``).

Such a shard's ``info`` holds the table itself (``info["table"]``) and the row of it where the
shard starts (``info["start"]``); several shards share one table, and a dataset that holds
them pickles the table once (pickle keeps one copy of an object however often it is
referenced), so the chain crosses into spawn workers and Ray tasks with its data. There is
nothing to scan: :mod:`tidal.sources.hf_datasets` builds these shards directly, never through the index.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from tidal.errors import FormatError, SchemaError
from tidal.formats import Errors, Options, Piece

NAME = "memory"
__all__ = ["NAME", "columns", "open", "scan", "shards"]


def scan(path: str, compression: str | None, file: Any = None) -> dict:
    raise FormatError(f"{path}: format 'memory' holds in-memory Arrow tables, not files; pick another format=")


def shards(table: pa.Table, name: str, rows_per_shard: int) -> list[dict[str, Any]]:
    """``table`` as shards of at most ``rows_per_shard`` rows, named ``<name>/part-00000`` and on:
    each the fields of a :class:`tidal.Shard` (``path``, ``rows``, ``bytes``, ``format``, ``info``),
    which the dataset makes into one (formats sit below shards, so nothing here imports them)."""
    columns = {f.name: str(f.type) for f in table.schema}
    out = []
    for i, start in enumerate(range(0, max(1, table.num_rows), rows_per_shard)):
        rows = min(rows_per_shard, table.num_rows - start)
        nbytes = table.slice(start, rows).nbytes
        info = {"table": table, "start": start, "columns": columns}
        out.append({"path": f"{name}/part-{i:05d}", "rows": rows, "bytes": nbytes, "format": NAME, "info": info})
    return out


def columns(info: dict) -> list[str]:
    return list(info["columns"])


class MemoryReader:
    def __init__(self, path: str, info: dict, columns: list[str] | None):
        table = info.get("table")
        if not isinstance(table, pa.Table):
            raise FormatError(f"{path}: an in-memory shard without its table")
        missing = [c for c in columns or [] if c not in table.column_names]
        if missing:
            raise SchemaError(f"{path}: no column {missing[0]!r} (columns: {', '.join(table.column_names)})")
        self._table = table.select(columns) if columns is not None else table
        self._start = int(info.get("start", 0))

    def read(self, start: int, stop: int) -> Piece:
        return Piece(self._table.slice(self._start + start, stop - start))

    def close(self) -> None:
        pass


def open(  # noqa: A001
    path: str,
    compression: str | None,
    info: dict,
    columns: list[str] | None,
    errors: Errors,
    options: Options | None = None,
) -> MemoryReader:
    return MemoryReader(path, info, columns)
