"""The three shapes records take inside tidal, and the few operations stages need on them.

A *table* is a ``pyarrow.Table`` (columnar: Parquet, and anything Arrow reads), a Python
``list`` of records (JSON lines, the output of ``map``, batches), or :class:`Columns`: numpy
arrays whose first axis is the record (packed sequences). Keeping Arrow tables columnar until
a batch is assembled is what makes the Parquet path fast; keeping JSON as Python objects
avoids a round trip through Arrow that costs more than it saves; packing makes many
sequences at once as 2-D arrays, and a batch of them is a slice, never a stack of rows.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import numpy as np
import pyarrow as pa

from tidal.errors import RecordError


class Columns(dict):
    """Records as numpy arrays of one length along their first axis: ``{"input_ids": (n, L), ...}``."""

    def __len__(self) -> int:  # the records, not the columns
        return len(next(iter(self.values()))) if dict.__len__(self) else 0

    def row(self, i: int) -> dict[str, Any]:
        return {k: v[i] for k, v in self.items()}


Table: TypeAlias = "pa.Table | list[Any] | Columns"


def length(table: Table) -> int:
    return table.num_rows if isinstance(table, pa.Table) else len(table)


def take(table: Table, indices: np.ndarray) -> Table:
    if isinstance(table, pa.Table):
        return table.take(_int64s(indices))
    if isinstance(table, Columns):
        return Columns({k: v[indices] for k, v in table.items()})
    return [table[i] for i in indices.tolist()]


def _int64s(values: np.ndarray) -> pa.Array:
    """An Arrow array over numpy's buffer. ``pa.array()`` would import pandas on its first call
    (0.3 s and 40 MB in every DataLoader worker, before its first batch)."""
    data = np.ascontiguousarray(values, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(data), [None, pa.py_buffer(data)])


def _bools(values: list[bool]) -> pa.Array:
    bits = np.packbits(np.asarray(values, dtype=bool), bitorder="little")
    return pa.Array.from_buffers(pa.bool_(), len(values), [None, pa.py_buffer(bits)])


def cut(table: Table, start: int, stop: int) -> Table:
    if isinstance(table, pa.Table):
        return table.slice(start, stop - start)
    if isinstance(table, Columns):
        return Columns({k: v[start:stop] for k, v in table.items()})
    return table[start:stop]


def concat(tables: list[Table]) -> Table:
    if len(tables) == 1:
        return tables[0]
    if all(isinstance(t, pa.Table) for t in tables):
        try:
            return pa.concat_tables(tables, promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            pass  # columns of clashing types: fall back to records
    if all(isinstance(t, Columns) for t in tables) and len({tuple(t) for t in tables}) == 1:
        first = tables[0]
        assert isinstance(first, Columns)
        return Columns({k: np.concatenate([t[k] for t in tables]) for k in first})
    out: list[Any] = []
    for t in tables:
        out.extend(records(t))
    return out


def records(table: Table) -> list[Any]:
    if isinstance(table, Columns):
        return [table.row(i) for i in range(len(table))]
    if not isinstance(table, pa.Table):
        return table
    try:
        return table.to_pylist()
    except UnicodeDecodeError as exc:
        raise _not_utf8(exc) from None


def _not_utf8(exc: UnicodeDecodeError) -> RecordError:
    """A string column of bytes that are not UTF-8, found only when converted to Python: the
    format readers validate what they read, so this is data from elsewhere (a table built by
    hand, a Hugging Face dataset), whose file is not known here."""
    return RecordError(f"a string column holds bytes that are not UTF-8: {exc}")


def keep(table: Table, mask: list[bool]) -> Table:
    if isinstance(table, pa.Table):
        return table.filter(_bools(mask))
    if isinstance(table, Columns):
        where = np.asarray(mask, dtype=bool)
        return Columns({k: v[where] for k, v in table.items()})
    return [r for r, k in zip(table, mask, strict=True) if k]


def columns(table: Table) -> dict[str, Any]:
    """A batch: fixed-shape values stacked into numpy arrays, everything else kept as lists."""
    if isinstance(table, Columns):
        return dict(table)
    if isinstance(table, pa.Table):
        try:
            return {name: _arrow_column(table.column(name)) for name in table.column_names}
        except UnicodeDecodeError as exc:
            raise _not_utf8(exc) from None
    if not table:
        return {}
    first = table[0]
    if not isinstance(first, dict):
        raise TypeError(f"batch() needs records that are dicts, got {type(first).__name__}")
    keys = list(first)
    for rec in table:
        if not isinstance(rec, dict) or rec.keys() != first.keys():
            got = sorted(rec) if isinstance(rec, dict) else type(rec).__name__
            raise TypeError(f"batch() needs records with the same fields: {sorted(keys)} and {got}")
    return {k: stack([rec[k] for rec in table]) for k in keys}


_SCALARS = (bool, int, float, np.bool_, np.integer, np.floating)


def stack(values: list[Any]) -> Any:
    """One column of a batch: a numpy array when every value has one shape and kind, else the list."""
    first = values[0]
    if isinstance(first, np.ndarray):
        if all(isinstance(v, np.ndarray) and v.shape == first.shape and v.dtype == first.dtype for v in values):
            return np.stack(values)
        return values
    if isinstance(first, _SCALARS):
        kind = bool if isinstance(first, (bool, np.bool_)) else None
        if all(isinstance(v, _SCALARS) and (kind is None) == (not isinstance(v, (bool, np.bool_))) for v in values):
            return np.asarray(values)
    return values


def _arrow_column(col: pa.ChunkedArray) -> Any:
    t = col.type
    if col.null_count == 0:
        if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
            return _numpy(col)
        if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
            arr = col.combine_chunks()
            inner = arr.type.value_type
            if (pa.types.is_integer(inner) or pa.types.is_floating(inner)) and len(arr) > 0:
                flat = arr.flatten()
                if flat.null_count == 0 and len(flat) % len(arr) == 0:
                    width = len(flat) // len(arr)
                    lengths = _numpy(arr.value_lengths())
                    if (lengths == width).all():
                        return _numpy(flat).reshape(len(arr), width)
    return col.to_pylist()


def _numpy(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A numeric Arrow array without nulls as a numpy array of its own (a batch is the user's to
    change), read from Arrow's buffer: Arrow's ``to_numpy()`` imports pandas on its first call,
    0.3 s and 40 MB in every DataLoader worker before its first batch."""
    t = values.type
    if pa.types.is_boolean(t):
        dtype = np.dtype(bool)
    else:
        dtype = np.dtype(
            f"<{'f' if pa.types.is_floating(t) else 'u' if pa.types.is_unsigned_integer(t) else 'i'}{t.bit_width // 8}"
        )
    if isinstance(values, pa.ChunkedArray):
        parts = [_numpy(c) for c in values.chunks if len(c)]
        return np.concatenate(parts) if len(parts) > 1 else parts[0] if parts else np.empty(0, dtype)
    n, offset = len(values), values.offset
    if n == 0:
        return np.empty(0, dtype)
    data = values.buffers()[1]
    if dtype.kind == "b":
        bits = np.frombuffer(data, dtype=np.uint8)
        return np.unpackbits(bits, count=offset + n, bitorder="little")[offset:].astype(bool)
    return np.frombuffer(data, dtype=dtype, count=n, offset=offset * dtype.itemsize).copy()
