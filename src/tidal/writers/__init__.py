"""Writers: one output shard of a conversion, written whole to a local file, then placed.

A writer takes the records of one output shard, table by table (a ``pyarrow.Table`` or a list
of record dicts, as the stages yield them), writes them to a file under a local staging
directory, and on :meth:`ShardWriter.finish` returns the shard's index entry: its name, rows,
bytes and hash (``"xxh3_128:<hex>"`` where ``xxhash`` is installed, else ``"sha256:<hex>"``,
as tidal's shard cache checks them). A file is only ever written under a temporary name;
:mod:`tidal.writers.output` moves it to its final name (or uploads it) in one step, so no
half-written shard is ever seen under a shard's name.

- :mod:`~tidal.writers.parquet`: Parquet with one fixed schema for every shard of a conversion.
- :mod:`~tidal.writers.tokens`: tidal token shards (``.tokens``), through
  :class:`tidal.formats.tokens.TokenWriter`.
- :mod:`~tidal.writers.output`: the destination, a local directory or any fsspec URL.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from tidal.tables import Table


class ShardWriter(Protocol):
    """One output shard being written."""

    def write(self, table: Table) -> None:
        """Add records (a ``pyarrow.Table`` or a list of dicts)."""

    def finish(self) -> tuple[Path, dict] | None:
        """Close the file: ``(local path, index entry)``, or None when no record was written."""

    def abort(self) -> None:
        """Remove what was written (after an error)."""
