"""``tidal index``: count a remote dataset once and publish its index beside it (or elsewhere),
so that every job after it starts from that one object (see :mod:`tidal.sources.published`).

The files are listed afresh (never from an index already published), and each is counted
once: Parquet from its footer (ranged GETs), the rest from a copy fetched into this machine's
shard cache. The counting runs in this process's threads, in ``workers`` local processes, or in
Ray tasks (``engine="ray"``), a batch of files per task. What is counted is kept in the shard
cache's index as batches finish, so a run cut off and started again counts only what is left.
The index is published last, in one write, marked complete.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tidal.errors import ArgumentError, SourceError, StorageError
from tidal.formats import scan_version
from tidal.sources import counting, storage_settings
from tidal.sources.counting import record_counts, uncounted
from tidal.sources.index_file import INDEX_NAME, Entries, scanner
from tidal.sources.listing import listing, remote_root
from tidal.sources.published import location, publish
from tidal.sources.remote_counting import count_remote
from tidal.sources.shards import Shards
from tidal.storage.config import Storage
from tidal.storage.fs import FileStat, Remote
from tidal.storage.retry import redact
from tidal.storage.urls import protocol

BATCH = 64  # files a task counts
READ_ONLY = frozenset({"http", "https", "hf"})  # a web server, the Hub (a write is a commit): the index goes elsewhere


@dataclass(frozen=True)
class _Job:
    """Batches of files to count: picklable, sent once to each worker (see tidal.convert.engines)."""

    urls: tuple[str, ...]
    stats: tuple[FileStat, ...]
    todo: tuple[int, ...]  # positions in urls still to count
    format: str | None
    storage: Storage

    noun = "index"

    def batch(self, task: int) -> tuple[int, ...]:
        return self.todo[task * BATCH : (task + 1) * BATCH]

    def doing(self, task: int) -> str:
        first = self.batch(task)[0]
        return f"counting {redact(self.urls[first])} and the files after it"

    def run(self, task: int) -> tuple[int, list[dict]]:
        picked = self.batch(task)
        return task, count_remote(
            [self.urls[j] for j in picked], self.format, [self.stats[j] for j in picked], self.storage
        )


def index(
    src: str,
    *,
    to: str | None = None,
    format: str | None = None,
    storage_options: dict[str, Any] | None = None,
    cache_dir: str | os.PathLike | None = None,
    storage: Storage | None = None,
    workers: int = 0,
    engine: str = "processes",
    ray_address: str | None = None,
    progress: Callable[[int], None] | None = None,
) -> Shards:
    """Count every file of the remote dataset ``src`` (a directory or a glob URL) once and publish
    its index: ``.tidal-index.json`` in that directory, or ``to`` (a URL or a local file; a
    directory, or a name ending in ``/``: ``.tidal-index.json`` in it). Data on a web server or
    the Hub needs ``to``: tidal does not write there. Returns its shards.

    ``workers``: local processes (``engine="processes"``, 0: threads of this process) or Ray
    tasks at once (``engine="ray"``, on the cluster at ``ray_address``, else a local one).
    ``progress`` is called with the number of files done as they are.

    >>> tidal.index("s3://bucket/corpus/")                    # every job over it starts from one GET
    >>> tidal.index("s3://bucket/corpus/", to="s3://mine/corpus-index.json")  # the data is read-only
    """
    if protocol(src) is None:
        raise SourceError(
            f"{src}: tidal index publishes the index of remote data; a local dataset is indexed "
            "in its directory when tidal.Dataset first reads it"
        )
    root = remote_root(src)
    if root is None:
        raise SourceError(f"{redact(src)}: tidal index takes a directory or a glob, not one file")
    if to is None and protocol(src) in READ_ONLY:
        raise ArgumentError(
            f"{redact(src)}: tidal writes no index to {protocol(src)}:// (a web server, or the Hub, is not a place it "
            "writes to): give to= (--to), a local file or an object store URL, and open the dataset with "
            "index_url= that"
        )
    if engine not in ("processes", "ray"):
        raise ArgumentError(f"engine must be 'processes' or 'ray', not {engine!r}")
    if engine == "ray" and workers < 1:
        raise ArgumentError("engine='ray' counts in Ray tasks: give workers=N (tasks at once), at least 1")
    if ray_address is not None and engine != "ray":
        raise ArgumentError("ray_address is the cluster of engine='ray': give that engine too, or leave it out")
    where_cached = os.fspath(cache_dir) if cache_dir is not None else None
    settings = storage_settings(storage, storage_options=storage_options, cache_dir=where_cached)
    found = listing(src, settings, format=format)  # afresh: never from a published index
    urls = list(found)
    stats = {u: s for u, s in found.items() if s is not None}
    settings = settings.for_files(urls)
    done = progress or (lambda n: None)
    if workers > 0:
        _count_in_workers(urls, stats, format, settings, workers, engine, ray_address, done)
        done = lambda n: None  # noqa: E731  # every file is counted now: index() only reads them back
    shards = counting.index(urls, format, "skip", settings, dict(found), progress=done)
    entries = Entries()
    tag = f"#{format}" if format is not None else ""
    for shard in shards:
        entries.put(shard.path[len(root) + 1 :] + tag, _entry(shard))
    where = published_at(src, to, settings)
    if protocol(where) is None:  # a local file: where the data's bucket is read-only to us
        _write_local(where, entries.to_json(complete=True))
        return shards
    why = publish(Remote(protocol(where) or "", settings), where, entries, complete=True)
    if why is not None:
        raise StorageError(
            f"{redact(where)}: the index could not be published: {why}; what was counted is kept in the shard "
            "cache: publish it elsewhere with to= (--to), a local file or an object store URL you may write",
            url=redact(where),
        )
    return shards


def _write_local(path: str, data: bytes) -> None:
    """The index written to the local file ``path`` whole (beside it first, then renamed into place)."""
    target = Path(path).expanduser()
    part = target.with_name(f"{target.name}.{os.getpid()}.part")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        part.write_bytes(data)
        os.replace(part, target)
    except OSError as exc:
        part.unlink(missing_ok=True)
        raise StorageError(f"{path}: the index could not be written there: {exc.strerror or exc}", url=path) from None


def published_at(src: str, to: str | None = None, storage: Storage | None = None) -> str:
    """Where :func:`index` publishes the index of ``src``: ``to``, else beside the data (see
    :func:`tidal.sources.published.location`).

    >>> published_at("s3://bucket/corpus/*.parquet")
    's3://bucket/corpus/.tidal-index.json'
    >>> published_at("https://host/corpus/", to="indexes/")     # a directory: the index in it
    'indexes/.tidal-index.json'
    """
    if to is None:
        return location(remote_root(src) or src, storage or Storage())
    local = protocol(to) is None
    if to.endswith("/") or (local and (to.endswith(os.sep) or os.path.isdir(os.path.expanduser(to)))):
        return f"{to.rstrip('/' + os.sep)}/{INDEX_NAME}"
    return to


def _count_in_workers(
    urls: list[str],
    stats: dict[str, FileStat],
    format: str | None,
    settings: Storage,
    workers: int,
    engine: str,
    ray_address: str | None,
    done: Callable[[int], None],
) -> None:
    """Count what the shard cache's index does not know yet, a batch of files per task."""
    todo = uncounted(urls, format, settings, stats)
    done(len(urls) - len(todo))
    if not todo:
        return
    job = _Job(tuple(urls), tuple(stats[u] for u in urls), tuple(todo), format, settings)
    tasks = list(range(-(-len(todo) // BATCH)))

    def finished(result: tuple[int, Any]) -> None:
        task, entries = result
        picked = job.batch(task)
        record_counts(urls, format, settings, dict(zip(picked, entries, strict=True)))
        done(len(picked))

    if engine == "ray":
        from tidal.convert.engines import run_ray

        run_ray(job, tasks, workers, ray_address, finished)
    else:
        from tidal.convert.engines import run_processes

        run_processes(job, tasks, workers, finished)


def _entry(shard: Any) -> dict:
    """What an index holds of one shard (as the cache's index holds it)."""
    entry: dict = {"bytes": shard.bytes, "version": shard.version, "format": shard.format, "rows": shard.rows}
    if shard.compression is not None:
        entry["compression"] = shard.compression
    if shard.hash is not None:
        entry["hash"] = shard.hash
    if shard.info:
        entry["info"] = shard.info
    if scan_version(shard.format) != 1:  # every shard index() returns was counted by this tidal's scans
        entry["scan"] = scan_version(shard.format)
    if shard.error is not None:
        entry["error"] = shard.error
        entry["scanner"] = scanner()  # found by this tidal: another version scans the file again
        entry.pop("rows")
    return entry
