"""Counting: how many records each file of a dataset holds, made into its :class:`~tidal.Shards`
(the files come from :mod:`tidal.sources.listing`).

Counting records means reading every line of a JSON or text file, so the counts are kept in
an index built once and reused (its file: :mod:`tidal.sources.index_file`). An entry is reused while the file's
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
of whose files can be read is an error under every policy. An error is remembered with the
code that found it (``"scanner"``: the tidal, its readers' code, pyarrow), and other code
scans the file again; a count, with the version of its format's scan where it is not 1
(``"scan"``, :func:`tidal.formats.scan_version`), and another version scans the file again.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import os
import posixpath
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tidal.errors import FormatError, StorageError
from tidal.formats import Errors, detect, module, scan_version
from tidal.formats.agreement import check_schemas
from tidal.formats.bad_data import bad, data_errors, exhausted
from tidal.sources.index_file import INDEX_NAME, Entries, holds_together, index_path, load, locked, save, scanner
from tidal.sources.published import PUBLISHES, Claim, Published, Sources, publish, wait_for
from tidal.sources.published import read as read_published
from tidal.sources.shards import NO_INFO, Shard, Shards
from tidal.sources.siblings import Siblings
from tidal.storage.config import Storage
from tidal.storage.fs import FileStat, Remote
from tidal.storage.retry import redact, redact_urls
from tidal.storage.urls import protocol, url_root

if TYPE_CHECKING:
    from tidal.storage.cache import Entry

log = logging.getLogger("tidal")


def index(
    files: list[str],
    format: str | None = None,
    errors: Errors = "raise",
    storage: Storage | None = None,
    stats: dict[str, FileStat | None] | None = None,
    progress: Callable[[int], None] | None = None,
    *,
    sources: Sources | None = None,
) -> Shards:
    """The shards of ``files``, from the cached index where it is still valid.

    Remote files (URLs) are indexed with ``storage``; ``stats`` may carry what their listing
    said (size, version), which spares a request per file. ``progress`` is called with the
    number of files done as they are (the files the index already knows at once): for a
    progress bar. ``sources``: what the listing learned of the indexes published beside the
    data (:mod:`tidal.sources.published`); with it, what this job counts is published for the next.
    """
    done = progress or _nothing
    if "://" not in "\0".join(files):  # every file local: no URL, at C speed for a million
        return _index_local(files, format, errors, done)
    groups: dict[str | None, list[str]] = {}
    for f in files:
        groups.setdefault(protocol(f), []).append(f)
    found: dict[str, Shard] = {}
    for proto, group in groups.items():
        if proto is None:
            shards = _index_local(group, format, errors, done)
        else:
            settings = (storage or Storage()).for_files(group)
            shards = _index_remote(group, format, errors, settings, stats or {}, done, sources)
        found.update((s.path, s) for s in shards)
    return Shards.of(found[f] for f in files)


def _nothing(done: int) -> None:
    pass


def _index_local(files: list[str], format: str | None, errors: Errors, progress: Callable[[int], None]) -> Shards:
    root = os.path.commonpath(list({f[: f.rfind(os.sep)] or os.sep for f in files}))
    where = index_path(root)
    sizes, mtimes = _stat(files)
    keys = _keys(files, root, format)
    with locked(where):
        entries = load(where)
        at = np.array([entries.at.get(k, -1) for k in keys], dtype=np.int64)
        usable = entries.usable()
        fresh = (at >= 0) & usable[at] & (entries.ints("bytes")[at] == sizes) & (entries.ints("mtime_ns")[at] == mtimes)
        todo = np.flatnonzero(~fresh).tolist()
        progress(len(files) - len(todo))
        if todo:
            for part, scanned in _scan_local([(files[j], sizes[j], mtimes[j]) for j in todo], format, todo):
                entries.put_many([keys[j] for j in part], scanned)
                progress(len(part))
            save(where, entries)
    return _shards(files, entries, [entries.at[k] for k in keys], format, errors)


SCAN_THREADS = 16  # a scan waits on the disk (or the page cache) as much as it parses
SCAN_CHUNK = 256  # files a thread scans per task: a future per file cost more than a small file's scan


def _scan_local(
    files: list[tuple[str, int, int]], format: str | None, ids: list[int]
) -> Iterator[tuple[list[int], list[dict]]]:
    """``(ids, entries)`` of ``files`` (path, size, mtime), scanned in threads, a chunk at a time
    and in order (so a progress bar moves); ``ids`` name the files to the caller."""
    step = max(1, min(SCAN_CHUNK, len(files) // (4 * SCAN_THREADS)))
    chunks = range(0, len(files), step)

    def scan(a: int) -> list[dict]:
        return [_scan(path, format, size, mtime) for path, size, mtime in files[a : a + step]]

    with ThreadPoolExecutor(min(SCAN_THREADS, len(chunks))) as pool:
        for a, scanned in zip(chunks, pool.map(scan, chunks), strict=True):
            yield ids[a : a + step], scanned


STAT_THREADS = 2  # os.stat lets go of the GIL: two threads take 0.23 s for 100,000 files, one 0.32 s, four 0.29 s


def _stat(files: list[str]) -> tuple[list[int], list[int]]:
    """Size and modification time (ns) of every file: what decides whether its index entry is
    still true."""
    if len(files) < 10_000:
        return _sizes_and_times(files)
    step = -(-len(files) // STAT_THREADS)
    with ThreadPoolExecutor(STAT_THREADS) as pool:
        parts = list(pool.map(_sizes_and_times, [files[a : a + step] for a in range(0, len(files), step)]))
    return [n for p in parts for n in p[0]], [t for p in parts for t in p[1]]


def _sizes_and_times(files: list[str]) -> tuple[list[int], list[int]]:
    sizes, times = [], []
    for f in files:
        st = os.stat(f)
        sizes.append(st.st_size)
        times.append(st.st_mtime_ns)
    return sizes, times


def _shards(files: list[str], entries: Entries, at: list[int], format: str | None, errors: Errors) -> Shards:
    """``files`` with their index entries (``at``, positions in ``entries``), as shards; files
    that failed their scan handled by the ``errors`` policy."""
    columns = entries.columns

    def pick(name: str) -> list:
        column = columns[name]
        return [column[i] for i in at]

    why = pick("error")
    failed = [e for e in why if e is not None]
    for error in failed:
        bad(errors, FormatError(error))  # raises, unless the policy skips the file
        if errors == "skip":  # a function is the user's handler: it logs if it wants to
            log.warning("skipping a file that cannot be read (its records are not in the dataset): %s", error)
    if failed and len(failed) == len(files):
        more = f" (and {len(failed) - 1} more files)" if len(failed) > 1 else ""
        hint = f"; is format={format!r} right?" if format is not None else ""
        raise FormatError(f"no file of the dataset can be read: {failed[0]}{more}{hint}")
    rows = pick("rows")
    if failed:
        rows = [0 if e is not None else r for r, e in zip(rows, why, strict=True)]
    infos = [NO_INFO if i is None else i for i in pick("info")]
    shards = Shards(
        files, rows, pick("bytes"), pick("format"), pick("compression"), infos, pick("version"), pick("hash"), why
    )
    check_schemas(shards)
    return shards


def _index_remote(
    urls: list[str],
    format: str | None,
    errors: Errors,
    storage: Storage,
    known: dict[str, FileStat | None],
    progress: Callable[[int], None],
    sources: Sources | None = None,
) -> Shards:
    from tidal.storage.fetch import Fetcher

    fetcher = Fetcher(storage, data=False)
    try:
        remote = fetcher.remote(urls[0])
        missing = [u for u in urls if known.get(u) is None]
        with ThreadPoolExecutor(min(16, max(1, len(missing)))) as pool:
            stats: dict[str, FileStat] = {u: s for u, s in known.items() if s is not None}
            stats.update(zip(missing, pool.map(remote.stat, missing), strict=True))
        root = url_root(urls)
        where, keys = _cache_index(urls, format, storage)
        with locked(where):  # the processes of this machine count once, the first for all
            entries = load(where)
            todo = [j for j, u in enumerate(urls) if not _fresh_remote(entries.get(keys[j]), stats[u])]
            if not todo:  # every entry known as it is: nothing to write (the cache may be read-only)
                progress(len(urls))
                return _shards(urls, entries, [entries.at[k] for k in keys], format, errors)
            for published in _published_for(remote, sources, urls, root):  # published indexes may know them
                todo = _seed(entries, published, urls, keys, stats, todo, format, older=sources is not None)
            progress(len(urls) - len(todo))
            if todo:
                counting = _Counting(urls, keys, stats, format, fetcher, entries, where, progress)
                target = sources.target(urls) if sources is not None and storage.publish_index else None
                if target is None:
                    counting.run(todo)
                    if sources is not None:  # a job (not `tidal index`): counting is a cost to point out
                        _warn_counting(urls, counting.downloaded(todo), stats, storage, None)
                else:
                    _count_once(remote, target, counting, todo, storage)
            data = entries.to_json()
            fetcher.cache.make_room(len(data) + 8192)  # the index lives in the cache: count it
            save(where, entries, data)
    finally:
        fetcher.close()
        if sources is not None:  # what opening the dataset cost the network, for the loader's metrics
            sources.downloaded += int(fetcher.stats.dict()["bytes_downloaded"])
    return _shards(urls, entries, [entries.at[k] for k in keys], format, errors)


def _cache_index(urls: list[str], format: str | None, storage: Storage) -> tuple[Path, list[str]]:
    """Where the shard cache keeps the index of the remote ``urls``, and each one's key in it."""
    root = url_root(urls)
    return storage.root / "index" / f"{hashlib.sha1(root.encode()).hexdigest()[:16]}.json", _keys(urls, root, format)


def uncounted(urls: list[str], format: str | None, storage: Storage, stats: dict[str, FileStat]) -> list[int]:
    """Which of the remote ``urls`` the shard cache's index does not know as they are now."""
    where, keys = _cache_index(urls, format, storage)
    with locked(where):
        entries = load(where)
    return [j for j, u in enumerate(urls) if not _fresh_remote(entries.get(keys[j]), stats[u])]


def record_counts(urls: list[str], format: str | None, storage: Storage, counted: dict[int, dict]) -> None:
    """Keep what was counted of ``urls`` (by position) in the shard cache's index."""
    where, keys = _cache_index(urls, format, storage)
    with locked(where):
        entries = load(where)
        for j, entry in counted.items():
            entries.put(keys[j], entry)
        save(where, entries)


def count_remote(urls: list[str], format: str | None, stats: list[FileStat], storage: Storage) -> list[dict]:
    """The index entries of the remote ``urls``: Parquet from its footer, the rest from a copy
    fetched into the shard cache; any number of processes may do this at once."""
    from tidal.storage.fetch import Fetcher

    fetcher = Fetcher(storage, data=False)
    try:
        with ThreadPoolExecutor(min(SCAN_THREADS, max(1, len(urls)))) as pool:
            return list(pool.map(lambda u, st: _scan_remote(u, format, st, fetcher), urls, stats))
    finally:
        fetcher.close()


def _published_for(remote: Remote, sources: Sources | None, urls: list[str], root: str) -> list[Published]:
    """The published indexes that may know ``urls``: those the listing read, else the one beside them."""
    if sources is not None and sources.found:
        return [p for p in sources.found.values() if p is not None]
    found = read_published(remote, f"{root}/{INDEX_NAME}", root)
    return [found] if found is not None else []


def _seed(
    entries: Entries,
    published: Published,
    urls: list[str],
    keys: list[str],
    stats: dict[str, FileStat],
    todo: list[int],
    format: str | None,
    *,
    older: bool = True,
) -> list[int]:
    """Take what ``published`` knows of the files ``todo`` into ``entries``; what is left to count.
    ``older``: a job's, which takes the counts of an older scan that still hold, not a request per
    file to scan them again (``tidal index``, which publishes, scans them again)."""
    left = []
    for j in todo:
        e = published.entry(urls[j], format)
        if e is not None and _fresh_remote(e, stats[urls[j]], older=older):
            entries.put(keys[j], e)
        else:
            left.append(j)
    return left


SAVE_EVERY_S = 30.0  # a count in progress is saved this often: a restart goes on from there


class _Counting:
    """Counting the records of remote files into ``entries`` (the cache's index), saved as it
    goes so that a run cut off and started again counts only what is left."""

    def __init__(
        self,
        urls: list[str],
        keys: list[str],
        stats: dict[str, FileStat],
        format: str | None,
        fetcher: Any,
        entries: Entries,
        where: Any,
        progress: Callable[[int], None],
    ):
        self.urls, self.keys, self.stats, self.format = urls, keys, stats, format
        self.fetcher, self.entries, self.where, self.progress = fetcher, entries, where, progress

    def downloaded(self, todo: list[int]) -> list[int]:
        """Which of ``todo`` were downloaded to be counted (not from a footer or a manifest): those hashed."""
        return [j for j in todo if "hash" in (self.entries.get(self.keys[j]) or {})]

    def run(self, todo: list[int]) -> None:
        if not todo:
            return
        saved = time.monotonic()
        with ThreadPoolExecutor(min(SCAN_THREADS, len(todo))) as pool:
            scan = lambda j: _scan_remote(self.urls[j], self.format, self.stats[self.urls[j]], self.fetcher)  # noqa: E731
            for j, entry in zip(todo, pool.map(scan, todo), strict=True):
                self.entries.put(self.keys[j], entry)
                self.progress(1)
                if time.monotonic() - saved > SAVE_EVERY_S:
                    save(self.where, self.entries)
                    saved = time.monotonic()


SCAN_THREADS = 32  # remote files counted at once: mostly waiting on the network (Parquet: a footer's range)


def _count_once(
    remote: Remote, target: tuple[str, str], counting: _Counting, todo: list[int], storage: Storage
) -> None:
    """Count ``todo`` once for every node: take the claim and count and publish, or wait for the
    node that holds it to publish (see :mod:`tidal.sources.published`)."""
    root, url = target
    claim = Claim(remote, url)
    urls, stats = counting.urls, counting.stats

    def covers(published: Published) -> bool:
        return all(_fresh_remote(published.entry(urls[j], counting.format), stats[urls[j]], older=True) for j in todo)

    while todo:
        verdict = claim.take()
        if verdict == "theirs":
            log.info("another node counts the files of %s: waiting for it to publish %s", redact(root), redact(url))
            published = wait_for(remote, url, root, claim, covers)
            if published is not None:
                todo = _seed(counting.entries, published, urls, counting.keys, stats, todo, counting.format)
                counting.progress(len(urls) - len(todo))
            continue
        if verdict == "denied":
            counting.run(todo)
            _warn_counting(urls, counting.downloaded(todo), stats, storage, url)
            return
        with claim.held():
            existing = read_published(remote, url, root)  # published since we looked (by a node done already)?
            if existing is not None:
                todo = _seed(counting.entries, existing, urls, counting.keys, stats, todo, counting.format)
                counting.progress(len(urls) - len(todo))
                if not todo:
                    return
            counting.run(todo)
            merged = existing.entries if existing is not None else Entries()
            tag = f"#{counting.format}" if counting.format is not None else ""
            for u, key in zip(urls, counting.keys, strict=True):
                entry = counting.entries.get(key)
                if entry is not None and u.startswith(root + "/"):
                    merged.put(u[len(root) + 1 :] + tag, entry)
            # what a job counted saves the next jobs counting, never their listing (see tidal.sources.published)
            why = publish(remote, url, merged, complete=existing is not None and existing.complete)
            if why is not None:
                log.warning("could not publish the index of %s (%s): each node counts its files", redact(root), why)
        return


_warned: set[str] = set()


def _warn_counting(
    urls: list[str], whole: list[int], stats: dict[str, FileStat], storage: Storage, denied: str | None
) -> None:
    """Once per dataset: counting line files downloaded them (``whole``), which every job on another
    machine does again unless an index is published."""
    root = url_root(urls)
    if not whole or root in _warned:
        return
    _warned.add(root)
    size = sum(stats[urls[j]].size for j in whole)
    where = redact(root)
    if protocol(urls[0]) in PUBLISHES:
        hint = f"run `tidal index {where}` once to publish one beside the data"
    else:  # a web server or the Hub: the index goes where tidal may write, and jobs are told where
        hint = f"run `tidal index {where} --to FILE` once (a local file or an object store URL) and pass index_url=FILE"
    why = ""
    if denied:
        why = f" (and it may not write {redact(denied)})"
    elif storage.publish_index and protocol(urls[0]) not in PUBLISHES:
        why = f" (a job publishes to object stores only, not to {protocol(urls[0])}://)"
    elif storage.publish_index:
        why = " (the source names no directory to publish it in)"
    files = "1 file" if len(whole) == 1 else f"{len(whole)} files"
    log.warning(
        "%s: no index is published beside the data%s, so this node downloaded %s (%s bytes) to count the "
        "records (the next jobs on this machine reuse the counts); %s, and every job starts from it",
        where,
        why,
        files,
        f"{size:,}",
        hint,
    )


def _fresh_remote(entry: dict | None, stat: FileStat, *, older: bool = False) -> bool:
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


def _scan_remote(url: str, format: str | None, stat: FileStat, fetcher: Any) -> dict:
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


def _keys(paths: list[str], root: str, format: str | None) -> list[str]:
    """Each path's key in the index: relative to ``root``, a prefix of every path (slicing is
    cheaper than relpath), tagged with ``format=`` when one was given."""
    cut = len(root)
    rel = [p[cut:].lstrip("/") for p in paths]
    return rel if format is None else [f"{r}#{format}" for r in rel]


def _scan(path: str, format: str | None, size: int, mtime_ns: int) -> dict:
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
