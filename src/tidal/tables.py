"""The three shapes records take inside tidal, and the few operations stages need on them.

A *table* is a ``pyarrow.Table`` (columnar: Parquet, and anything Arrow reads), a Python
``list`` of records (JSON lines, the output of ``map``, batches), or :class:`Columns`: numpy
arrays whose first axis is the record (packed sequences), or Python lists (a shuffled block
of Arrow records, :class:`Decoded`). Keeping Arrow tables columnar until a batch is assembled
is what makes the Parquet path fast; keeping JSON as Python objects avoids a round trip
through Arrow that costs more than it saves; packing makes many sequences at once as 2-D
arrays, and a batch of them is a slice, never a stack of rows.
"""

from __future__ import annotations

from itertools import compress
from operator import itemgetter
from typing import Any, TypeAlias

import numpy as np
import pyarrow as pa

from tidal.errors import RecordError, SchemaError


class Columns(dict):
    """Records as columns of one length: numpy arrays along their first axis (``{"input_ids":
    (n, L), ...}``), Python lists, or Arrow arrays."""

    def __len__(self) -> int:  # the records, not the columns
        return len(next(iter(self.values()))) if dict.__len__(self) else 0

    def row(self, i: int) -> dict[str, Any]:
        return {k: v[i] for k, v in self.items()}


class Decoded(Columns):
    """A shuffled block of Arrow records, made Python once rather than batch by batch: text and
    bytes as lists, numbers without nulls as numpy arrays of their type, any other column kept
    in Arrow. The block is permuted anyway, and permuting Python objects costs less than Arrow's
    ``take`` of the text followed by a conversion per batch (3 -> 1 µs a record). Its records,
    and its batches, are those the Arrow table would give."""

    def rows(self) -> list[dict[str, Any]]:
        """Every record, converted a column at a time."""
        names = list(self)
        values = [
            v if isinstance(v, list) else v.tolist() if isinstance(v, np.ndarray) else v.to_pylist()
            for v in self.values()
        ]
        return [dict(zip(names, row, strict=True)) for row in zip(*values, strict=True)]


class Unparsed(Columns):
    """JSON lines of a block held as they were read, parsed as each batch is cut from it
    (:func:`tidal.formats.jsonl.parse`): ``line``, each record's bytes, and ``number``, its
    line in its file. A block's first batch, or the first after a resume, then waits for its
    lines to be read, not for every record of the block to be parsed, and a DataLoader worker
    parses a record as it serves it, not its whole block at once while the loop waits on it."""


def decoded(table: pa.Table) -> Table:
    """``table`` as :class:`Decoded` (as it is if two columns share a name)."""
    names = table.column_names
    if not names or len(set(names)) < len(names):
        return table
    out = {}
    try:
        for name, col in zip(names, table.columns, strict=True):
            t = col.type
            if any(is_text(t) for is_text in _TEXT):
                out[name] = col.to_pylist()
            elif (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)) and not col.null_count:
                out[name] = numpy_of(col)
            else:
                out[name] = col
    except UnicodeDecodeError as exc:
        raise _not_utf8(exc) from None
    return Decoded(out)


_TEXT = (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary, pa.types.is_large_binary)


Table: TypeAlias = "pa.Table | list[Any] | Columns"


def length(table: Table) -> int:
    return table.num_rows if isinstance(table, pa.Table) else len(table)


def take(table: Table, indices: np.ndarray) -> Table:
    if isinstance(table, pa.Table):
        return table.take(_int64s(indices))
    if isinstance(table, Columns):
        where = indices.tolist() if any(isinstance(v, list) for v in table.values()) else []
        return type(table)({k: _take(v, indices, where) for k, v in table.items()})
    return [table[i] for i in indices.tolist()]


def _take(column: Any, indices: np.ndarray, where: list[int]) -> Any:
    if isinstance(column, np.ndarray):
        return column[indices]
    if isinstance(column, pa.ChunkedArray):
        lists = _take_lists(column, indices)
        return lists if lists is not None else column.take(_int64s(indices))
    return [column[i] for i in where]


def integer_lists(column: Any) -> Any:
    """``column`` (a ChunkedArray) as one Arrow array of integer lists, where it is one without
    nulls in the lists or their values (token ids); None for anything else."""
    if not isinstance(column, pa.ChunkedArray) or column.null_count:
        return None
    kind = column.type
    if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)) or not pa.types.is_integer(kind.value_type):
        return None
    lists = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    return None if lists.values.null_count else lists


def _take_lists(column: pa.ChunkedArray, indices: np.ndarray) -> pa.ChunkedArray | None:
    """A column of integer lists without nulls (token ids) permuted list by list as slices of
    its values: several times faster than Arrow's ``take`` of lists. None for any other column."""
    lists = integer_lists(column)
    if lists is None:
        return None
    values, offsets = numpy_of(lists.values), numpy_of(lists.offsets)  # offsets into the whole values
    starts, ends = offsets[:-1][indices], offsets[1:][indices]
    pieces = [values[a:z] for a, z in zip(starts.tolist(), ends.tolist(), strict=True)]
    taken = np.concatenate(pieces) if pieces else values[:0]
    bounds = np.zeros(len(indices) + 1, dtype=offsets.dtype)
    np.cumsum(ends - starts, out=bounds[1:])
    made = type(lists).from_arrays(_arrow(bounds), _arrow(taken), type=column.type)
    return pa.chunked_array([made], type=column.type)


def _int64s(values: np.ndarray) -> pa.Array:
    return _arrow(np.ascontiguousarray(values, dtype=np.int64))


def _arrow(values: np.ndarray) -> pa.Array:
    """A 1-D numeric array as Arrow, over numpy's buffer. ``pa.array()`` would import pandas on
    its first call (0.3 s and 40 MB in every DataLoader worker, before its first batch)."""
    if values.dtype == np.bool_:
        return _bools(values)
    data = np.ascontiguousarray(values)
    return pa.Array.from_buffers(pa.from_numpy_dtype(data.dtype), len(data), [None, pa.py_buffer(data)])


def _bools(values: list[bool] | np.ndarray) -> pa.Array:
    bits = np.packbits(np.asarray(values, dtype=bool), bitorder="little")
    return pa.Array.from_buffers(pa.bool_(), len(values), [None, pa.py_buffer(bits)])


def cut(table: Table, start: int, stop: int) -> Table:
    if isinstance(table, pa.Table):
        return table.slice(start, stop - start)
    if isinstance(table, Columns):
        return type(table)({k: v[start:stop] for k, v in table.items()})
    return table[start:stop]


def concat(tables: list[Table], files: list[str] | None = None) -> Table:
    """``tables`` end to end. ``files``: the file each table was read from (a block's pieces):
    Arrow tables of different types are then made one table of the types they agree on
    (:func:`one_schema`), or a :class:`~tidal.errors.SchemaError` naming the column and the files,
    never records of one column in two types."""
    if len(tables) == 1:
        return tables[0]
    if all(isinstance(t, pa.Table) for t in tables):
        if files is not None:
            return _concat_agreed(tables, files)
        try:
            return pa.concat_tables(tables, promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            pass  # columns of clashing types: fall back to records
    if all(isinstance(t, Columns) for t in tables) and len({(type(t), tuple(t)) for t in tables}) == 1:
        first = tables[0]
        assert isinstance(first, Columns)
        joined = {k: _join([t[k] for t in tables]) for k in first}
        if all(v is not None for v in joined.values()):
            return type(first)(joined)
    out: list[Any] = []
    for t in tables:
        out.extend(records(t))
    return out


def _concat_agreed(tables: list[pa.Table], files: list[str]) -> Table:
    first = tables[0].schema
    if all(t.schema.equals(first) for t in tables[1:]):
        return pa.concat_tables(tables)  # the common case: one schema (the dataset's, cast by the readers)
    if any(len(set(t.column_names)) < len(t.column_names) for t in tables):  # two columns of one name
        return concat(list(tables))  # as before: joined by Arrow, else records
    schema = one_schema([(t.schema, f) for t, f in zip(tables, files, strict=True)])
    conformed = []
    for table, file in zip(tables, files, strict=True):
        try:
            conformed.append(conform(table, schema))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise SchemaError(
                f"{file}: its values do not convert to the types the files of its block agree on: {exc}"
            ) from None
    return pa.concat_tables(conformed)


# -- schema drift: one type per column over files written by different writers -------------------


def one_type(name: str, found: list[tuple[pa.DataType, str]]) -> pa.DataType:
    """The type column ``name`` takes over files whose own types are ``found`` (each with a file
    that has it): pyarrow's permissive promotion (``unify_schemas(promote_options="permissive")``:
    int32 and int64 are int64, float32 and float64 float64, integers and floats float64, string
    and large_string large_string, list<int32> and list<int64> list<int64>, a struct the union
    of its fields, null anything), where dictionary-encoded values next to plain ones are plain
    ones. Types that promotion cannot join (text and numbers, bool and int) are a SchemaError
    naming the column and a file of each."""
    known = [(t, f) for t, f in found if not pa.types.is_null(t)]
    if not known:
        return pa.null()
    if any(pa.types.is_dictionary(t) for t, _ in known) and not all(pa.types.is_dictionary(t) for t, _ in known):
        known = [(t.value_type if pa.types.is_dictionary(t) else t, f) for t, f in known]
    kind, where = known[0]
    for other, file in known[1:]:
        if other == kind:
            continue
        try:
            kind = (
                pa.unify_schemas([pa.schema([(name, kind)]), pa.schema([(name, other)])], promote_options="permissive")
                .field(0)
                .type
            )
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
            raise SchemaError(clash(name, (known[0][0], where), (other, file))) from None
    for t, file in found:
        castable(name, t, kind, file)
    return kind


def clash(name: str, one: tuple[Any, str], other: tuple[Any, str], declarable: bool = True) -> str:
    """The words of a column whose files hold types that do not join (``declarable``: where
    ``format_options={"column_types": ...}`` may declare the one to read them as)."""
    declare = f", or declare its type: format_options={{'column_types': {{{name!r}: ...}}}}" if declarable else ""
    return (
        f"column {name!r} is {one[0]} in {one[1]} but {other[0]} in {other[1]}: the records of a column are "
        f"of one type, and these do not convert into one; read them as separate datasets (and tidal.mix them){declare}"
    )


def castable(name: str, kind: pa.DataType, to: pa.DataType, file: str) -> None:
    """A SchemaError naming ``file`` where Arrow has no cast from ``kind`` to ``to`` at all (a list
    to a number): found once, before any record, not as every row failing."""
    if kind == to:
        return
    try:
        pa.array([], type=kind).cast(to)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        raise SchemaError(f"column {name!r} is {kind} in {file}, which does not convert to {to}") from None


def one_schema(found: list[tuple[pa.Schema, str]], declared: dict[str, pa.DataType] | None = None) -> pa.Schema:
    """The schema of a dataset whose files' schemas are ``found`` (each with a file that has it):
    every column any of them has, in the order they are first met, each of the type
    :func:`one_type` gives it (or ``declared`` declares), all nullable (a file without a column
    has nulls there)."""
    declared = declared or {}
    types: dict[str, list[tuple[pa.DataType, str]]] = {}
    for schema, file in found:
        for f in schema:
            types.setdefault(f.name, []).append((f.type, file))
    fields = []
    for name, kinds in types.items():
        if name in declared:
            for t, file in kinds:
                castable(name, t, declared[name], file)
            fields.append(pa.field(name, declared[name]))
        else:
            fields.append(pa.field(name, one_type(name, kinds)))
    return pa.schema(fields)


class Seen:
    """The types of the columns one reader has read so far, each with a file that has it: where
    the dataset did not know its files' types when it was opened (an index written before scans
    kept them), each piece a reader reads is checked against them (:meth:`conform`), so that a
    column of one type in one block and another in the next is the same SchemaError naming the
    column and both files, and a column read as int64 stays int64 when a file of int32 follows."""

    def __init__(self) -> None:
        self.types: dict[str, tuple[pa.DataType, str]] = {}

    def conform(self, tables: list[Table], files: list[str]) -> list[Table]:
        """``tables`` (pieces read from ``files``), those of Arrow of the types read before (or
        the wider types both promote to, from then on), with the columns read before that a
        piece lacks null; a clash is a SchemaError."""
        return [self._one(t, f) if isinstance(t, pa.Table) else t for t, f in zip(tables, files, strict=True)]

    def _one(self, table: pa.Table, file: str) -> pa.Table:
        types, changed = self.types, False
        if len(set(table.column_names)) < len(table.column_names):
            return table  # two columns of one name: no column to follow
        for field in table.schema:
            known = types.get(field.name)
            if known is None:
                if not pa.types.is_null(field.type):
                    types[field.name] = (field.type, file)
                changed = changed or pa.types.is_null(field.type)
            elif known[0] != field.type:
                kind = one_type(field.name, [known, (field.type, file)])
                if kind != known[0]:
                    types[field.name] = (kind, known[1])
                changed = True
        names = table.column_names
        lacking = [n for n in types if n not in names]
        if not changed and not lacking:
            return table
        fields = [pa.field(n, types[n][0] if n in types else table.schema.field(n).type) for n in names]
        try:
            return conform(table, pa.schema(fields + [pa.field(n, types[n][0]) for n in lacking]))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise SchemaError(f"{file}: its values do not convert to the types read before: {exc}") from None


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` with the columns of ``schema``, in its order and of its types: a column of
    another type cast (safely: a value that does not convert is an ``ArrowInvalid``), a
    column the table lacks all nulls. One cast per column that differs, none where none does."""
    n = table.num_rows
    names = table.column_names
    columns = []
    for f in schema:
        if f.name not in names:
            columns.append(pa.chunked_array([pa.nulls(n, f.type)], type=f.type))
            continue
        column = table.column(f.name)
        columns.append(column if column.type == f.type else column.cast(f.type))
    return pa.Table.from_arrays(columns, schema=schema)


def _join(parts: list[Any]) -> Any:
    """One column of several tables; None where they cannot be joined (then: records)."""
    if all(isinstance(p, list) for p in parts):
        return [x for p in parts for x in p]
    if all(isinstance(p, np.ndarray) for p in parts):
        return np.concatenate(parts)
    if any(isinstance(p, list) for p in parts):
        return None
    # Arrow, and numbers that had no nulls in some blocks: as Arrow would concatenate them
    arrays = [pa.chunked_array([_arrow(p)]) if isinstance(p, np.ndarray) else p for p in parts]
    try:
        one = [pa.Table.from_arrays([a], names=["c"]) for a in arrays]
        return pa.concat_tables(one, promote_options="permissive").column(0)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return None


def records(table: Table) -> list[Any]:
    if isinstance(table, Unparsed):  # parsed by the source stage, where the policy sees its bad lines
        raise AssertionError("JSON lines reached records() unparsed: a bug in tidal")
    try:
        if isinstance(table, Decoded):
            return table.rows()
        if isinstance(table, Columns):
            return [table.row(i) for i in range(len(table))]
        return table.to_pylist() if isinstance(table, pa.Table) else table
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
        return type(table)({k: _keep(v, where, mask) for k, v in table.items()})
    return [r for r, k in zip(table, mask, strict=True) if k]


def _keep(column: Any, where: np.ndarray, mask: list[bool]) -> Any:
    if isinstance(column, np.ndarray):
        return column[where]
    if isinstance(column, pa.ChunkedArray):
        return column.filter(_bools(where))
    return list(compress(column, mask))


def columns(table: Table) -> dict[str, Any]:
    """A batch: fixed-shape values stacked into numpy arrays, everything else kept as lists.
    Records with different fields make a batch of every field any of them has, None where a
    record lacks it (so that column is a list)."""
    try:
        if isinstance(table, Columns):
            return {k: _arrow_column(v) if isinstance(v, pa.ChunkedArray) else v for k, v in table.items()}
        if isinstance(table, pa.Table):
            return {name: _arrow_column(table.column(name)) for name in table.column_names}
    except UnicodeDecodeError as exc:
        raise _not_utf8(exc) from None
    if not table:
        return {}
    first = table[0]
    keys = first.keys() if isinstance(first, dict) else None
    try:  # the common case, at C speed: every record a dict with the first one's fields
        same = keys is not None and all(map(keys.__eq__, map(dict.keys, table)))
    except TypeError:  # a record that is not a dict
        same = False
    if not same or keys is None:
        for rec in table:
            if not isinstance(rec, dict):
                raise RecordError(f"batch() needs records that are dicts, got {type(rec).__name__}")
        union = dict.fromkeys(k for rec in table for k in rec)  # fields some record lacks: None there
        return {k: stack([rec.get(k) for rec in table]) for k in union}
    return {k: stack(list(map(itemgetter(k), table))) for k in keys}


_SCALARS = (bool, int, float, np.bool_, np.integer, np.floating)
_PLAIN = {int, float, bool}


def stack(values: list[Any]) -> Any:
    """One column of a batch: a numpy array when every value has one shape and kind, else the list."""
    first = values[0]
    if type(first) in _PLAIN and len(set(map(type, values))) == 1:  # all ints, floats or bools: the common case
        return np.asarray(values)
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
            return numpy_of(col)
        if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
            arr = col.combine_chunks()
            inner = arr.type.value_type
            if (pa.types.is_integer(inner) or pa.types.is_floating(inner)) and len(arr) > 0:
                flat = arr.flatten()
                if flat.null_count == 0 and len(flat) % len(arr) == 0:
                    width = len(flat) // len(arr)
                    lengths = numpy_of(arr.value_lengths())
                    if (lengths == width).all():
                        return numpy_of(flat).reshape(len(arr), width)
    return col.to_pylist()


def numpy_of(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
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
        parts = [numpy_of(c) for c in values.chunks if len(c)]
        return np.concatenate(parts) if len(parts) > 1 else parts[0] if parts else np.empty(0, dtype)
    n, offset = len(values), values.offset
    if n == 0:
        return np.empty(0, dtype)
    data = values.buffers()[1]
    if dtype.kind == "b":
        bits = np.frombuffer(data, dtype=np.uint8)
        return np.unpackbits(bits, count=offset + n, bitorder="little")[offset:].astype(bool)
    return np.frombuffer(data, dtype=dtype, count=n, offset=offset * dtype.itemsize).copy()
