"""A dataset's files made to agree: one type, or one encoding, of each column over all of them.

Each format has its part (:mod:`tidal.formats.schemas` for Arrow-typed files and token dtypes,
a module's own ``agree`` for CSV, ``COLUMNS_OPTIONAL`` for MDS and LitData); this module asks
each in turn, once, when a dataset is opened, and refuses a ``columns=`` name no file has
before anything is read. Apart from the registry (:mod:`tidal.formats`) because deciding a
dataset's schema is a concept of its own, and the registry need not know it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tidal.errors import SchemaError
from tidal.formats import Options, module
from tidal.tables import clash


def check_schemas(shards: Any) -> None:
    """Shards of one format must agree on their columns, where their scans recorded them
    (``info["columns"]``: name to encoding, or to "" where a format decides its types over the
    dataset: CSV): a clash named here, by column and file, beats a record that decodes
    differently, or a batch that cannot be stacked, an hour later. Where a format's records may
    lack a column some files have (``COLUMNS_OPTIONAL``: MDS, LitData; None there, see
    :func:`agree`), only its type must agree. Formats whose files carry Arrow schemas are agreed
    instead (:func:`agree`). ``shards``: a :class:`tidal.Shards`, read by its columns."""
    first: dict[str, tuple[str, Any]] = {}
    each: dict[tuple[str, str], tuple[str, str]] = {}  # (format, column): the first (encoding, file)
    agreed = {f for f in set(shards.formats) if getattr(module(f), "ARROW_SCHEMA", False)}
    optional = {f for f in set(shards.formats) if getattr(module(f), "COLUMNS_OPTIONAL", False)}
    for path, fmt, info in zip(shards.paths, shards.formats, shards.infos, strict=True):
        columns = info.get("columns")
        if columns is None or fmt in agreed:
            continue
        if fmt in optional:
            for name, kind in columns.items():
                seen, where = each.setdefault((fmt, name), (kind, path))
                if kind != seen and kind and seen:  # "": a type not recorded (an older scan)
                    raise SchemaError(clash(name, (seen, where), (kind, path), declarable=False))
            continue
        where, seen = first.setdefault(fmt, (path, columns))
        why = _differ(path, columns, where, seen) if seen != columns else ""
        if why:
            raise SchemaError(why)


def _differ(path: str, columns: dict, where: str, seen: dict) -> str:
    """What a file whose columns differ from another file's says: the first column that differs."""
    for name in [*seen, *columns]:
        if name not in columns:
            return f"{path}: no column {name!r}, which {where} has; read them as separate datasets (and tidal.mix them)"
        if name not in seen:
            return (
                f"{path}: a column {name!r}, which {where} has not; read them as separate datasets (and tidal.mix them)"
            )
        if columns[name] != seen[name] and columns[name] and seen[name]:  # "": a type not recorded (an older scan)
            return clash(name, (seen[name], where), (columns[name], path), declarable=False)
    if list(columns) != list(seen):
        return f"{path}: columns {list(columns)} are in another order than {list(seen)} of {where}"
    return ""


def agree(shards: Any, options: Options | None = None, columns: Sequence[str] | None = None) -> Any:
    """``shards`` with the scans made to say the dataset's one type of each column, so that a
    column is of one type whichever file a record comes from: the formats whose files carry an
    Arrow schema (``ARROW_SCHEMA``: Parquet, Arrow) together, token files (``TOKEN_DTYPE``) their
    ``input_ids`` dtype (:mod:`tidal.formats.schemas`), and each format that decides its types
    itself (a module's ``agree(infos, options) -> infos``: CSV). Types that do not join are a
    SchemaError naming the column and files (of ``columns``, those read, where they are named).
    ``shards``: a :class:`tidal.Shards`, returned as it is where nothing changes."""
    infos = list(shards.infos)
    changed = False
    names = sorted(set(shards.formats))
    usable = [e is None for e in shards.errors]

    def put(at: list[int], decided: list[dict]) -> None:
        nonlocal changed
        for i, info in zip(at, decided, strict=True):
            changed = changed or info is not infos[i]
            infos[i] = info

    from tidal.formats import schemas

    typed = {n for n in names if getattr(module(n), "ARROW_SCHEMA", False)}
    if typed:
        at = [i for i, f in enumerate(shards.formats) if f in typed and usable[i]]
        put(at, schemas.agree([infos[i] for i in at], [shards.paths[i] for i in at], options, columns))
    tokens = {n for n in names if getattr(module(n), "TOKEN_DTYPE", False)}
    if tokens:
        at = [i for i, f in enumerate(shards.formats) if f in tokens and usable[i]]
        dtypes = [module(shards.formats[i]).token_dtype(infos[i], options) for i in at]
        one = schemas.agree_tokens(dtypes, [shards.paths[i] for i in at])
        if one is not None:
            mine = [infos[i] for i in at]
            put(at, [info if d in (one, None) else {**info, "cast": one} for info, d in zip(mine, dtypes, strict=True)])
    for name in names:  # the columns some files of a format lack: None in their records
        if getattr(module(name), "COLUMNS_OPTIONAL", False):
            at = [i for i, f in enumerate(shards.formats) if f == name and usable[i] and "columns" in infos[i]]
            every = list(dict.fromkeys(c for i in at for c in infos[i]["columns"]))
            put(
                at,
                [
                    infos[i] if list(infos[i]["columns"]) == every else {**infos[i], "dataset_columns": every}
                    for i in at
                ],
            )
    for name in names:
        decide = getattr(module(name), "agree", None)
        if decide is None:
            continue
        at = [i for i, f in enumerate(shards.formats) if f == name and usable[i]]
        if at:
            put(at, decide([infos[i] for i in at], options))
    if not changed:
        return shards
    return type(shards)(
        shards.paths,
        shards.rows,
        shards.bytes,
        shards.formats,
        shards.compressions,
        infos,
        shards.versions,
        shards.hashes,
        shards.errors,
    )


def check_columns(shards: Any, columns: Sequence[str] | None) -> None:
    """Every name in ``columns`` must be a column of every shard whose scan knows its columns:
    a typo fails here, naming the file and the columns it has, not as a skipped record per row.
    Formats whose records may lack a field (``FIELDS_OPTIONAL``: WebDataset) need it in some
    shard only: the samples without it have None. ``shards``: a :class:`tidal.Shards`."""
    if columns is None:
        return
    union: dict[str, tuple[str, set[str]]] = {}  # format with optional fields: a shard, the fields of all
    for path, fmt, info, error in zip(shards.paths, shards.formats, shards.infos, shards.errors, strict=True):
        if error is not None:
            continue
        mod = module(fmt)
        known = getattr(mod, "columns", None)
        names = known(info) if known is not None else None
        if names is None:
            continue
        if getattr(mod, "FIELDS_OPTIONAL", False):
            union.setdefault(fmt, (path, set()))[1].update(names)
            continue
        if getattr(mod, "ARROW_SCHEMA", False) or getattr(mod, "COLUMNS_OPTIONAL", False):  # null where a file lacks it
            union.setdefault("", (path, set()))[1].update(names)
            continue
        missing = [c for c in columns if c not in names]
        if missing:
            raise SchemaError(f"{path}: no column {missing[0]!r} (columns: {', '.join(names) or 'none'})")
    for fmt, (path, names) in union.items():
        missing = [c for c in columns if c not in names]
        if missing and not fmt:
            raise SchemaError(
                f"{path}: no column {missing[0]!r} (columns: {', '.join(sorted(names))}), nor has any other file"
            )
        if missing:
            raise SchemaError(
                f"no {fmt} file has a field {missing[0]!r} ({path} and the others have: {', '.join(sorted(names))})"
            )
