"""The index published beside remote data: one object from which every rank of a job opens the
dataset, without listing the bucket or counting a record.

``tidal index URL`` (:func:`tidal.index`) lists a dataset, counts every file once and writes
``URL/.tidal-index.json`` (or ``Storage.index_url``) marked *complete*: its files are the
dataset's whole listing. A job over a directory or a glob under that URL takes its listing
from it: one GET per rank, no LIST, no HEAD per object. It trusts the index's sizes and
versions and checks a shard's when it downloads it (a file changed since is an error that says
to index again; a file added since is not seen until then).

An index is a hint that cannot do harm: one that does not parse is not used, and one with a key
that is not a plain relative path under the root (``..``, an absolute path, a URL, an empty
segment) is not used at all, so nothing in it can point outside the dataset. An index the user
names (``index_url``: a URL of any store, or a local file, whatever the data's store) is read
or is an error: one that cannot be read, or is not an index, is a
:class:`~tidal.errors.StorageError` naming it, never passed over for a listing of the data.

A job writes nothing where the data is unless asked: without a published index it lists and
counts for itself (its ranks share what rank 0 found through the process group, and the shard
cache keeps the counts for the next job on the machine), and tidal warns once, naming
``tidal index`` and the bytes each node downloads to count. With
``Storage(publish_index=True)``, the first node to count publishes what it counted (to an object
store only), so the other nodes read it rather than download the dataset to count it again
(they still list it: such an index is not complete). A *claim* beside the index says which
node counts; the others poll for the index while the claim is fresh (its counter refreshes
it), and take over a claim left stale. Where the job may not write there, every node counts.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from tidal.errors import SourceError, StorageError
from tidal.sources.globs import glob_pattern
from tidal.sources.index_file import INDEX_NAME, Entries, loads
from tidal.storage.config import Storage
from tidal.storage.fs import FileStat, Remote
from tidal.storage.refusals import not_found
from tidal.storage.retry import redact
from tidal.storage.urls import protocol

log = logging.getLogger("tidal")

# where a job may publish what it counted: object stores. Never the Hub (a write is a commit to
# someone's repository) nor HTTP (not a place to write)
PUBLISHES = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl"})
CLAIM_FRESH_S = 120.0  # a claim not refreshed for this long is taken over: its counter is gone
CLAIM_REFRESH_S = 30.0  # how often a counter refreshes its claim
POLL_MAX_S = 10.0  # the longest wait between two looks at the index while another node counts


@dataclass(frozen=True)
class Published:
    """An index read from ``url``, its keys relative to ``root``; ``complete``: written by
    ``tidal index``, the whole listing of ``root``. What a job publishes is never complete: it
    saves the next jobs the counting, not the listing, so files added later are still seen."""

    url: str
    root: str
    entries: Entries
    complete: bool

    def entry(self, url: str, format: str | None) -> dict | None:
        """What the index holds of the file ``url``."""
        if not url.startswith(self.root + "/"):
            return None
        key = url[len(self.root) + 1 :]
        return self.entries.get(f"{key}#{format}" if format is not None else key)


class Sources:
    """What listing a remote source learned of its published indexes, for indexing it next:
    each index is read once (``found``, by URL), and ``roots`` are the directories the source
    named whole or by a glob, with their index's URL."""

    def __init__(self) -> None:
        self.found: dict[str, Published | None] = {}
        self.roots: list[tuple[str, str]] = []  # (root, index URL)
        self.downloaded = 0  # bytes indexing brought over the network (files counted, indexes read)

    def target(self, urls: list[str]) -> tuple[str, str] | None:
        """The root above every one of ``urls``, and where what is counted of them is published
        (only to an object store: see :data:`PUBLISHES`)."""
        for root, url in self.roots:
            if protocol(url) in PUBLISHES and all(u.startswith(root + "/") for u in urls):
                return root, url
        return None


def location(root: str, storage: Storage) -> str:
    """Where the index of the data under ``root`` is published."""
    return storage.index_url or f"{root.rstrip('/')}/{INDEX_NAME}"


def reader(remote: Remote, url: str) -> Remote:
    """The client that reads (and writes) the index at ``url``: ``remote``, the data's, where the
    index is on the same store; another protocol's, with the same settings, where it is not."""
    proto = protocol(url)
    if proto is None or proto == remote.protocol:
        return remote
    return Remote(proto, remote.storage, remote.stats)


def read(remote: Remote, url: str, root: str, *, named: bool = False) -> Published | None:
    """The index at ``url`` (a URL of any store, or a local path) of the data under ``root``;
    None where there is none (or it may not be read, or is not an index).

    One GET. A store that cannot be reached is an error, as the listing after it would be.
    ``named``: the user named this index (``index_url``): one that cannot be read, or is not an
    index, is a :class:`StorageError` naming it, never passed over for a listing of the data."""
    where = redact(url)
    try:
        data = _read_local(url) if protocol(url) is None else reader(remote, url).cat(url)
    except (SourceError, StorageError) as exc:
        missing = isinstance(exc, SourceError) or not_found(exc)
        if named and missing:
            raise StorageError(
                f"{where}: the index named by index_url is not there (a typo? `tidal index URL --to {where}` "
                "writes one there)",
                url=where,
                permanent=True,
            ) from None
        if named:
            raise StorageError(f"the index named by index_url cannot be read: {exc}", url=where) from exc
        if missing or not isinstance(exc, StorageError) or exc.permanent:  # not there, or not ours to read
            return None
        at = redact(root)  # the dataset is what could not be opened: name it first
        raise StorageError(f"{at}: cannot open the dataset: {exc}", url=at, attempts=exc.attempts) from exc
    try:
        raw = loads(bytes(data))
    except ValueError:
        if named:
            raise StorageError(f"{where}: the index named by index_url is not JSON", url=where) from None
        log.warning("%s is not JSON: not used as the dataset's index", where)
        return None
    entries = Entries.parse(raw)
    if named and not entries.keys:
        raise StorageError(
            f"{where}: the index named by index_url holds no entry tidal reads (not an index written by "
            "`tidal index`, or of a version this tidal does not read)",
            url=where,
        )
    complete = isinstance(raw, dict) and raw.get("complete") is True and len(entries.keys) > 0
    return Published(url, root.rstrip("/"), entries, complete)


def _read_local(path: str) -> bytes:
    """A local index's bytes; a :class:`SourceError` or :class:`StorageError` that says why not."""
    try:
        with open(os.path.expanduser(path), "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise SourceError(f"{path}: no such file") from None
    except OSError as exc:
        raise StorageError(f"{path}: cannot read it: {exc.strerror or exc}", url=path, permanent=True) from None


def safe_key(key: str) -> bool:
    """Whether an index key is a plain relative path, which cannot leave the dataset's root."""
    if not key or key.startswith("/") or "\\" in key or "://" in key or not key.isprintable():
        return False
    return all(part not in ("", ".", "..") for part in key.split("/"))


def listed(
    published: Published, entry: str, format: str | None, keep: Callable[[str], bool]
) -> dict[str, FileStat] | None:
    """The files ``entry`` (the index's root itself, or a glob under it) names, as a complete index lists
    them, with the sizes and versions it holds; None where the index cannot say (not complete,
    a key that is not safe, facts that do not hold together, no file of the entry in it)."""
    root = published.root
    if not published.complete or not (entry.rstrip("/") == root or entry.startswith(root + "/")):
        return None
    rest = entry[len(root) :].lstrip("/")
    pattern = glob_pattern(rest, "/") if rest else None
    out: dict[str, FileStat] = {}
    sizes, versions = published.entries.columns["bytes"], published.entries.columns["version"]
    for i, key in enumerate(published.entries.keys):
        name, _, tag = key.partition("#")
        if tag != (format or ""):
            continue  # counted for another format= than this job's
        if not safe_key(name):
            log.warning("%s: a file key %r leads outside the dataset: the index is not used", published.url, key)
            return None
        parts = name.split("/")
        if pattern is not None:
            if not pattern.fullmatch(name) or parts[-1].startswith("."):
                continue
        elif any(p.startswith(".") for p in parts) or parts[-1].startswith("_") or not keep(parts[-1]):
            continue
        size, version = sizes[i], versions[i]
        if type(size) is not int or size < 0 or not (version is None or isinstance(version, str)):
            return None
        out[f"{root}/{name}"] = FileStat(size, version, indexed=True)
    return dict(sorted(out.items())) or None


def publish(remote: Remote, url: str, entries: Entries, *, complete: bool) -> str | None:
    """Write ``entries`` as the index at ``url``; None once written, else why it could not be."""
    try:
        reader(remote, url).put(url, entries.to_json(complete=complete))
    except StorageError as exc:
        return str(exc)
    return None


class Claim:
    """This node's claim to count the files of a dataset for the others (see the module).

    >>> claim = Claim(remote, index_url)
    >>> claim.take()          # "ours", "theirs" (another node counts) or "denied" (may not write)
    >>> with claim.held(): ...  # refreshed in a thread while we count; removed at the end
    """

    def __init__(self, remote: Remote, index_url: str):
        self._remote = reader(remote, index_url)
        self.url = index_url + ".claim"
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"

    def _read(self) -> dict | None:
        try:
            raw = json.loads(self._remote.cat(self.url))
        except (SourceError, StorageError, ValueError):
            return None
        return raw if isinstance(raw, dict) else None

    def _fresh(self, claim: dict | None) -> bool:
        at = claim.get("time") if claim else None
        return isinstance(at, (int, float)) and time.time() - at < CLAIM_FRESH_S

    def _write(self, exclusive: bool = False) -> bool:
        """Write our claim; False if the store refuses (or, ``exclusive``, if there is one)."""
        try:
            data = json.dumps({"owner": self.owner, "time": time.time()}).encode()
            return self._remote.put(self.url, data, exclusive=exclusive)
        except StorageError:
            return False

    def take(self) -> str:
        if self._remote.exclusive_puts:  # the store makes one writer win: no race
            return self._take_exclusive()
        current = self._read()
        if current is not None and current.get("owner") != self.owner and self._fresh(current):
            return "theirs"
        if not self._write():
            return "denied"
        time.sleep(1.0)  # two nodes that wrote at once: the last write wins, and both see which
        current = self._read()
        return "ours" if current is None or current.get("owner") == self.owner else "theirs"

    def _take_exclusive(self) -> str:
        for _ in range(2):
            try:
                data = json.dumps({"owner": self.owner, "time": time.time()}).encode()
                if self._remote.put(self.url, data, exclusive=True):
                    return "ours"
            except StorageError:
                return "denied"
            current = self._read()
            if current is not None and self._fresh(current):
                return "ours" if current.get("owner") == self.owner else "theirs"
            with contextlib.suppress(StorageError):  # stale: its node is gone; taken over by whoever creates it next
                self._remote.delete(self.url)
        return "theirs"

    def stale(self) -> bool:
        """Whether nobody holds a fresh claim: the node that counted is gone, or done."""
        return not self._fresh(self._read())

    def held(self) -> _Held:
        return _Held(self)

    def release(self) -> None:
        with contextlib.suppress(StorageError):  # else it goes stale on its own
            self._remote.delete(self.url)


class _Held:
    def __init__(self, claim: Claim):
        self._claim = claim
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._refresh, name="tidal-claim", daemon=True)

    def _refresh(self) -> None:
        while not self._stop.wait(CLAIM_REFRESH_S):
            self._claim._write()

    def __enter__(self) -> Claim:
        self._thread.start()
        return self._claim

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._claim.release()


def wait_for(
    remote: Remote, url: str, root: str, claim: Claim, covers: Callable[[Published], bool]
) -> Published | None:
    """The index another node is counting, once it is published and ``covers`` what we need;
    None once its claim goes stale without it (then we count: see :class:`Claim`)."""
    delay = 0.5
    while True:
        found = read(remote, url, root)
        if found is not None and covers(found):
            return found
        if claim.stale():  # gone, or done: it publishes before it lets go of the claim
            found = read(remote, url, root)
            return found if found is not None and covers(found) else None
        time.sleep(delay)
        delay = min(POLL_MAX_S, delay * 2)
