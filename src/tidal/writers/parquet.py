"""Parquet output shards: one schema for every shard of a conversion, row groups of bounded size.

The schema is fixed before the first shard is written (:func:`infer_schema`, from the first
records of the source; a conversion keeps it in its plan), so every output shard has the
same columns and types, which is what a reader of the whole output wants, and what lets
the shards of a restarted conversion match those written before. Records that do not fit
it (a column that was all null in those first records and holds values later, a column
never seen there, a value of another type) are an error naming the column, never dropped.

Records are buffered up to ``row_group_bytes`` of Arrow data and written as one row group
(zstd): memory holds one row group per writer, and a reader decodes a row group at a time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from tidal.tables import Table, records

ROW_GROUP_BYTES = 32 << 20
COMPRESSION = "zstd"


class Misfit(ValueError):
    """A record that does not fit the output's schema; ``row``: its index in the table being written."""

    def __init__(self, message: str, row: int | None = None):
        super().__init__(message)
        self.row = row


def infer_schema(tables: list[Table]) -> pa.Schema:
    """The schema of some records: Arrow tables' own, or inferred from every record of the lists."""
    arrow = [to_table(t) for t in tables if not isinstance(t, pa.Table) or t.num_rows]
    if not arrow:
        raise ValueError("no records to take a schema from")
    return pa.concat_tables(arrow, promote_options="permissive").schema


def to_table(table: Table, schema: pa.Schema | None = None) -> pa.Table:
    """Records as an Arrow table of ``schema`` (None: inferred); ValueError naming the column that does not fit."""
    if isinstance(table, pa.Table):
        if schema is None or table.schema == schema:
            return table
        extra = [n for n in table.column_names if n not in schema.names]
        if extra:
            raise Misfit(f"column {extra[0]!r} is not in the output's schema ({', '.join(schema.names)})", 0)
        columns = [
            table.column(f.name) if f.name in table.column_names else pa.nulls(table.num_rows, f.type) for f in schema
        ]
        try:
            return pa.Table.from_arrays(columns, schema=schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
            pass
        try:
            return pa.Table.from_arrays([c.cast(f.type) for c, f in zip(columns, schema, strict=True)], schema=schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
            raise _misfit(table.to_pylist(), schema, exc) from None
    table = records(table)  # packed Columns too
    if table and not all(isinstance(r, dict) for r in table):
        bad = next(r for r in table if not isinstance(r, dict))
        raise Misfit(
            f"records must be dicts of column to value to be written, not {type(bad).__name__}", table.index(bad)
        )
    if schema is not None:
        names = set(schema.names)
        for row, rec in enumerate(table):
            extra = [k for k in rec if k not in names]
            if extra:
                raise Misfit(f"column {extra[0]!r} is not in the output's schema ({', '.join(schema.names)})", row)
    try:
        return pa.Table.from_pylist(table, schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError) as exc:
        raise _misfit(table, schema, exc) from None


def _misfit(records: list[Any], schema: pa.Schema | None, exc: Exception) -> Misfit:
    """A message that names the column (and the row of the table) that does not fit ``schema``."""
    fields = list(schema) if schema is not None else []
    for f in fields:
        for row, rec in enumerate(records):
            try:
                pa.array([rec.get(f.name)], type=f.type)
            except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError) as inner:
                if pa.types.is_null(f.type):
                    return Misfit(
                        f"column {f.name!r} was null in every record the output's schema was taken from (the "
                        f"source's first) and holds a {type(rec.get(f.name)).__name__} here: leave it out "
                        "(--columns) or convert a source with a fixed schema (Parquet, Arrow)",
                        row,
                    )
                return Misfit(f"column {f.name!r} does not fit the output's {f.type}: {inner}", row)
    return Misfit(f"records do not fit the output's schema: {exc}")


class ParquetShardWriter:
    """Writes one output shard to a temporary file; :meth:`finish` gives its index entry."""

    suffix = ".parquet"

    def __init__(self, file: Path, schema: pa.Schema, row_group_bytes: int = ROW_GROUP_BYTES):
        self.file = file
        self.schema = schema
        self.rows = 0
        self._row_group_bytes = row_group_bytes
        self._pending: list[pa.Table] = []
        self._pending_bytes = 0
        self._writer: pq.ParquetWriter | None = None

    def write(self, table: Table) -> None:
        t = to_table(table, self.schema)
        if t.num_rows == 0:
            return
        self._pending.append(t)
        self._pending_bytes += t.nbytes
        self.rows += t.num_rows
        if self._pending_bytes >= self._row_group_bytes:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        group = pa.concat_tables(self._pending)
        if self._writer is None:
            self._writer = pq.ParquetWriter(self.file, self.schema, compression=COMPRESSION)
        self._writer.write_table(group, row_group_size=group.num_rows)
        self._pending, self._pending_bytes = [], 0

    def finish(self) -> tuple[Path, dict] | None:
        self._flush()
        if self._writer is None:
            return None
        self._writer.close()
        self._writer = None
        from tidal.formats import scan_version
        from tidal.formats.parquet import scan
        from tidal.storage.digests import default_algorithm, file_digest

        info = scan(str(self.file), None)  # what tidal's index keeps: row groups, column sizes and types
        rows = info.pop("rows")
        entry = {
            "rows": rows,
            "bytes": self.file.stat().st_size,
            "format": "parquet",
            "compression": None,
            "info": info,
            "hash": file_digest(self.file, default_algorithm()),
        }
        if scan_version("parquet") != 1:  # the scan it is: an entry of another is scanned again
            entry["scan"] = scan_version("parquet")
        return self.file, entry

    def abort(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self._pending = []
        self.file.unlink(missing_ok=True)
