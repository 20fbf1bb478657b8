"""Counting: how many records each file of a dataset holds, made into its :class:`~tidal.Shards`
(the files come from :mod:`tidal.sources.listing`).

Counting records means reading every line of a JSON or text file, so the counts are kept in
an index built once and reused (its file: :mod:`tidal.sources.index_file`; one file's entry:
:mod:`tidal.sources.scanning`; a remote dataset counted once for every node:
:mod:`tidal.sources.remote_counting`). An entry is reused while the file's
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
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from tidal.errors import FormatError
from tidal.formats import Errors
from tidal.formats.agreement import check_schemas
from tidal.formats.bad_data import bad
from tidal.pools import Threads
from tidal.sources.index_file import Entries, index_path, load, locked, save
from tidal.sources.published import Sources
from tidal.sources.remote_counting import Counting, count_once, published_for, seed, warn_counting
from tidal.sources.scanning import fresh_remote, scan_local
from tidal.sources.shards import NO_INFO, Shard, Shards
from tidal.storage.config import Storage
from tidal.storage.fs import FileStat
from tidal.storage.urls import protocol, url_root

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
        return [scan_local(path, format, size, mtime) for path, size, mtime in files[a : a + step]]

    with Threads(min(SCAN_THREADS, len(chunks))) as pool:
        for a, scanned in zip(chunks, pool.map(scan, chunks), strict=True):
            yield ids[a : a + step], scanned


STAT_THREADS = 2  # os.stat lets go of the GIL: two threads take 0.23 s for 100,000 files, one 0.32 s, four 0.29 s


def _stat(files: list[str]) -> tuple[list[int], list[int]]:
    """Size and modification time (ns) of every file: what decides whether its index entry is
    still true."""
    if len(files) < 10_000:
        return _sizes_and_times(files)
    step = -(-len(files) // STAT_THREADS)
    with Threads(STAT_THREADS) as pool:
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
        with Threads(min(16, max(1, len(missing)))) as pool:
            stats: dict[str, FileStat] = {u: s for u, s in known.items() if s is not None}
            stats.update(zip(missing, pool.map(remote.stat, missing), strict=True))
        root = url_root(urls)
        where, keys = _cache_index(urls, format, storage)
        with locked(where):  # the processes of this machine count once, the first for all
            entries = load(where)
            todo = [j for j, u in enumerate(urls) if not fresh_remote(entries.get(keys[j]), stats[u])]
            if not todo:  # every entry known as it is: nothing to write (the cache may be read-only)
                progress(len(urls))
                return _shards(urls, entries, [entries.at[k] for k in keys], format, errors)
            for published in published_for(remote, sources, urls, root):  # published indexes may know them
                todo = seed(entries, published, urls, keys, stats, todo, format, older=sources is not None)
            progress(len(urls) - len(todo))
            if todo:
                counting = Counting(urls, keys, stats, format, fetcher, entries, where, progress)
                target = sources.target(urls) if sources is not None and storage.publish_index else None
                if target is None:
                    counting.run(todo)
                    if sources is not None:  # a job (not `tidal index`): counting is a cost to point out
                        warn_counting(urls, counting.downloaded(todo), stats, storage, None)
                else:
                    count_once(remote, target, counting, todo, storage)
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
    return [j for j, u in enumerate(urls) if not fresh_remote(entries.get(keys[j]), stats[u])]


def record_counts(urls: list[str], format: str | None, storage: Storage, counted: dict[int, dict]) -> None:
    """Keep what was counted of ``urls`` (by position) in the shard cache's index."""
    where, keys = _cache_index(urls, format, storage)
    with locked(where):
        entries = load(where)
        for j, entry in counted.items():
            entries.put(keys[j], entry)
        save(where, entries)


def _keys(paths: list[str], root: str, format: str | None) -> list[str]:
    """Each path's key in the index: relative to ``root``, a prefix of every path (slicing is
    cheaper than relpath), tagged with ``format=`` when one was given."""
    cut = len(root)
    rel = [p[cut:].lstrip("/") for p in paths]
    return rel if format is None else [f"{r}#{format}" for r in rel]
