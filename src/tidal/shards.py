"""Shards and their index: which files a dataset has, and how many records each holds.

Counting records means reading every line of a JSON or text file, so the counts are kept in
an index built once and reused: ``.tidal-index.json`` in the dataset's root directory when
it is writable, else a file under the user cache dir. An entry is reused while the file's
size and modification time are unchanged, so adding shards re-scans only the new ones. The
index only ever adds facts to files found by listing; it never supplies a path, so nothing
in it can point outside the dataset.
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import json
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from tidal.errors import FormatError, SourceError, TidalError
from tidal.formats import Errors, detect, known_ending, module

INDEX_NAME = ".tidal-index.json"
_INDEX_VERSION = 1


@dataclass(frozen=True)
class Shard:
    """One file of a dataset: where it is, how it is read, how many records it holds."""

    path: str
    rows: int
    bytes: int
    format: str
    compression: str | None = None
    info: dict = field(default_factory=dict, compare=False, hash=False, repr=False)


def cache_dir() -> Path:
    """tidal's cache directory: ``$TIDAL_CACHE_DIR``, else ``$XDG_CACHE_HOME/tidal``, else ``~/.cache/tidal``."""
    if "TIDAL_CACHE_DIR" in os.environ:
        return Path(os.environ["TIDAL_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tidal"


def resolve(src: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str]:
    """The files a source names, in a stable order: each entry's files sorted, entries in the order given."""
    entries = [src] if isinstance(src, (str, os.PathLike)) else list(src)
    if not entries:
        raise SourceError("no source given: pass a file, directory, glob or a list of them")
    files: list[str] = []
    for entry in entries:
        path = os.path.abspath(os.path.expanduser(os.fspath(entry)))
        if glob.has_magic(path):
            found = sorted(p for p in glob.glob(path, recursive=True) if os.path.isfile(p))  # glob skips dot files
            if not found:
                raise SourceError(f"{entry}: the pattern matches no file")
        elif os.path.isdir(path):
            found = []
            for d, dirs, names in os.walk(path):
                dirs[:] = [x for x in dirs if not x.startswith(".")]
                found += [os.path.join(d, f) for f in names if not f.startswith((".", "_")) and known_ending(f)]
            found.sort()
            if not found:
                raise SourceError(f"{entry}: the directory holds no file tidal can read")
        elif os.path.isfile(path):
            found = [path]
        else:
            raise SourceError(f"{entry}: no such file or directory")
        files.extend(found)
    if len(set(files)) != len(files):
        dup = next(f for f in files if files.count(f) > 1)
        raise SourceError(f"{dup} is named twice in the source")
    return files


def index(files: list[str], format: str | None = None, errors: Errors = "raise") -> list[Shard]:
    """The shards of ``files``, from the cached index where it is still valid."""
    root = os.path.commonpath([os.path.dirname(f) for f in files])
    where = _index_path(root)
    stats = {f: os.stat(f) for f in files}
    with _locked(where):
        entries = _load(where)
        todo = [f for f in files if not _fresh(entries.get(_key(f, root, format)), stats[f])]
        if todo:
            with ThreadPoolExecutor(min(16, len(todo))) as pool:
                for f, entry in zip(todo, pool.map(lambda f: _scan(f, format, stats[f]), todo), strict=True):
                    entries[_key(f, root, format)] = entry
            _save(where, entries)
    shards = []
    for f in files:
        e = entries[_key(f, root, format)]
        if "error" in e:
            if errors == "raise":
                raise FormatError(e["error"])
            e = {**e, "rows": 0}
        shards.append(Shard(f, e["rows"], e["bytes"], e["format"], e.get("compression"), e.get("info", {})))
    return shards


def _key(path: str, root: str, format: str | None) -> str:
    rel = path[len(root) :].lstrip(os.sep)  # ``root`` is a prefix of every path: cheaper than relpath
    return rel if format is None else f"{rel}#{format}"


def _fresh(entry: dict | None, st: os.stat_result) -> bool:
    return entry is not None and entry["bytes"] == st.st_size and entry["mtime_ns"] == st.st_mtime_ns


def _scan(path: str, format: str | None, st: os.stat_result) -> dict:
    entry: dict = {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns}
    try:
        name, compression = detect(path, format)
        entry.update(format=name, compression=compression)
        info = module(name).scan(path, compression)
    except FormatError as exc:
        return {**entry, "format": format or "?", "error": str(exc)}
    except (OSError, EOFError, ValueError) as exc:  # truncated gzip, bad zstd frame, ...
        return {**entry, "format": format or "?", "error": f"{path}: unreadable: {exc}"}
    entry["rows"] = info.pop("rows")
    if info:
        entry["info"] = info
    return entry


def _index_path(root: str) -> Path:
    local = Path(root) / INDEX_NAME
    if os.access(root, os.W_OK) and (not local.exists() or os.access(local, os.W_OK)):
        return local
    digest = hashlib.sha1(root.encode()).hexdigest()[:16]
    return cache_dir() / "index" / f"{digest}.json"


class _locked:
    """An exclusive lock beside the index; the kernel drops it when its process dies."""

    def __init__(self, where: Path):
        self._path = where.with_name(where.name + ".lock")

    def __enter__(self) -> None:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self._fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        os.close(self._fd)


def _load(where: Path) -> dict:
    try:
        data = json.loads(where.read_text())
    except (OSError, ValueError):
        return {}
    return data.get("shards", {}) if data.get("version") == _INDEX_VERSION else {}


def _save(where: Path, entries: dict) -> None:
    tmp = where.with_name(f"{where.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps({"version": _INDEX_VERSION, "shards": entries}, separators=(",", ":")))
        os.replace(tmp, where)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise TidalError(f"cannot write the shard index {where}: {exc}") from exc
