"""One file's index entry: its records counted by its format's scan, or the error that stopped it.

A local file is scanned where it is; a remote one from the manifest beside it (MDS's
``index.json``), from its footer by range requests (Parquet), or from a copy fetched into the
shard cache, which also gives its hash. A file whose scan fails is an entry with its
``"error"`` (and the tidal that found it), unless the machine ran out of something, which is
never the file's fault. Apart from :mod:`tidal.sources.counting`, which keeps the entries in
an index, because what one file's entry holds is a concept of its own.
"""

from __future__ import annotations

import inspect
import posixpath
from typing import TYPE_CHECKING, Any

from tidal.errors import FormatError, StorageError
from tidal.formats import detect, module, scan_version
from tidal.formats.bad_data import data_errors, exhausted
from tidal.sources.index_file import holds_together, scanner
from tidal.sources.siblings import Siblings
from tidal.storage.fs import FileStat
from tidal.storage.retry import redact_urls

if TYPE_CHECKING:
    from tidal.storage.cache import Entry


def fresh_remote(entry: dict | None, stat: FileStat, *, older: bool = False) -> bool:
    """Whether an entry is what counting the remote file as it is now would find: the file
    unchanged, the entry one this tidal trusts (``older``: or the count of an older scan that
    still holds, see :func:`holds_together`), and, for a format that reads a file beside its
    shards (a Megatron ``.idx``), what that file was (an entry of a local scan lacks it: a local
    directory's index served over HTTP beside the data)."""
    return (
        entry is not None
        and entry.get("bytes") == stat.size
        and entry.get("version") == stat.version
        and holds_together(
            entry.get("rows"),
            entry.get("format"),
            entry.get("error"),
            entry.get("info"),
            entry.get("scanner"),
            entry.get("scan"),
            older=older,
        )
        and (entry.get("error") is not None or _beside_known(entry))
    )


def _beside_known(entry: dict) -> bool:
    """Whether a counted entry holds what a reader of a remote shard needs of the file its format
    reads beside it (its size and version), where its format reads one."""
    if not hasattr(module(entry["format"]), "beside"):
        return True
    near = (entry.get("info") or {}).get("beside")
    return isinstance(near, dict) and type(near.get("bytes")) is int


def scan_remote(url: str, format: str | None, stat: FileStat, fetcher: Any) -> dict:
    from tidal.storage.cache import Entry

    entry: dict = {"bytes": stat.size, "version": stat.version}
    siblings = Siblings.of(fetcher)
    try:
        name, compression = detect(url, format, exists=siblings.exists)
        entry.update(format=name, compression=compression)
        counted = _from_manifest(name, url, compression, siblings)
        if counted is not None:  # the manifest beside it says (MDS's index.json): no download
            info = counted
        elif _footer_only(url, stat.size, (name, compression)) and fetcher.ranged_reads(url):
            with fetcher.range_file(url, stat.size, stat.version) as f:  # the footer is enough: ranged GETs
                info = _scan_file(name, url, compression, f)
        else:
            with fetcher.acquire(Entry(url, stat.size, stat.version)) as handle:
                near = _beside(name, url, siblings)
                if near is None:
                    info = _scan_file(name, url, compression, str(handle.path), siblings)
                else:
                    with fetcher.acquire(near) as held:
                        info = _scan_file(name, url, compression, str(handle.path), siblings, str(held.path))
                    info["beside"] = {"bytes": near.size, "version": near.version}
                entry["hash"] = handle.digest
    except StorageError:
        raise
    except (FormatError, *data_errors()) as exc:  # type: ignore[misc]  # a tuple of exception classes
        return _failed(url, format, entry, exc)
    return _found(entry, info)


def _from_manifest(name: str, url: str, compression: str | None, siblings: Siblings) -> dict | None:
    """What the manifest a format keeps beside its remote files (``COUNTS``: MDS's ``index.json``)
    says of ``url`` (``counts`` of its module); None where it has none, or it does not say."""
    fmt = module(name)
    manifest = getattr(fmt, "COUNTS", None)
    if manifest is None:
        return None
    found = siblings.read(posixpath.join(posixpath.dirname(url), manifest))
    return None if found is None else fmt.counts(url, compression, found)


def _footer_only(url: str, size: int, detected: tuple[str, str | None] | None = None) -> bool:
    """Whether a remote file is counted from its footer (Parquet), not from a downloaded copy."""
    try:
        name, compression = detected or detect(url)
    except FormatError:
        return False
    return name == "parquet" and compression is None and size > 0


def _beside(name: str, url: str, siblings: Siblings) -> Entry | None:
    """The cache entry of the file a format reads beside a remote shard (``beside(path)`` of its
    module: a Megatron ``.idx``), whose size and version the shard's info keeps for its readers;
    None where the format names none."""
    from tidal.storage.cache import Entry

    named = getattr(module(name), "beside", None)
    if named is None:
        return None
    near = named(url)
    stat = siblings.stat(near)
    if stat is None:
        raise FormatError(f"{url}: no {posixpath.basename(near)} beside it")
    return Entry(near, stat.size, stat.version)


def _scan_file(
    name: str, url: str, compression: str | None, file: Any, siblings: Siblings | None = None, beside: str | None = None
) -> dict:
    """``scan`` of a format, given where the bytes are; errors name ``url``. A format that reads
    a manifest beside its files (``MANIFEST``) is given its bytes where the file is remote, and
    one that reads a file beside it (``beside``) the local copy of that file."""
    fmt = module(name)
    scan = fmt.scan
    if beside is not None:
        return scan(url, compression, file=file, beside=beside)
    manifest = getattr(fmt, "MANIFEST", None)
    if manifest is not None and siblings is not None and "://" in url:
        found = siblings.read(posixpath.join(posixpath.dirname(url), manifest))
        if found is None:
            raise FormatError(f"{url}: no {manifest} beside it, which describes its records")
        return scan(url, compression, file=file, manifest=found)
    if "file" in inspect.signature(scan).parameters:
        return scan(url, compression, file=file)
    if not isinstance(file, str):  # a format that reads local files only
        raise FormatError(f"{url}: the {name} reader cannot read a remote file in place")
    try:
        return scan(file, compression)
    except FormatError as exc:
        raise FormatError(str(exc).replace(file, url)) from None


def scan_local(path: str, format: str | None, size: int, mtime_ns: int) -> dict:
    entry: dict = {"bytes": size, "mtime_ns": mtime_ns}
    try:
        name, compression = detect(path, format)
        entry.update(format=name, compression=compression)
        info = module(name).scan(path, compression)
    except (FormatError, *data_errors()) as exc:  # type: ignore[misc]  # a tuple of exception classes
        return _failed(path, format, entry, exc)
    return _found(entry, info)


def _found(entry: dict, info: dict) -> dict:
    """The entry of a file a scan counted: its rows, the rest of what the scan found, and the
    version of its format's scan where it is not 1."""
    entry["rows"] = info.pop("rows")
    if info:
        entry["info"] = info
    version = scan_version(entry["format"])
    if version != 1:
        entry["scan"] = version
    return entry


def _failed(path: str, format: str | None, entry: dict, exc: BaseException) -> dict:
    """The entry of a file whose scan failed: the error named (what a format module let through
    too, never raw), with the tidal that found it; a machine out of resources raises instead."""
    _not_exhausted(path, exc)
    error = str(exc) if isinstance(exc, FormatError) else f"{path}: unreadable ({type(exc).__name__}): {exc}"
    return {"format": format or "?", **entry, "error": redact_urls(error), "scanner": scanner()}


def _not_exhausted(path: str, exc: BaseException) -> None:
    """Raise a StorageError if ``exc`` says the machine ran out of something: a file is not
    bad, nor remembered so in the index, because this process had no file descriptor left."""
    short = exhausted(exc)
    if short is not None:
        raise StorageError(f"{redact_urls(path)}: out of {short} while indexing it: {exc}") from exc
