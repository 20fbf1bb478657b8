"""File formats behind one interface, found from the files themselves through a lazy registry.

A format module has a ``NAME`` and two functions:

- ``scan(path, compression, file=None) -> dict``: what the index keeps about one file:
  ``rows`` and whatever the format needs to open the file at a row later (row groups, line
  offsets, sample offsets).
- ``open(path, compression, info, columns, errors, options=None) -> Reader``: a reader whose
  ``read(start, stop)`` returns the records of rows ``[start, stop)`` as a :class:`Piece`.

``path`` names the file in messages; the bytes come from ``file`` (scan) or
:func:`source` (open): a local path, the shard cache's copy of a remote file, or for
Parquet an opener that reads the remote file by ranges. A format that reads its bytes this
way works on every source tidal can list.

**Detection** (:func:`detect`) is by file ending, plus two rules for what an ending alone
cannot tell:

- an ending several formats use (``.bin``: Megatron-LM, LitData, flat tokens) lists, in
  ``_CLAIMS``, the formats that may claim the file first; each such module has
  ``claims(path, exists) -> bool``, which looks only at the file's name and whether sibling
  files exist (a Megatron ``.bin`` has its ``.idx``; a LitData chunk ``chunk-*.bin`` has the
  ``index.json`` of its directory). The file goes to the first that claims it, else to the
  ending's own format.
- ``index.json`` is the manifest of an MDS, LitData or tidal token directory, never a
  shard: a directory listing leaves it out (a format that needs its facts reads them when
  it scans a shard), and naming it alone is an error that says to pass its directory (or
  ``format="jsonl"``).

**Directories that list their files** (:func:`in_order`, :func:`listed_in_order`): a LitData
directory (``index.json``'s ``chunks``) and a ``datasets`` ``save_to_disk`` directory
(``state.json``, :mod:`tidal.formats.hf_saved`) name their files in the order their writer
wrote them, which sorting names does not give (``chunk-0-10.bin`` sorts before
``chunk-0-2.bin``): such a directory gives those files, in that order, and not its JSON files,
whether it is named itself or found in a directory searched whole, here or in a store.

``format=`` overrides all of this. Nothing is read to detect a format, so detection is the
same for a local file and a remote one; only ``exists`` differs (a listing can answer it).

**Schemas**: the records of a column have one type over a dataset, or it is a SchemaError
naming the column and files. A scan of a format whose files carry an Arrow schema
(``ARROW_SCHEMA``: Parquet, Arrow) records it (``info["types"]``), and :func:`agree` decides the
dataset's types when it is opened (:mod:`tidal.formats.schemas`: promotion, the readers cast the
files that differ); token files (``TOKEN_DTYPE``) agree on one dtype; CSV agrees its own
(``agree`` of its module). A scan that records ``columns`` (name to encoding: MDS, LitData,
CSV) is checked by :func:`check_schemas`: one encoding per column (``COLUMNS_OPTIONAL``: a
column some files lack is None in theirs), else the same columns in every file. A module that
knows its records' columns from the scan has ``columns(info) -> list[str] | None``;
:func:`check_columns` refuses a ``columns=`` name no file has (or, where every file must have
every column, a file does not have) before anything is read.

**Bad data** is handled in one way by every module: a reader builds the
:class:`~tidal.errors.RecordError` (or :class:`~tidal.errors.FormatError` for a part of a
file: a row group, a segment) that names the file and the row, line or byte, and hands it
to :func:`bad` with its ``errors`` policy, which raises it or returns, and then the reader
marks the rows skipped in ``Piece.valid``. No exception of a dependency leaves a module
raw; :data:`data_errors` lists those that mean "these bytes are not what they should be",
which the index scan and the source stage turn into a FormatError naming the file if a
module let one through.

**Options** (``open(..., options=)``) are the few switches a user may flip, one flat dict
checked against ``OPTIONS`` (an unknown key is an error, never ignored): see each format.

Adding a format is one module and one line in ``_MODULES`` and ``_ENDINGS``.
"""

from __future__ import annotations

import errno
import functools
import importlib
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import IO, Any, Literal, Protocol

import numpy as np

from tidal.errors import ArgumentError, FormatError, SchemaError, TidalError
from tidal.tables import Table, clash

Errors = Literal["raise", "skip"] | Callable[[TidalError], object]
"""The bad-data policy: raise, skip (and count), or a function that is given each error and
returns to skip it or raises to stop (see :class:`tidal.Dataset`)."""

Options = Mapping[str, Any]

_MODULES = {
    "arrow": "tidal.formats.arrow",
    "csv": "tidal.formats.csv",
    "flat": "tidal.formats.flat",
    "jsonl": "tidal.formats.jsonl",
    "litdata": "tidal.formats.litdata",
    "mds": "tidal.formats.mds",
    "megatron": "tidal.formats.megatron",
    "memory": "tidal.formats.memory",  # in-memory Arrow tables (a datasets.Dataset without files)
    "parquet": "tidal.formats.parquet",
    "text": "tidal.formats.text",
    "tokens": "tidal.formats.tokens",
    "webdataset": "tidal.formats.webdataset",
}
_ENDINGS = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".txt": "text",
    ".text": "text",
    ".tokens": "tokens",
    ".csv": "csv",
    ".arrow": "arrow",
    ".arrows": "arrow",
    ".feather": "arrow",
    ".ipc": "arrow",
    ".tar": "webdataset",
    ".mds": "mds",
    ".tsv": "csv",
    ".npy": "flat",
    ".bin": "flat",
}
# The version of each format's scan, where it is not 1: bumped when what a scan records changes
# (a new fact, another type), so that index entries an older scan made are scanned again.
_SCANS = {
    "csv": 2,  # 2: one type per column over the dataset's files, leading zeros kept as text
    "parquet": 2,  # 2: each file's column types (schema drift: tidal.formats.schemas)
    "arrow": 2,  # 2: each file's column types, as Parquet's
    "litdata": 2,  # 2: each column's type (a pytree leaf's serializer, an Arrow footer's type)
}
# The oldest scan of a format whose counts still hold where scanning again costs requests (an
# index published beside remote data, read by a job): its newer scans only added facts (the
# column types: unknown for such files, joined block by block, see tidal.formats.schemas).
_COUNTS_HOLD_FROM = {"parquet": 1, "arrow": 1, "litdata": 1}
# Endings that several formats use: who may claim a file before the ending's own format.
_CLAIMS = {".bin": ("megatron", "litdata")}
_MANIFEST = "index.json"  # MDS, LitData and tidal token directories describe their shards in it
_PLAIN = frozenset(e for e in _ENDINGS if e not in _CLAIMS)  # endings that name a format on their own
_COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd", ".bz2": "bz2", ".br": "brotli", ".snappy": "snappy"}

# Every option a format reads, and which formats read it (see each module's docstring).
OPTIONS = {
    "allow_pickle": ("mds", "litdata"),  # unpickle `pkl`/`pickle` columns: runs code from the data
    "column_types": ("csv", "parquet", "arrow"),  # {"zip": "string"}: a column's type, declared (pyarrow's type names)
    "decode_images": ("mds",),  # jpeg/png/pil columns as PIL images instead of their bytes
    "dtype": ("flat",),  # the token type of a headerless .bin (default uint16, as nanoGPT writes)
}


@dataclass
class Piece:
    """Rows ``[start, stop)`` of one file. ``valid`` marks the rows that were kept when
    ``errors="skip"`` dropped bad ones (``None``: all kept); ``table`` holds only kept rows.
    ``absent``: of the columns asked for, those no record of the piece has (formats with no
    schema fill them with None), each with where it was first missed: a column no record of a
    block has is taken for a mistake (:mod:`tidal.stages.read`)."""

    table: Table
    valid: np.ndarray | None = None
    absent: dict[str, str] = field(default_factory=dict)


class Reader(Protocol):
    def read(self, start: int, stop: int) -> Piece: ...

    def close(self) -> None: ...


# Directories whose own manifest names their files in order: a module's ``files(dir)`` gives
# ``(paths in order, default columns or None)``, or None for a directory that is not one of them.
_ORDERED_DIRECTORIES = ("tidal.formats.hf_saved", "tidal.formats.litdata")


def in_order(src: Any, columns: Sequence[str] | None) -> tuple[Any, Sequence[str] | None]:
    """``(src, columns)`` with each local directory whose manifest names its files in order (a
    ``datasets`` ``save_to_disk`` directory, a LitData directory) replaced by those files, in
    that order; anything else as it is. ``columns`` is the directory's default where it has one
    and the caller named none (``src`` is that one directory)."""
    if isinstance(src, (str, os.PathLike)):
        found = _ordered(src)
        if found is None:
            return src, columns
        return found[0], columns if columns is not None else found[1]
    if isinstance(src, (list, tuple)):
        out: list[Any] = []
        for entry in src:
            found = _ordered(entry) if isinstance(entry, (str, os.PathLike)) else None
            out.extend(found[0] if found is not None else [entry])
        return out, columns
    return src, columns


def _ordered(path: str | os.PathLike) -> tuple[list[str], list[str] | None] | None:
    name = os.fspath(path)
    if "://" in name or known_ending(os.path.basename(name.rstrip("/")), exists=_nothing) or not os.path.isdir(name):
        return None  # a file's name: no stat (a list of a million files is given at times)
    for where in _ORDERED_DIRECTORIES:
        found = importlib.import_module(where).files(name)
        if found is not None:
            return found
    return None


_MAY_LIST = ("/chunk-", "/state.json\0", "/dataset_dict.json\0")  # LitData's, save_to_disk's files


def listed_in_order(found: Mapping[str, Any], read: Callable[[str], bytes | None]) -> dict[str, Any]:
    """A directory's listing (``found``: sorted paths or URLs, each with what the listing said of
    it), searched whole, as :func:`in_order` makes a directory that lists its files: every
    directory in it, at any depth, that lists its files in order in a manifest
    (``save_to_disk``'s ``state.json``, LitData's ``index.json``: ``read(path)``, None where
    there is none) gives those files in that order, where its first file sorts, and not the
    manifest's other files (``state.json``, ``dataset_info.json``); the rest is as it is. So a
    directory holding several saved datasets or LitData directories reads each as it reads on
    its own, here or in a store. A ``DatasetDict`` in it is a SourceError naming its splits."""
    joined = "\0".join(found) + "\0"
    if not any(mark in joined for mark in _MAY_LIST) and not ("/data-" in joined and ".arrow\0" in joined):
        return dict(found)  # the common case at once: a listing may hold a million files
    dirs: dict[str, set[str]] = {}
    for path in found:
        d, _, name = path.rpartition("/")
        dirs.setdefault(d, set()).add(name)
    ordered: dict[str, list[str]] = {}
    for d, names in dirs.items():
        for where in _ORDERED_DIRECTORIES:
            got = importlib.import_module(where).listed(d, names, read)
            if got is not None:
                ordered[d] = got[0]
                break
    if not ordered:
        return dict(found)
    out: dict[str, Any] = {}
    for path in found:
        d = path.rpartition("/")[0]
        files = ordered.get(d)
        if files is None:
            out[path] = found[path]
        elif files[0] not in out:  # the directory's first file: all of them, in their order
            out.update((f, found[f]) for f in files)
    return out


def _nothing(path: str) -> bool:
    return False


def scan_version(name: str) -> int:
    """The version of format ``name``'s scan: an index entry made by another is scanned again."""
    return _SCANS.get(name, 1)


def counts_hold_from(name: str) -> int:
    """The oldest version of format ``name``'s scan whose entries a job still takes from an index
    published beside remote data (their counts hold; what newer scans added is found as the
    files are read), rather than a request per file to scan them again."""
    return _COUNTS_HOLD_FROM.get(name, scan_version(name))


def formats() -> list[str]:
    """The names ``Dataset(format=...)`` accepts."""
    return sorted(_MODULES)


def known_ending(path: str, exists: Callable[[str], bool] | None = None) -> bool:
    """Whether a directory listing should keep ``path`` (its full path: siblings can decide)."""
    last = path[path.rfind(".") :].lower()
    if last in _PLAIN and (last != ".json" or os.path.basename(path).lower() != _MANIFEST):
        return True  # the common case at once: a listing may hold a million files
    try:
        detect(path, exists=exists)
    except FormatError:
        return False
    return True


def by_ending(path: str) -> str | None:
    """The format a path's ending names (after a compression ending), siblings not asked: the
    kind of file it is, as people name files (``.bin``: ``"flat"``); None for an unknown ending.

    >>> by_ending("web/README.txt.gz"), by_ending("chunk-0-1.bin")
    ('text', 'flat')
    """
    stem = path.lower()
    for ending in _COMPRESSIONS:
        if stem.endswith(ending):
            stem = stem[: -len(ending)]
            break
    return _ENDINGS.get(os.path.splitext(stem)[1])


def detect(path: str, name: str | None = None, exists: Callable[[str], bool] | None = None) -> tuple[str, str | None]:
    """``(format name, compression or None)`` for a path; ``name`` (``format=``) overrides.

    ``exists`` tells whether a sibling path exists; by default the local file system for a
    local path. For a URL without it, an ending that sibling files decide (``.bin``) is an
    error asking for ``format=`` rather than a guess.
    """
    stem, compression = path.lower(), None
    last = os.path.splitext(stem)[1]
    if name is None and last in _ENDINGS and last not in _CLAIMS and os.path.basename(stem) != _MANIFEST:
        return _ENDINGS[last], None  # the common case at once: a listing may hold a million files
    for ending, comp in _COMPRESSIONS.items():
        if stem.endswith(ending):
            stem, compression = stem[: -len(ending)], comp
            break
    if name is not None:
        if name not in _MODULES:
            raise FormatError(f"unknown format {name!r}; known: {', '.join(formats())}")
        return name, compression
    if os.path.basename(stem) == _MANIFEST:
        raise FormatError(
            f"{path}: the index.json of an MDS, LitData or tidal token directory describes its shards and "
            "holds no records: pass the directory (or format='jsonl' if it really is JSON lines)"
        )
    ending = os.path.splitext(stem)[1]
    fmt = _ENDINGS.get(ending)
    if fmt is None:
        raise FormatError(f"{path}: no reader for this file ending; pass format= (one of {', '.join(formats())})")
    claimants = _CLAIMS.get(ending, ())
    if claimants:
        if exists is None:
            if "://" in path:
                raise FormatError(f"{path}: a remote {ending} file is read as one of several formats; pass format=")
            exists = os.path.exists
        for other in claimants:
            if module(other).claims(path, exists):
                return other, compression
    return fmt, compression


@dataclass(frozen=True)
class Located:
    """Where a shard's bytes are in this process: a remote shard's copy in the shard cache, or a
    function that opens it for ranged reads. The reading stage puts it in ``info["file"]`` when
    it opens a reader; an index is JSON and cannot hold one, so an index never redirects a read.
    ``beside``: the local copy of the file a format reads beside a remote shard (a Megatron
    ``.idx``), where its module names one (``beside(path)``)."""

    file: str | Callable[[], Any]
    beside: str | None = None


def source(path: str, info: Mapping[str, Any]) -> str | IO[bytes] | Callable[[], IO[bytes]]:
    """Where a reader takes a file's bytes from: the one place that decides it, for every format."""
    where = info.get("file")
    return where.file if isinstance(where, Located) else path


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


def check_errors(errors: Any) -> Errors:
    """``errors`` if it is a policy: ``"raise"``, ``"skip"`` or a callable."""
    if errors in ("raise", "skip") or callable(errors):
        return errors
    raise ArgumentError(f"errors must be 'raise', 'skip' or a function, not {errors!r}")


def bad(errors: Errors, error: TidalError) -> None:
    """Apply the policy to one bad record or part of a file: raise ``error``, or return so
    the caller skips what it names."""
    if errors == "skip":
        return
    if errors == "raise" or not callable(errors):
        raise error
    errors(error)


@functools.cache
def _data_errors() -> tuple[type[Exception], ...]:
    import decimal
    import pickle
    import struct
    import tarfile
    import tokenize
    import zlib

    import pyarrow as pa
    import zstandard

    return (
        OSError,
        EOFError,
        ValueError,  # also UnicodeDecodeError, orjson's JSONDecodeError, pyarrow's ArrowInvalid
        LookupError,  # KeyError, IndexError: a header or config that does not hold what it must
        TypeError,
        OverflowError,
        zlib.error,
        struct.error,
        tarfile.TarError,
        pickle.UnpicklingError,
        decimal.InvalidOperation,
        pa.ArrowException,
        zstandard.ZstdError,
        SyntaxError,  # numpy parses a .npy header with ast (and tokenize, for old headers)
        tokenize.TokenError,
    )


def data_errors() -> tuple[type[Exception], ...]:
    """The exceptions of Python and the dependencies that bad bytes cause (import is lazy)."""
    return _data_errors()


_EXHAUSTED = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOSPC, errno.EDQUOT}
_EXHAUSTED_TEXT = re.compile(r"[Ee]rrno ({})\b".format("|".join(str(n) for n in sorted(_EXHAUSTED))))


def exhausted(exc: BaseException) -> str | None:
    """What the machine ran out of, where ``exc`` (or what caused it) says it did: file
    descriptors, memory or disk. Such an error is never the data's fault, so it is never
    skipped as bad data nor remembered in the index (a reader or a library may have wrapped
    it, keeping only ``[Errno 24]`` in its message)."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, MemoryError):
            return "memory"
        number = e.errno if isinstance(e, OSError) else None
        if number is None:
            found = _EXHAUSTED_TEXT.search(str(e))
            number = int(found.group(1)) if found else None
        if number in _EXHAUSTED:
            return {errno.EMFILE: "file descriptors (ulimit -n)", errno.ENFILE: "file descriptors"}.get(
                number, "memory" if number == errno.ENOMEM else "disk space"
            )
        e = e.__cause__ or e.__context__
    return None


def check_options(name: str, options: Options | None) -> Options:
    """``options`` with every key known (an unknown one is a typo, not a no-op)."""
    options = options or {}
    unknown = sorted(k for k in options if k not in OPTIONS)
    if unknown:
        raise FormatError(f"unknown format option {unknown[0]!r}; known: {', '.join(sorted(OPTIONS))}")
    if options.get("column_types") is not None:  # type names checked now, not at the first read
        options = {**options, "column_types": module("csv").check_column_types(options["column_types"])}
    return options


def module(name: str) -> ModuleType:
    return importlib.import_module(_MODULES[name])


def parsed_per_batch(formats: Sequence[str]) -> bool:
    """Whether the source stage holds blocks of these formats unparsed and parses each batch as
    it is cut: where every one of them says ``PARSED_PER_BATCH`` (JSON lines)."""
    return bool(formats) and all(getattr(module(name), "PARSED_PER_BATCH", False) for name in set(formats))


def threaded(formats: Iterable[str]) -> bool:
    """Whether every one of these formats decodes with the GIL released (its module says
    ``DECODES_WITHOUT_GIL``): only then do threads reading several files at once add cores."""
    return all(getattr(module(name), "DECODES_WITHOUT_GIL", False) for name in set(formats))
