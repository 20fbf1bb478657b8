"""A URL's filesystem, and the few requests tidal makes to it: list, stat, ranged GET.

Any fsspec protocol works (``s3://``, ``gs://``, ``az://``, ``http(s)://``, ``hf://``, ...);
``storage_options`` go to the filesystem as they are. :class:`Remote` is a per-process
handle: it builds its client lazily, in the process that uses it, because clients hold
event loops and connection pools that do not survive ``fork`` (DataLoader workers).

Every request has a timeout (``Storage.timeout``; for fsspec's async filesystems it is
enforced around the request itself, so it holds for any protocol) and goes through
:func:`tidal.storage.retry.call`, so retries are counted once, in one place: the clients tidal
builds have their own retries off (:mod:`tidal.storage.clients`). A ranged GET's answer is
checked by :mod:`tidal.storage.ranges` (a server that ignores ``Range`` sends the whole object),
and what a store's refusal or absence means is read by :mod:`tidal.storage.refusals`.

``s3://`` has two clients. s3fs lists and indexes, and reads wherever obstore cannot.
obstore reads shard data where it is a drop-in: its fsspec layer moves whole shards
faster than s3fs, and its own API (which tidal calls for ranged GETs: no shared event
loop, no copy of the body) faster still (``bench/bench_s3.py``). ``"auto"`` takes it when
the ``storage_options`` carry credentials (or ``anon``) and a region or an endpoint in a form
obstore takes (it knows no AWS profiles or SSO), and when this process is not a fork of one
in which obstore's runtime already ran (:func:`tidal.storage.clients.obstore_safe`): that runtime does not survive
``fork``, which is how torch starts DataLoader workers. Listing always uses s3fs, so the
process that builds a dataset never starts obstore before forking its workers.
"""

from __future__ import annotations

import glob as _glob
import os
import posixpath
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from tidal.errors import MissingDependency, SourceError, StorageError, missing
from tidal.pools import Threads
from tidal.storage import logs, ranges
from tidal.storage.clients import (
    adlfs_client,
    aiohttp_timeout,
    gcsfs_client,
    hub_client,
    obstore_client,
    obstore_options,
    obstore_safe,
    s3fs_client,
)
from tidal.storage.config import Storage
from tidal.storage.refusals import already_exists, bucket_gone, bucket_of, explain, not_found
from tidal.storage.retry import call, redact
from tidal.storage.stats import Stats

_VERSION_KEYS = ("ETag", "etag", "e_tag", "generation", "VersionId", "version_id", "blob_id", "md5Hash")
_MTIME_KEYS = ("LastModified", "last_modified", "mtime", "updated", "modified", "last_commit", "created")


@dataclass(frozen=True)
class FileStat:
    """What a listing says about a remote file: its size and a token that changes with its content."""

    size: int
    version: str | None
    indexed: bool = False  # taken from a published index, not from the store itself: checked on download


def _version(info: dict) -> str | None:
    for keys in (_VERSION_KEYS, _MTIME_KEYS):
        for k in keys:
            v = info.get(k)
            if v not in (None, ""):
                return str(v).strip('"')
    return None


class Remote:
    """One process's client for one protocol, with tidal's timeouts and retries.

    >>> r = Remote("s3", Storage(options={"anon": True}))
    >>> r.expand("s3://bucket/data/*.parquet")     # {url: FileStat}
    >>> r.cat("s3://bucket/data/a.parquet", 0, 1024)
    """

    def __init__(self, proto: str, storage: Storage, stats: Stats | None = None, *, data: bool = False):
        self.protocol = proto
        self.storage = storage
        self.stats = stats if stats is not None else Stats()
        self.data = data  # reads shard data (else: lists and indexes)
        self._pid = os.getpid()

    @cached_property
    def backend(self) -> str:
        """``"s3fs"``, ``"obstore"`` or ``"fsspec"`` (any other protocol)."""
        if self.protocol not in ("s3", "s3a"):
            return "fsspec"
        if not self.data or self.storage.backend == "s3fs":
            return "s3fs"
        if self.storage.backend == "obstore":
            if not obstore_safe():
                raise StorageError(
                    "backend='obstore' cannot run in a process forked from one where obstore already ran "
                    "(its runtime does not survive fork): start DataLoader workers with "
                    "multiprocessing_context='spawn' or 'forkserver', or use backend='auto'"
                )
            return "obstore"
        auto = obstore_options(self.storage.options, strict=True) is not None and obstore_safe()
        return "obstore" if auto else "s3fs"

    @property
    def fs(self) -> Any:
        if self._pid != os.getpid() or "_fs" not in self.__dict__:
            self._pid = os.getpid()
            self.__dict__["_fs"] = self._build()
        return self.__dict__["_fs"]

    def _build(self) -> Any:
        try:
            import fsspec
        except ImportError as exc:  # pragma: no cover - fsspec is a dependency
            raise StorageError(f"reading {self.protocol}:// URLs needs fsspec: {exc}") from None
        options = dict(self.storage.options)
        try:
            if self.backend == "obstore":
                fs = obstore_client(options, self.storage)
            elif self.backend == "s3fs":
                fs = s3fs_client(options, self.storage)
            elif self.protocol in ("gs", "gcs"):
                fs = gcsfs_client(options, self.storage)
            elif self.protocol in ("az", "abfs", "abfss"):
                fs = adlfs_client(options, self.storage)
            elif self.protocol == "hf":
                fs = hub_client(options, self.storage)
            else:
                if self.protocol in ("http", "https") and "client_kwargs" not in options:
                    options["client_kwargs"] = {"timeout": aiohttp_timeout(self.storage)}
                fs = fsspec.filesystem(self.protocol, **options)
            logs.guard(self.storage.options)  # the client's libraries are imported now: their loggers exist
            return fs
        except ImportError as exc:
            if isinstance(exc, MissingDependency):
                raise
            extras = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "az": "azure", "abfs": "azure"}
            extras.update(abfss="azure", hf="hf", http="http", https="http")
            extra = extras.get(self.protocol)
            cause: BaseException | None = exc  # fsspec raises "Install s3fs to access S3" from the import's error
            for _ in range(8):
                if cause is None or getattr(cause, "name", None):
                    break
                cause = cause.__cause__ or cause.__context__
            if isinstance(cause, ImportError) and cause.name:
                raise missing(cause.name, f"reading {self.protocol}:// URLs", cause, extra) from None
            hint = f": pip install 'tidal[{extra}]'" if extra else ""
            raise MissingDependency(
                f"reading {self.protocol}:// URLs needs a package that is not installed ({exc}){hint}"
            ) from None
        except ValueError as exc:
            raise StorageError(f"{self.protocol}://: unknown protocol or bad storage_options: {exc}") from None

    def path(self, url: str) -> str:
        """The filesystem's own name for ``url``."""
        return url if self.backend == "obstore" else self.fs._strip_protocol(url)

    def url(self, path: str) -> str:
        """The full URL of a path the filesystem returned, in the scheme the dataset was named
        with (adlfs writes ``abfs://`` for ``az://`` URLs)."""
        url = self.fs.unstrip_protocol(path)
        scheme, sep, rest = url.partition("://")
        protocols = self.fs.protocol if isinstance(self.fs.protocol, (tuple, list)) else (self.fs.protocol,)
        if sep and scheme != self.protocol and scheme in protocols and self.protocol in protocols:
            return f"{self.protocol}://{rest}"
        return url

    def _request(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """``fs.<name>(...)``; for async filesystems on fsspec's loop, under the request timeout."""
        fs = self.fs
        if getattr(fs, "async_impl", False) and hasattr(fs, f"_{name}"):
            from fsspec.asyn import sync

            return sync(fs.loop, getattr(fs, f"_{name}"), *args, timeout=self.storage.timeout, **kwargs)
        return getattr(fs, name)(*args, **kwargs)

    def cat(
        self,
        url: str,
        start: int | None = None,
        end: int | None = None,
        *,
        size: int | None = None,
        check: Callable[[BaseException], None] | None = None,
    ) -> bytes:
        """Bytes ``[start, end)`` of ``url``, or all ``size`` of them; retried, never short.
        ``check``: sees each failed try's error first (see :func:`tidal.storage.retry.call`)."""
        at, data = self.get(url, start, end, size=size, check=check)
        return data if start is None or at == start else data[start - at : end]

    def get(
        self,
        url: str,
        start: int | None = None,
        end: int | None = None,
        *,
        size: int | None = None,
        check: Callable[[BaseException], None] | None = None,
    ) -> tuple[int, bytes]:
        """``(offset, data)``: bytes ``[start, end)`` of ``url`` at ``start``, as :meth:`cat` reads
        them, or, from a server that ignores ``Range`` (it answers ``200`` with the whole object,
        as Python's ``http.server`` and many static servers do), the whole object at 0: the
        caller may keep all of it rather than ask again. Such a server's host is remembered
        (:meth:`ignores_ranges`); a body longer than asked is never retried as if cut short."""

        def once() -> tuple[int, bytes]:
            if start is None:  # s3fs asks for the size first (a HEAD) to read in parallel parts: not here
                extra = {"max_concurrency": 1} if self.backend == "s3fs" else {}
                data = self._request("cat_file", self.path(url), **extra)
            else:
                data = self._request("cat_file", self.path(url), start=start, end=end)
            return ranges.answered(url, data, start, end, size)

        what = _what(start, end)
        at, data = self._call(once, url, what, stats=self.stats, check=check)
        self.stats.add(bytes_downloaded=len(data), requests=1)
        return at, data

    def ignores_ranges(self, url: str) -> bool:
        """Whether the server of ``url`` answered a ranged GET of this process with the whole object:
        its files are read whole, in one GET each."""
        return ranges.ignored(url)

    def honours_ranges(self, url: str) -> bool:
        """Whether the server of ``url`` answered a ranged GET of this process with only the range."""
        return ranges.honoured(url)

    @property
    def exclusive_puts(self) -> bool:
        """Whether :meth:`put` can refuse to replace an object (S3's conditional write)."""
        return self.backend == "s3fs"

    def put(self, url: str, data: bytes, *, exclusive: bool = False) -> bool:
        """Write ``data`` as the object ``url`` (whole, replacing it); retried. ``exclusive``:
        only if there is no such object yet (where :attr:`exclusive_puts`), False if there is."""
        extra = {"mode": "create"} if exclusive and self.exclusive_puts else {}
        try:
            self._call(lambda: self._request("pipe_file", self.path(url), data, **extra), url, "PUT")
        except StorageError as exc:
            if extra and already_exists(exc):
                return False
            raise
        self.stats.add(requests=1)
        return True

    def delete(self, url: str) -> None:
        """Remove the object ``url``; one that is not there is no error."""
        try:
            self._call(lambda: self._request("rm_file", self.path(url)), url, "DELETE")
        except StorageError as exc:
            if not not_found(exc):
                raise
        self.stats.add(requests=1)

    def stat(self, url: str) -> FileStat:
        info = self._info(url)
        if info.get("type") == "directory":
            raise StorageError(f"{redact(url)}: is a directory, not a file", url=redact(url))
        return FileStat(int(info["size"]), _version(info))

    def _info(self, url: str, *, named: bool = False) -> dict:
        """What the store says of ``url``; ``named``: the user named it, so where it is not
        there, whether its bucket exists is worth a request more."""
        try:
            return self._call(lambda: self._request("info", self.path(url)), url, "HEAD", stats=self.stats)
        except StorageError as exc:
            if not_found(exc):
                raise self._missing(url, exc, ask=named) from None
            raise

    def _call(
        self,
        fn: Callable[[], Any],
        url: str,
        what: str,
        *,
        stats: Stats | None = None,
        check: Callable[[BaseException], None] | None = None,
    ) -> Any:
        """``fn()`` under tidal's retries (:func:`tidal.storage.retry.call`); a request the store
        refused (403, 401, no credentials) is a :class:`StorageError` that says so in words."""
        try:
            return call(fn, url=url, what=what, retry=self.storage.retry, stats=stats, check=check)
        except StorageError as exc:
            explained = explain(exc, url, what)
            if explained is exc:
                raise
            raise explained from exc.__cause__

    def _missing(self, url: str, exc: BaseException, *, ask: bool = False) -> SourceError:
        """The :class:`SourceError` of a ``url`` the store says is not there: that its bucket
        does not exist, where that is what is missing, else that the object does not."""
        return SourceError(self.no_bucket(url, exc, ask=ask) or f"{redact(url)}: no such file or directory")

    def no_bucket(self, url: str, exc: BaseException, *, ask: bool = True) -> str | None:
        """That the bucket of ``url`` does not exist, if so: as the store said in ``exc``, or
        (``ask``, where its client does not say) asked of it, one request on this path only."""
        bucket = bucket_of(url)
        if bucket is None:
            return None
        gone = bucket_gone(exc) or url.rstrip("/") == bucket
        if not gone and ask:
            try:
                self._call(lambda: self._request("info", self.path(bucket)), bucket, "HEAD")
            except StorageError as asked:
                gone = not_found(asked)
        if not gone:
            return None
        kind = "container" if self.protocol in ("az", "abfs", "abfss") else "bucket"
        return f"{redact(url)}: the {kind} {bucket.split('://', 1)[1]!r} does not exist"

    _no_bucket = no_bucket  # the name storage/fetch.py calls it by

    def expand(self, entry: str, keep: Any = None) -> dict[str, FileStat]:
        """The files ``entry`` names: a file, a directory (searched recursively, names starting
        with ``.`` or ``_`` skipped, only those ``keep(name)`` accepts) or a glob; sorted by URL."""
        path = self.path(entry)
        where = entry.split("://", 1)[1]
        if self.protocol in ("http", "https"):
            where = where.split("?", 1)[0]  # a query string (a signed URL's) is not a pattern
        if _glob.has_magic(where):
            try:
                found = self._call(lambda: self.fs.glob(path, detail=True), entry, "LIST")
            except StorageError as exc:
                if not_found(exc):
                    raise self._missing(entry, exc, ask=True) from None
                raise
            files = {k: v for k, v in found.items() if v.get("type", "file") != "directory"}
            files = {k: v for k, v in files.items() if not posixpath.basename(k.rstrip("/")).startswith(".")}
            if not files:
                why = self.no_bucket(entry, FileNotFoundError(entry))
                raise SourceError(why or f"{redact(entry)}: the pattern matches no file")
        else:
            name = where.rstrip("/").rsplit("/", 1)[-1]
            files = {}
            web = self.protocol in ("http", "https")
            unread = keep is not None and not keep(name)  # no ending tidal reads: a directory, or a page of links
            denied: StorageError | None = None
            if not web and (entry.endswith("/") or keep is None or unread):
                try:
                    files = self._find(entry, keep)  # named like a directory: one LIST, no HEAD first
                except StorageError as exc:
                    if not exc.permanent:
                        raise  # not there as a directory: what it is, the stat below says
                    denied = None if not_found(exc) else exc  # may not list it: may still read it
            if not files:
                try:
                    info = self._info(entry, named=True)
                except StorageError as exc:
                    if denied is not None and (entry.endswith("/") or isinstance(exc, SourceError) or not_found(exc)):
                        raise denied from None  # named as a directory: that it may not be listed is the news
                    raise
                page = web and unread and info.get("mimetype") == "text/html"  # http://host/web: the page of web/
                if info.get("type") == "directory" or entry.endswith("/") or page:  # http(s): a page of links
                    files = self._find(entry, keep)
                    if not files:
                        raise SourceError(f"{redact(entry)}: the directory holds no file tidal can read")
                else:
                    files = {path: info}
        unsized = [k for k, v in files.items() if v.get("size") is None]  # http(s) listings: HEAD each
        if unsized:
            with Threads(min(16, len(unsized))) as pool:
                files.update(zip(unsized, pool.map(lambda k: self._info(self.url(k)), unsized), strict=True))
        out = {self.url(k): FileStat(int(v["size"]), _version(v)) for k, v in files.items()}
        return dict(sorted(out.items()))

    def _find(self, entry: str, keep: Any) -> dict[str, dict]:
        """The files under the directory ``entry`` (names starting with ``.`` or ``_`` skipped,
        only those ``keep(name)`` accepts), as the listing describes them."""
        path = self.path(entry)
        found = self._call(lambda: self.fs.find(path, detail=True), entry, "LIST")
        base = path.rstrip("/")
        files = {}
        for k, v in found.items():
            rel = k[len(base) :].lstrip("/") if k.startswith(base) else posixpath.basename(k)
            parts = rel.split("/")
            if any(p.startswith(".") for p in parts) or parts[-1].startswith("_"):
                continue
            if v.get("type", "file") == "file" and (keep is None or keep(parts[-1])):
                files[k] = v
        return files


def _what(start: int | None, end: int | None) -> str:
    """A GET of bytes ``[start, end)``, in words no one reads as an inclusive range."""
    if start is None:
        return "GET"
    if end is None:
        return f"GET from offset {start:,} to the end"
    return f"GET of {end - start:,} bytes at offset {start:,}"


_not_found = not_found  # the name storage/fetch.py imports it by
