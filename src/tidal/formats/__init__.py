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

**Directories that list their files** (:mod:`tidal.formats.ordered`): a LitData
directory (``index.json``'s ``chunks``) and a ``datasets`` ``save_to_disk`` directory
(``state.json``, :mod:`tidal.formats.hf_saved`) name their files in the order their writer
wrote them, which sorting names does not give (``chunk-0-10.bin`` sorts before
``chunk-0-2.bin``): such a directory gives those files, in that order, and not its JSON files,
whether it is named itself or found in a directory searched whole, here or in a store.

``format=`` overrides all of this. Nothing is read to detect a format, so detection is the
same for a local file and a remote one; only ``exists`` differs (a listing can answer it).

**Schemas**: the records of a column have one type over a dataset, or it is a SchemaError
naming the column and files. A scan of a format whose files carry an Arrow schema
(``ARROW_SCHEMA``: Parquet, Arrow) records it (``info["types"]``), and
:func:`~tidal.formats.agreement.agree` decides the
dataset's types when it is opened (:mod:`tidal.formats.schemas`: promotion, the readers cast the
files that differ); token files (``TOKEN_DTYPE``) agree on one dtype; CSV agrees its own
(``agree`` of its module). A scan that records ``columns`` (name to encoding: MDS, LitData,
CSV) is checked by :func:`~tidal.formats.agreement.check_schemas`: one encoding per column (``COLUMNS_OPTIONAL``: a
column some files lack is None in theirs), else the same columns in every file. A module that
knows its records' columns from the scan has ``columns(info) -> list[str] | None``;
:func:`~tidal.formats.agreement.check_columns` refuses a ``columns=`` name no file has (or, where every file must have
every column, a file does not have) before anything is read.

**Bad data** is handled in one way by every module: a reader builds the
:class:`~tidal.errors.RecordError` (or :class:`~tidal.errors.FormatError` for a part of a
file: a row group, a segment) that names the file and the row, line or byte, and hands it
to :func:`~tidal.formats.bad_data.bad` with its ``errors`` policy, which raises it or returns, and then the reader
marks the rows skipped in ``Piece.valid``. No exception of a dependency leaves a module
raw; :func:`~tidal.formats.bad_data.data_errors` lists those that mean "these bytes are not what they should be",
which the index scan and the source stage turn into a FormatError naming the file if a
module let one through.

**Options** (``open(..., options=)``) are the few switches a user may flip, one flat dict
checked against ``OPTIONS`` (an unknown key is an error, never ignored): see each format.

Adding a format is one module and one line in ``_MODULES`` and ``_ENDINGS``.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import IO, Any, Literal, Protocol

import numpy as np

from tidal.errors import FormatError, TidalError
from tidal.tables import Table

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
