"""Schema drift over a dataset's files: one type per column, whichever file a record comes from.

A corpus written over months by different jobs drifts: int32 ids next to int64 ones, float32
scores next to float64, string next to large_string, dictionary-encoded text next to plain, a
column added later. The formats whose files carry an Arrow schema (Parquet, Arrow IPC and so
``save_to_disk`` directories: ``ARROW_SCHEMA`` in their module) record each file's schema when
it is scanned (``info["types"]``, :func:`encode`; the
index keeps each distinct schema once); :func:`agree` then decides the dataset's schema when
the dataset is opened (:func:`tidal.tables.one_schema`: pyarrow's permissive promotion, a
column some files lack null in theirs, a declared ``column_types`` as declared) and gives the
scan of each file whose schema differs the dataset's (``info["cast"]``), which its reader casts
every piece it reads to (:func:`cast`): one cast per piece, of the columns that differ, only in
those files. Types that do not join are a :class:`~tidal.errors.SchemaError` naming the column
and a file of each, raised by ``tidal.Dataset(...)``.

Token files (``TOKEN_DTYPE`` in their module: tidal token shards, Megatron, flat ``.npy`` and
``.bin``, LitData ``TokensLoader`` chunks) have one column, ``input_ids``, whose dtype each file says: :func:`agree_tokens` gives
the dataset one dtype (the integer type that holds every file's ids), and the readers of files
of another widen their ids to it (:func:`widen`): a pack of uint16 and int32 files never wraps
an id.

Where the types are unknown when the dataset is opened (an index published by an older tidal,
before scans recorded them), each reader joins the pieces it reads by the same rules or raises
the same error, in a block (:func:`tidal.tables.concat`) and from one block to the next
(:class:`tidal.tables.Seen`). MDS and LitData keep encodings, not Arrow types: one per column,
checked by :func:`tidal.formats.agreement.check_schemas`.
"""

from __future__ import annotations

import base64
import functools
import logging
import sys
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from tidal.errors import RecordError, SchemaError
from tidal.formats import Errors, Options
from tidal.formats.bad_data import bad
from tidal.tables import clash, conform, keep, one_schema, one_type

__all__ = ["agree", "agree_tokens", "cast", "column_types", "decode", "encode", "target", "widen"]

log = logging.getLogger("tidal")
_warned: set[str] = set()

CHECK_ROWS = 1024  # a piece whose cast failed is cast again this many rows at a time to find the bad rows


def encode(schema: pa.Schema) -> str:
    """A file's schema as the index keeps it: its columns and types (no metadata, every column
    nullable, so that files of one type have one text), as a base64 Arrow IPC schema."""
    plain = pa.schema([pa.field(f.name, f.type) for f in schema])
    # one string object per schema however many files have it: the shards a worker is sent hold it once
    return sys.intern(base64.b64encode(plain.serialize().to_pybytes()).decode())


@functools.lru_cache(maxsize=256)
def decode(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


def column_types(options: Options | None) -> dict[str, pa.DataType]:
    """The types ``format_options={"column_types": {...}}`` declares, by column."""
    declared = (options or {}).get("column_types") or {}
    return {name: pa.type_for_alias(str(kind)) for name, kind in declared.items()}


def agree(
    infos: list[dict], paths: Sequence[str], options: Options | None = None, columns: Sequence[str] | None = None
) -> list[dict]:
    """The scans of a dataset's files of Arrow-typed formats (``paths``: their files, for the
    errors), those whose schema is not the dataset's given it as ``"cast"``. Only the
    ``columns`` read count, where they are named (a clash in a column left out is no error).
    Files scanned before scans recorded their types have no say, and are joined block by block."""
    declared = column_types(options)
    first: dict[str, str] = {}  # each distinct schema, with a file that has it
    for info, path in zip(infos, paths, strict=True):
        text = info.get("types")
        if isinstance(text, str) and text not in first:
            first[text] = path
    _warn_untyped(infos, paths)
    if not first:
        return infos
    schemas = {text: decode(text) for text in first}
    if any(len(set(s.names)) < len(s.names) for s in schemas.values()):
        return infos  # a file with two columns of one name: no column to agree on
    unknown = [n for n in declared if all(n not in s.names for s in schemas.values())]
    if unknown:
        names = list(dict.fromkeys(n for s in schemas.values() for n in s.names))
        raise SchemaError(f"column_types names {unknown[0]!r}, which no file has (columns: {', '.join(names)})")
    if columns is not None:  # each file's schema as far as it is read
        schemas = {t: pa.schema([s.field(c) for c in columns if c in s.names]) for t, s in schemas.items()}
    dataset = one_schema([(schemas[t], p) for t, p in first.items()], declared)
    if columns is not None:
        dataset = pa.schema([dataset.field(c) for c in columns if c in dataset.names])
    one = encode(dataset)
    read = {t: encode(s) if columns is not None else t for t, s in schemas.items()}
    if all(r == one for r in read.values()):
        return infos  # every file of the dataset's own schema: nothing to cast
    return [info if read.get(info.get("types") or "", one) == one else {**info, "cast": one} for info in infos]


def _warn_untyped(infos: list[dict], paths: Sequence[str]) -> None:
    """Once per dataset: files whose types an older index does not say are checked as they are read."""
    untyped = [p for i, p in zip(infos, paths, strict=True) if not isinstance(i.get("types"), str)]
    if not untyped or untyped[0] in _warned:
        return
    _warned.add(untyped[0])
    log.warning(
        "%s (and %d more files) are listed in an index written before tidal kept each file's column types: "
        "their types are checked as each reader reads them, not when the dataset is opened; run `tidal index` "
        "on the data again to check them at once",
        untyped[0].split("?", 1)[0],  # never a signed URL's query
        len(untyped) - 1,
    )


def target(info: dict, columns: Sequence[str] | None) -> pa.Schema | None:
    """The schema a reader gives its pieces: the dataset's (``info["cast"]``), restricted to
    ``columns``; None where the file's own is the dataset's."""
    text = info.get("cast")
    if text is None:
        return None
    schema = decode(text)
    if columns is None:
        return schema
    return pa.schema([schema.field(c) for c in columns if c in schema.names])


def cast(
    table: pa.Table, schema: pa.Schema, path: str, rows: np.ndarray, errors: Errors
) -> tuple[pa.Table, np.ndarray | None]:
    """``table`` (rows ``rows`` of the file ``path``) as ``schema``: ``(table, which rows were
    kept, None: all)``. A value that does not convert (a declared type the data does not fit, an
    unsigned id past the signed type its column took) is a :class:`~tidal.errors.RecordError`
    naming the file, row and column, for the ``errors`` policy; its row is dropped if it returns."""
    try:
        return conform(table, schema), None
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    kept = np.ones(table.num_rows, dtype=bool)
    for f in schema:
        if f.name not in table.column_names or table.column(f.name).type == f.type:
            continue
        column = table.column(f.name).combine_chunks()
        for i in _failing(column, f.type):
            if kept[i]:
                value = column[i].as_py()
                shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
                why = f"column {f.name!r}: {shown} does not convert to {f.type}"
                bad(errors, RecordError(why, path=path, row=int(rows[i])))
                kept[i] = False
    if kept.all():  # only a column that did not cast as a whole: not a row's fault
        return conform(table, schema), None
    good = keep(table, kept.tolist())
    assert isinstance(good, pa.Table)
    return conform(good, schema), kept


def _failing(column: pa.Array, to: pa.DataType) -> list[int]:
    """The rows of ``column`` whose value does not convert to ``to``: ``CHECK_ROWS`` at a time,
    then halves of the parts that fail (a few casts per bad row)."""
    out: list[int] = []
    for a in range(0, len(column), CHECK_ROWS):
        out.extend(a + i for i in _halves(column.slice(a, CHECK_ROWS), to))
    return out


def _halves(part: pa.Array, to: pa.DataType) -> list[int]:
    try:
        part.cast(to)
        return []
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        if len(part) <= 1:
            return [0] if len(part) else []
    mid = len(part) // 2
    return _halves(part.slice(0, mid), to) + [mid + i for i in _halves(part.slice(mid), to)]


# -- token files: one dtype of input_ids over the dataset ---------------------------------------


def agree_tokens(dtypes: list[str | None], paths: Sequence[str]) -> str | None:
    """The dtype of ``input_ids`` over token files whose own are ``dtypes`` (None: unknown, no
    say): the integer type that holds every file's ids (Arrow's permissive promotion: uint16 and
    int32 are int32, uint32 and int32 int64); None where the files agree already. Integers next
    to floats (a Megatron float dataset) are a SchemaError naming a file of each."""
    found = [(np.dtype(d), p) for d, p in zip(dtypes, paths, strict=True) if d is not None]
    kinds = {d for d, _ in found}
    if len(kinds) <= 1:
        return None
    floats = [(d, p) for d, p in found if d.kind == "f"]
    ints = [(d, p) for d, p in found if d.kind != "f"]
    if floats and ints:
        ids, other = (ints[0][0].name, ints[0][1]), (floats[0][0].name, floats[0][1])
        raise SchemaError(clash("input_ids", ids, other, declarable=False))
    kind = one_type("input_ids", [(pa.from_numpy_dtype(d), p) for d, p in found])
    return np.dtype(kind.to_pandas_dtype()).name


def widen(ids: np.ndarray, dtype: np.dtype, path: str, row: int) -> np.ndarray:
    """``ids`` (of row ``row`` of ``path`` on) as ``dtype``, the dataset's: a copy, checked to
    hold every id (an unsigned 64-bit id past int64 is an error naming the file, never wrapped)."""
    if ids.dtype == dtype:
        return ids
    if len(ids) and not np.can_cast(ids.dtype, dtype, casting="safe"):
        info = np.iinfo(dtype) if dtype.kind in "iu" else None
        if info is not None and (int(ids.max()) > info.max or int(ids.min()) < info.min):
            raise SchemaError(
                f"{path}, row {row} on: token ids of {ids.dtype} past the range of {dtype}, the dtype "
                "the dataset's files agree on"
            )
    return ids.astype(dtype)
