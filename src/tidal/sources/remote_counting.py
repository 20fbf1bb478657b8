"""Counting a remote dataset's files: in threads, saved as it goes, and once for every node.

A job whose files no index knows counts them, which for line files means downloading them.
The count is saved every :data:`SAVE_EVERY_S` so that a run cut off counts only what is left;
where the job may publish, one node claims the count and publishes the index beside the data
while the others wait for it (:mod:`tidal.sources.published`), and a job that had to download
files says once how to publish an index. Apart from :mod:`tidal.sources.counting`, which
decides what is left to count, because sharing the count between nodes is a concept of its own.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from tidal.pools import Threads
from tidal.sources.index_file import INDEX_NAME, Entries, save
from tidal.sources.published import PUBLISHES, Claim, Published, Sources, publish, wait_for
from tidal.sources.published import read as read_published
from tidal.sources.scanning import fresh_remote, scan_remote
from tidal.storage.config import Storage
from tidal.storage.fs import FileStat, Remote
from tidal.storage.retry import redact
from tidal.storage.urls import protocol, url_root

log = logging.getLogger("tidal")

SCAN_THREADS = 32  # remote files counted at once: mostly waiting on the network (Parquet: a footer's range)


def count_remote(urls: list[str], format: str | None, stats: list[FileStat], storage: Storage) -> list[dict]:
    """The index entries of the remote ``urls``: Parquet from its footer, the rest from a copy
    fetched into the shard cache; any number of processes may do this at once."""
    from tidal.storage.fetch import Fetcher

    fetcher = Fetcher(storage, data=False)
    try:
        with Threads(min(SCAN_THREADS, max(1, len(urls)))) as pool:
            return list(pool.map(lambda u, st: scan_remote(u, format, st, fetcher), urls, stats))
    finally:
        fetcher.close()


def published_for(remote: Remote, sources: Sources | None, urls: list[str], root: str) -> list[Published]:
    """The published indexes that may know ``urls``: those the listing read, else the one beside them."""
    if sources is not None and sources.found:
        return [p for p in sources.found.values() if p is not None]
    found = read_published(remote, f"{root}/{INDEX_NAME}", root)
    return [found] if found is not None else []


def seed(
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
        if e is not None and fresh_remote(e, stats[urls[j]], older=older):
            entries.put(keys[j], e)
        else:
            left.append(j)
    return left


SAVE_EVERY_S = 30.0  # a count in progress is saved this often: a restart goes on from there


class Counting:
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
        with Threads(min(SCAN_THREADS, len(todo))) as pool:
            scan = lambda j: scan_remote(self.urls[j], self.format, self.stats[self.urls[j]], self.fetcher)  # noqa: E731
            for j, entry in zip(todo, pool.map(scan, todo), strict=True):
                self.entries.put(self.keys[j], entry)
                self.progress(1)
                if time.monotonic() - saved > SAVE_EVERY_S:
                    save(self.where, self.entries)
                    saved = time.monotonic()


def count_once(remote: Remote, target: tuple[str, str], counting: Counting, todo: list[int], storage: Storage) -> None:
    """Count ``todo`` once for every node: take the claim and count and publish, or wait for the
    node that holds it to publish (see :mod:`tidal.sources.published`)."""
    root, url = target
    claim = Claim(remote, url)
    urls, stats = counting.urls, counting.stats

    def covers(published: Published) -> bool:
        return all(fresh_remote(published.entry(urls[j], counting.format), stats[urls[j]], older=True) for j in todo)

    while todo:
        verdict = claim.take()
        if verdict == "theirs":
            log.info("another node counts the files of %s: waiting for it to publish %s", redact(root), redact(url))
            published = wait_for(remote, url, root, claim, covers)
            if published is not None:
                todo = seed(counting.entries, published, urls, counting.keys, stats, todo, counting.format)
                counting.progress(len(urls) - len(todo))
            continue
        if verdict == "denied":
            counting.run(todo)
            warn_counting(urls, counting.downloaded(todo), stats, storage, url)
            return
        with claim.held():
            existing = read_published(remote, url, root)  # published since we looked (by a node done already)?
            if existing is not None:
                todo = seed(counting.entries, existing, urls, counting.keys, stats, todo, counting.format)
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


def warn_counting(
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
