"""Shards and their index: how many records each file of a dataset holds (the files come from
:mod:`tidal.listing`).

Counting records means reading every line of a JSON or text file, so the counts are kept in
an index built once and reused: ``.tidal-index.json`` in the dataset's root directory when
it is writable, else a file under the user cache dir. An entry is reused while the file's
size and modification time are unchanged, so adding shards re-scans only the new ones. The
index only ever adds facts to files found by listing; it never supplies a path, so nothing
in it can point outside the dataset.

Remote datasets (any fsspec URL) are listed through :mod:`tidal.storage`. Their index lives
in the shard cache directory, keyed by the dataset's root URL, and an entry is reused while
the object's size and ETag (or modification time) are unchanged. A ``.tidal-index.json``
published at the root URL seeds it. Line files are counted from a copy fetched into the
shard cache, which also gives their SHA-256 for the index; large Parquet files need only
their footer, read by a range request.

A file whose scan fails (truncated, corrupt, not of its format) is an entry with an
``"error"``: under ``errors="raise"`` building the dataset raises it; under ``"skip"`` (or
a function that returns) the file counts 0 records, is logged (logger ``tidal``, under
``"skip"``) and keeps its error on its :class:`Shard`, where ``stats()`` and ``tidal
inspect`` find it. The index never counts records that cannot be read back. A dataset none
of whose files can be read is an error under every policy.
"""

from __future__ import annotations

import fcntl
import hashlib
import inspect
import json
import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tidal import env
from tidal.errors import FormatError, SourceError, StorageError, TidalError
from tidal.formats import Errors, bad, check_schemas, data_errors, detect, module
from tidal.storage.cache import mkdirs
from tidal.storage.config import Storage
from tidal.storage.fs import FileStat, Remote
from tidal.storage.retry import redact_urls
from tidal.storage.urls import protocol, url_root

INDEX_NAME = ".tidal-index.json"
_INDEX_VERSION = 1

log = logging.getLogger("tidal")


@dataclass(frozen=True)
class Shard:
    """One file of a dataset: where it is, how it is read, how many records it holds."""

    path: str
    rows: int
    bytes: int
    format: str
    compression: str | None = None
    info: dict = field(default_factory=dict, compare=False, hash=False, repr=False)
    version: str | None = field(default=None, compare=False, repr=False)  # a remote file's ETag or mtime
    hash: str | None = field(default=None, compare=False, repr=False)  # "sha256:<hex>": checked on download
    error: str | None = field(default=None, compare=False, repr=False)  # why its scan failed (then rows == 0)


def index(
    files: list[str],
    format: str | None = None,
    errors: Errors = "raise",
    storage: Storage | None = None,
    stats: dict[str, FileStat | None] | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[Shard]:
    """The shards of ``files``, from the cached index where it is still valid.

    Remote files (URLs) are indexed with ``storage``; ``stats`` may carry what their listing
    said (size, version), which spares a request per file. ``progress`` is called with the
    number of files done as they are (the files the index already knows at once): for a
    progress bar.
    """
    done = progress or _nothing
    groups: dict[str | None, list[str]] = {}
    for f in files:
        groups.setdefault(protocol(f), []).append(f)
    if list(groups) == [None]:
        return _index_local(files, format, errors, done)
    found: dict[str, Shard] = {}
    for proto, group in groups.items():
        if proto is None:
            shards = _index_local(group, format, errors, done)
        else:
            settings = (storage or Storage()).for_files(group)
            shards = _index_remote(group, format, errors, settings, stats or {}, done)
        found.update((s.path, s) for s in shards)
    return [found[f] for f in files]


def _nothing(done: int) -> None:
    pass


def _index_local(files: list[str], format: str | None, errors: Errors, progress: Callable[[int], None]) -> list[Shard]:
    root = os.path.commonpath(list({os.path.dirname(f) for f in files}))
    where = _index_path(root)
    stats = {f: os.stat(f) for f in files}
    keys = {f: _key(f, root, format) for f in files}
    with _locked(where):
        entries = _load(where)
        todo = [f for f in files if not _fresh(entries.get(keys[f]), stats[f])]
        progress(len(files) - len(todo))
        if todo:
            with ThreadPoolExecutor(min(16, len(todo))) as pool:
                for f, entry in zip(todo, pool.map(lambda f: _scan(f, format, stats[f]), todo), strict=True):
                    entries[keys[f]] = entry
                    progress(1)
            _save(where, entries)
    return _shards(files, [entries[keys[f]] for f in files], format, errors)


def _shards(files: list[str], found: list[dict], format: str | None, errors: Errors) -> list[Shard]:
    """``files`` with their index entries ``found``, as shards; files that failed their scan
    handled by the ``errors`` policy."""
    shards = []
    failed: list[str] = []
    for f, e in zip(files, found, strict=True):
        error = e.get("error")
        if error is not None:
            bad(errors, FormatError(error))  # raises, unless the policy skips the file
            if errors == "skip":  # a function is the user's handler: it logs if it wants to
                log.warning("skipping a file that cannot be read (its records are not in the dataset): %s", error)
            failed.append(error)
            e = {**e, "rows": 0}
        info = e.get("info", {})
        shards.append(
            Shard(
                f,
                e["rows"],
                e["bytes"],
                e["format"],
                e.get("compression"),
                info,
                e.get("version"),
                e.get("hash"),
                error,
            )
        )
    if failed and len(failed) == len(files):
        more = f" (and {len(failed) - 1} more files)" if len(failed) > 1 else ""
        hint = f"; is format={format!r} right?" if format is not None else ""
        raise FormatError(f"no file of the dataset can be read: {failed[0]}{more}{hint}")
    check_schemas(shards)
    return shards


def _index_remote(
    urls: list[str],
    format: str | None,
    errors: Errors,
    storage: Storage,
    known: dict[str, FileStat | None],
    progress: Callable[[int], None],
) -> list[Shard]:
    from tidal.storage.fetch import Fetcher

    fetcher = Fetcher(storage, data=False)
    try:
        remote = fetcher.remote(urls[0])
        missing = [u for u in urls if known.get(u) is None]
        with ThreadPoolExecutor(min(16, max(1, len(missing)))) as pool:
            stats: dict[str, FileStat] = {u: s for u, s in known.items() if s is not None}
            stats.update(zip(missing, pool.map(remote.stat, missing), strict=True))
        root = url_root(urls)
        where = storage.root / "index" / f"{hashlib.sha1(root.encode()).hexdigest()[:16]}.json"
        with _locked(where):
            entries = _load(where)
            todo = [u for u in urls if not _fresh_remote(entries.get(_key(u, root, format)), stats[u])]
            if todo:  # a published index may know them
                seed = _published(remote, f"{root}/{INDEX_NAME}")
                for u in todo:
                    e = seed.get(_key(u, root, format))
                    if _fresh_remote(e, stats[u]):
                        entries[_key(u, root, format)] = e
                todo = [u for u in todo if not _fresh_remote(entries.get(_key(u, root, format)), stats[u])]
            progress(len(urls) - len(todo))
            if todo:
                with ThreadPoolExecutor(min(16, len(todo))) as pool:
                    scanned = pool.map(lambda u: _scan_remote(u, format, stats[u], fetcher), todo)
                    for u, entry in zip(todo, scanned, strict=True):
                        entries[_key(u, root, format)] = entry
                        progress(1)
                fetcher.cache.make_room(len(json.dumps(entries)) + 8192)  # the index lives in the cache: count it
                _save(where, entries)
    finally:
        fetcher.close()
    return _shards(urls, [entries[_key(u, root, format)] for u in urls], format, errors)


def _fresh_remote(entry: dict | None, stat: FileStat) -> bool:
    return entry is not None and entry.get("bytes") == stat.size and entry.get("version") == stat.version


def _published(remote: Remote, url: str) -> dict:
    """The entries of an index published beside the data, if there is one."""
    try:
        data = json.loads(bytes(remote.cat(url)))
    except (StorageError, SourceError, ValueError):
        return {}
    shards = data.get("shards") if isinstance(data, dict) and data.get("version") == _INDEX_VERSION else None
    return shards if isinstance(shards, dict) else {}


def _scan_remote(url: str, format: str | None, stat: FileStat, fetcher: Any) -> dict:
    from tidal.storage.cache import Entry
    from tidal.storage.prefetch import RANGE_MIN_BYTES

    entry: dict = {"bytes": stat.size, "version": stat.version}
    try:
        name, compression = detect(url, format)
        entry.update(format=name, compression=compression)
        if name == "parquet" and compression is None and stat.size >= RANGE_MIN_BYTES:
            with fetcher.range_file(url, stat.size) as f:  # the footer is enough
                info = _scan_file(name, url, compression, f)
        else:
            with fetcher.acquire(Entry(url, stat.size, stat.version)) as handle:
                info = _scan_file(name, url, compression, str(handle.path))
                entry["hash"] = handle.digest
    except FormatError as exc:
        return {"format": format or "?", **entry, "error": redact_urls(str(exc))}
    except StorageError:
        raise
    except data_errors() as exc:  # what a format module let through: still named, never raw
        error = f"{url}: unreadable ({type(exc).__name__}): {exc}"
        return {"format": format or "?", **entry, "error": redact_urls(error)}
    entry["rows"] = info.pop("rows")
    if info:
        entry["info"] = info
    return entry


def _scan_file(name: str, url: str, compression: str | None, file: Any) -> dict:
    """``scan`` of a format, given where the bytes are; errors name ``url``."""
    scan = module(name).scan
    if "file" in inspect.signature(scan).parameters:
        return scan(url, compression, file=file)
    if not isinstance(file, str):  # a format that reads local files only
        raise FormatError(f"{url}: the {name} reader cannot read a remote file in place")
    try:
        return scan(file, compression)
    except FormatError as exc:
        raise FormatError(str(exc).replace(file, url)) from None


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
        return {"format": format or "?", **entry, "error": str(exc)}
    except data_errors() as exc:  # what a format module let through: still named, never raw
        return {"format": format or "?", **entry, "error": f"{path}: unreadable ({type(exc).__name__}): {exc}"}
    entry["rows"] = info.pop("rows")
    if info:
        entry["info"] = info
    return entry


def _index_path(root: str) -> Path:
    local = Path(root) / INDEX_NAME
    if os.access(root, os.W_OK) and (not local.exists() or os.access(local, os.W_OK)):
        return local
    digest = hashlib.sha1(root.encode()).hexdigest()[:16]
    return env.cache_dir() / "index" / f"{digest}.json"


try:  # an index of a million shards is 150 MB of JSON: orjson reads it several times faster
    from orjson import loads as _loads
except ImportError:
    _loads = json.loads  # type: ignore[assignment]


class _locked:
    """An exclusive lock beside the index; the kernel drops it when its process dies."""

    def __init__(self, where: Path):
        self._path = where.with_name(where.name + ".lock")

    def __enter__(self) -> None:
        mkdirs(self._path.parent)  # never world-writable, whatever the umask
        self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self._fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        os.close(self._fd)


def _load(where: Path) -> dict:
    try:
        data = _loads(where.read_bytes())
    except (OSError, ValueError):
        return {}
    return data.get("shards", {}) if data.get("version") == _INDEX_VERSION else {}


def _save(where: Path, entries: dict) -> None:
    tmp = where.with_name(f"{where.name}.{os.getpid()}.tmp")
    data = json.dumps({"version": _INDEX_VERSION, "shards": entries}, separators=(",", ":")).encode()
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.fchmod(fd, 0o644)  # never world-writable, whatever the umask
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, where)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise TidalError(f"cannot write the shard index {where}: {exc}") from exc
