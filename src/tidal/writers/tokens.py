"""Token output shards: one ``.tokens`` file per output shard, through :class:`~tidal.formats.tokens.TokenWriter`.

Each record's ``column`` (``input_ids``, as :meth:`tidal.Dataset.tokenize` makes it, or any
column of token ids) is one document. The writer puts them in a private directory with a
``TokenWriter`` that never splits the shard, and :meth:`TokenShardWriter.finish` returns the
file and the entry ``TokenWriter`` wrote for it (documents, tokens, bytes, hash), which the
conversion collects into the output's ``index.json``.
"""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from tidal.errors import SchemaError
from tidal.formats.tokens import INDEX, TokenWriter
from tidal.tables import Table

_ONE_SHARD = 1 << 62  # TokenWriter's shard_size: never cut this output shard in two


class TokenShardWriter:
    """Writes one output shard of documents of token ids; :meth:`finish` gives its index entry."""

    suffix = ".tokens"

    def __init__(self, file: Path, column: str, dtype: str):
        self.file = file
        self.column = column
        self.rows = 0
        self._dir = file.with_name(file.name + ".d")
        shutil.rmtree(self._dir, ignore_errors=True)
        self._writer = TokenWriter(self._dir, dtype=dtype, shard_size=_ONE_SHARD)

    def write(self, table: Table) -> None:
        for ids in documents(table, self.column):
            self._writer.write(ids)
            self.rows += 1

    def finish(self) -> tuple[Path, dict] | None:
        self._writer.close()
        index = json.loads((self._dir / INDEX).read_text())
        if not index["shards"]:
            shutil.rmtree(self._dir, ignore_errors=True)
            return None
        (entry,) = index["shards"]
        (self._dir / entry["name"]).replace(self.file)
        shutil.rmtree(self._dir, ignore_errors=True)
        return self.file, {**entry, "rows": entry["docs"], "dtype": index["dtype"]}

    def abort(self) -> None:
        shutil.rmtree(self._dir, ignore_errors=True)
        self.file.unlink(missing_ok=True)


def documents(table: Table, column: str) -> list[Any]:
    """The token ids of each record of ``table``: numpy arrays where the column is Arrow, else as stored."""
    if isinstance(table, pa.Table):
        if column not in table.column_names:
            raise SchemaError(_missing(column, table.column_names))
        arr = table.column(column).combine_chunks()
        if (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)) and arr.null_count == 0:
            offsets = arr.offsets.to_numpy()
            values = arr.values.to_numpy(zero_copy_only=False)
            return [values[a:z] for a, z in itertools.pairwise(offsets)]
        return arr.to_pylist()
    out = []
    for rec in table:
        try:
            out.append(rec[column])
        except (KeyError, TypeError):
            raise SchemaError(_missing(column, sorted(rec) if isinstance(rec, dict) else [])) from None
    return out


def _missing(column: str, have: list[str]) -> str:
    return (
        f"records have no column {column!r} of token ids (columns: {', '.join(have)}): "
        "tokenize a text column (--tokenize tokenizer.json --column text) or name the column of token ids (--column)"
    )


def dtype_of(samples: list[Any]) -> str:
    """The token dtype of a conversion without a tokenizer: uint16 where the source's ids are
    uint16 arrays (token shards, Megatron, flat files), else uint32."""
    if samples and all(isinstance(s, np.ndarray) and s.dtype == np.uint16 for s in samples):
        return "uint16"
    return "uint32"
