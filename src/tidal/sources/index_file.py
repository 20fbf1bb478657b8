"""The shard index's file: what a scan found about each file, kept between runs.

``.tidal-index.json`` in the dataset's root directory when it is writable, else a file under
the user cache dir (remote datasets: under the shard cache). Version 2, written here, holds one
list per field in the order of ``"files"`` (paths relative to the root), and ``"schemas"``: each
distinct file schema a scan recorded (``info["types"]``: Parquet's, Arrow's) once, the entries
naming theirs by its place in that list, so that a million files of a few schemas cost a few
schemas; version 1, one object per file, is still read, from old indexes and from indexes
published beside remote data. An
index is only a hint: one that does not hold together reads as empty, an entry that does not is
scanned again, and none can name a file (:mod:`tidal.sources.counting` keeps only the files it listed).
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
from orjson import loads  # an index of a million shards is 150 MB of JSON: several times faster than json

from tidal import env
from tidal.errors import StorageError
from tidal.formats import counts_hold_from, formats, scan_version
from tidal.storage.disk import mkdirs

INDEX_NAME = ".tidal-index.json"
VERSION = 2


def index_path(root: str) -> Path:
    local = Path(root) / INDEX_NAME
    if os.access(root, os.W_OK) and (not local.exists() or os.access(local, os.W_OK)):
        return local
    digest = hashlib.sha1(root.encode()).hexdigest()[:16]
    return env.cache_dir() / "index" / f"{digest}.json"


class locked:
    """An exclusive lock of an index file; the kernel drops it when its process dies. Its file is
    beside an index in tidal's own directories, and in tidal's cache directory for one in a
    dataset's directory, which is left as it was but for the index itself."""

    def __init__(self, where: Path):
        if where.name == INDEX_NAME:
            digest = hashlib.sha1(str(where.resolve()).encode()).hexdigest()[:20]
            self._path = env.cache_dir() / "locks" / f"{digest}.lock"
        else:
            self._path = where.with_name(where.name + ".lock")

    def __enter__(self) -> None:
        mkdirs(self._path.parent)  # never world-writable, whatever the umask
        self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self._fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        os.close(self._fd)


def index_json(entries: dict[str, dict]) -> bytes:
    """An index holding ``entries`` (file key to its facts), as :func:`index` writes one: for
    tools that publish an index beside data they wrote."""
    table = Entries()
    for key, entry in entries.items():
        table.put(key, entry)
    return table.to_json()


def load(where: Path) -> Entries:
    try:
        data = loads(where.read_bytes())
    except (OSError, ValueError):
        return Entries()
    return Entries.parse(data)


def save(where: Path, entries: Entries, data: bytes | None = None) -> None:
    tmp = where.with_name(f"{where.name}.{os.getpid()}.tmp")
    data = entries.to_json() if data is None else data
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.fchmod(fd, 0o644)  # never world-writable, whatever the umask
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, where)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise StorageError(f"cannot write the shard index {where}: {exc}") from exc


_FIELDS = ("bytes", "mtime_ns", "version", "format", "compression", "rows", "info", "hash", "error", "scanner", "scan")
_STORED = {"version": "file_version"}  # a field's name in the file, where another name is taken


class Entries:
    """An index's entries, one per file key, kept as they are stored: one list per field.

    Written as ``{"version": 2, "files": [keys], "rows": [...], ...}``, a million entries load
    in a fraction of a second, where as one JSON object each (version 1, still read) they took
    seconds. An index is only ever a hint: one that is damaged or of another version reads as
    empty, and an entry that does not hold together is scanned again, never trusted.
    """

    def __init__(self, keys: list[str] | None = None, columns: dict[str, list] | None = None):
        self.keys = keys if keys is not None else []
        self.columns = columns if columns is not None else {f: [] for f in _FIELDS}
        self.at = {k: i for i, k in enumerate(self.keys)}

    @classmethod
    def parse(cls, data: Any) -> Entries:
        if not isinstance(data, dict):
            return cls()
        if data.get("version") == 1 and isinstance(data.get("shards"), dict):
            entries = cls()
            for key, entry in data["shards"].items():
                if isinstance(entry, dict):
                    entries.put(key, entry)
            return entries
        keys = data.get("files")
        if data.get("version") != VERSION or not isinstance(keys, list):
            return cls()
        n = len(keys)
        columns = {f: data.get(_STORED.get(f, f)) or [None] * n for f in _FIELDS}
        if not all(isinstance(k, str) for k in keys) or len(set(keys)) != n:
            return cls()
        if not all(isinstance(c, list) and len(c) == n for c in columns.values()):
            return cls()
        _named_schemas(columns, data.get("schemas"))
        return cls(keys, columns)

    def get(self, key: str) -> dict | None:
        i = self.at.get(key)
        if i is None:
            return None
        return {f: c[i] for f, c in self.columns.items() if c[i] is not None}

    def put(self, key: str, entry: dict) -> None:
        i = self.at.get(key)
        if i is None:
            i = self.at[key] = len(self.keys)
            self.keys.append(key)
            for c in self.columns.values():
                c.append(None)
        for f, c in self.columns.items():
            c[i] = entry.get(f)

    def put_many(self, keys: list[str], entries: list[dict]) -> None:
        """:meth:`put` of each entry; those of keys not in the index yet added a column at a time."""
        added, facts = [], []
        for key, entry in zip(keys, entries, strict=True):
            if key in self.at:
                self.put(key, entry)
            else:
                added.append(key)
                facts.append(entry)
        self.at.update(zip(added, range(len(self.keys), len(self.keys) + len(added)), strict=True))
        self.keys.extend(added)
        for f, c in self.columns.items():
            c.extend([e.get(f) for e in facts])

    def ints(self, name: str) -> np.ndarray:
        """Column ``name`` as int64, -1 where it holds no integer; one more -1 at the end, what
        position -1 (a file the index does not know) finds."""
        return np.array([v if type(v) is int and v < 1 << 63 else -1 for v in self.columns[name]] + [-1], np.int64)

    def usable(self) -> np.ndarray:
        """Which entries hold together (and one False at the end, for position -1)."""
        c = self.columns
        ok = map(holds_together, c["rows"], c["format"], c["error"], c["info"], c["scanner"], c["scan"])
        return np.fromiter([*ok, False], dtype=bool, count=len(self.keys) + 1)

    def to_json(self, *, complete: bool = False) -> bytes:
        """``complete``: the files are the whole listing of the data (see :mod:`tidal.sources.published`)."""
        out: dict[str, Any] = {"version": VERSION, "files": self.keys}
        if complete:
            out["complete"] = True
        columns = dict(self.columns)
        schemas: dict[str, int] = {}
        if any(isinstance(i, dict) and "types" in i for i in columns["info"]):
            columns["info"] = [_schema_named(i, schemas) for i in columns["info"]]
        out.update((_STORED.get(f, f), c) for f, c in columns.items() if any(v is not None for v in c))
        if schemas:
            out["schemas"] = list(schemas)
        return json.dumps(out, separators=(",", ":")).encode()


def _schema_named(info: Any, schemas: dict[str, int]) -> Any:
    """``info`` as the file keeps it: its schema (``"types"``) as its place in ``schemas``."""
    if not isinstance(info, dict) or not isinstance(info.get("types"), str):
        return info
    return {**info, "types": schemas.setdefault(info["types"], len(schemas))}


def _named_schemas(columns: dict[str, list], schemas: Any) -> None:
    """The entries' schemas put back in place of their places in ``schemas`` (in place); an entry
    whose schema is not there (an index rewritten by an older tidal, which drops the list) has no
    count, so it is scanned again."""
    table = schemas if isinstance(schemas, list) and all(isinstance(t, str) for t in schemas) else []
    table = [sys.intern(t) for t in table]  # the objects fresh scans of the same schemas give (tidal.formats.schemas)
    infos, rows = columns["info"], columns["rows"]
    for i, info in enumerate(infos):
        if isinstance(info, dict) and "types" in info:
            at = info["types"]
            if type(at) is int and 0 <= at < len(table):
                info["types"] = table[at]
            elif not isinstance(at, str):  # a schema written out in full is taken as it is
                rows[i] = None


@functools.cache
def scanner() -> str:
    """What an entry's ``"scanner"`` says of an error this tidal found: the tidal, the code of its
    readers and the pyarrow that found it. An error found by other code (another release, another
    build of the same version, another pyarrow; or an index that does not say) is scanned again,
    since the fix may be in it; what a scan counted is kept while its format's scan version holds
    (:func:`holds_together`)."""
    import pyarrow

    import tidal.formats as formats
    from tidal.version import __version__

    code = hashlib.sha1()
    where = Path(formats.__file__).parent
    for path in sorted(where.glob("*.py")):
        code.update(path.name.encode() + b"\0" + path.read_bytes())
    return f"tidal {__version__} (readers {code.hexdigest()[:12]}, pyarrow {pyarrow.__version__})"


def holds_together(
    rows: Any,
    format: Any,
    error: Any,
    info: Any,
    found_by: Any = None,
    scan: Any = None,
    *,
    older: bool = False,
) -> bool:
    """Whether an entry's facts can be trusted as what a scan found (else the file is scanned
    again): an error found by this very code (``found_by``, see :func:`scanner`), or a count made
    by the scan of its format this tidal makes (``scan``: its version, absent for 1). ``older``:
    also a count of an older scan whose counts still hold (:func:`tidal.formats.counts_hold_from`):
    an index published beside remote data, which a job takes rather than a request per file."""
    if error is not None:
        return isinstance(error, str) and found_by == scanner()
    if not (type(rows) is int and rows >= 0 and format in _KNOWN and (info is None or isinstance(info, dict))):
        return False
    version = 1 if scan is None else scan
    if scan is not None and type(scan) is not int:
        return False
    if older:
        return counts_hold_from(format) <= version <= scan_version(format)
    return version == scan_version(format)


_KNOWN = frozenset(formats())
