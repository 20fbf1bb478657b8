"""A dataset's files and what each holds, found once per job: listed (or read from the index
published beside them) and indexed.

Every rank of a job builds the same ``tidal.Dataset``. Over remote data under
``torch.distributed``, rank 0 lists and indexes it and the others take its answer through the
process group's store, so the store is listed once per job, not once per rank, and every rank
holds the same shard list. Rank 0 says it started; a rank that hears nothing of it for
:data:`START_WAIT_S` (rank 0 builds another dataset, or none) lists for itself, which is only
slower. Elsewhere, each process lists, and the processes of a machine index once, through the
shard cache's lock (:mod:`tidal.sources.counting`).

What crosses the store is plain data, as JSON (the shard list's columns, or an error's class
name and message), never a pickle: a rank never runs what it reads there. An answer that does
not read as one is not used: the rank lists for itself.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
import time
from collections.abc import Sequence
from typing import Any

from tidal import errors as tidal_errors
from tidal.errors import TidalError
from tidal.formats import Errors
from tidal.progress import Bar
from tidal.sources.counting import index
from tidal.sources.listing import listing
from tidal.sources.published import Sources
from tidal.sources.shards import NO_INFO, Shards
from tidal.storage.config import Storage
from tidal.storage.urls import is_remote

log = logging.getLogger("tidal")

START_WAIT_S = 120.0  # how long a rank waits to hear that rank 0 opens the same dataset

Source = Any  # a path, URL, glob or a list of them


def open_shards(
    src: Source, format: str | None, errors: Errors, storage: Storage, follow_links: bool, progress: bool = False
) -> tuple[Storage, Shards, bool, int]:
    """``(storage with the dataset's cache directory, its shards, whether they were listed from a
    published index, the bytes indexing them brought over the network here)``; ``progress``: a bar
    on stderr of the files indexed (by the rank that lists)."""
    entries = [src] if isinstance(src, (str, bytes)) or not isinstance(src, Sequence) else list(src)
    job = _job_store() if any(is_remote(str(e)) for e in entries) else None
    if job is None:
        return _open(src, format, errors, storage, follow_links, progress)
    store, rank = job
    key = _key(src, format, errors, storage, follow_links)
    if rank == 0:
        store.set(f"{key}/started", b"1")
        try:
            found = _open(src, format, errors, storage, follow_links, progress)
        except BaseException as exc:
            store.set(f"{key}/error", json.dumps([type(exc).__name__, str(exc)]).encode())
            raise
        try:
            listed = listing_json(found[1], found[2])
        except (TypeError, ValueError) as exc:  # a scan that recorded what JSON cannot hold: each rank lists
            log.warning("the dataset's listing is not plain data (%s): every rank lists it itself", exc)
            listed = b"{}"
        store.set(f"{key}/shards", listed)
        return found
    try:
        shards_indexed = _from_rank_0(store, key)
    except (RuntimeError, OSError) as exc:  # the store went away (its host ended): list alone
        log.warning("could not hear from rank 0 about the dataset (%s): this rank lists it itself", exc)
        shards_indexed = None
    if shards_indexed is None:
        return _open(src, format, errors, storage, follow_links)
    shards, indexed = shards_indexed
    return storage.for_files(shards.paths), shards, indexed, 0


def _open(
    src: Source, format: str | None, errors: Errors, storage: Storage, follow_links: bool, progress: bool = False
) -> tuple[Storage, Shards, bool, int]:
    sources = Sources()
    found = listing(src, storage, follow_links, format=format, sources=sources)
    storage = storage.for_files(found)  # the default cache directory: keyed by the dataset's URL
    bar = Bar(len(found), "index", "file", progress)
    try:
        shards = index(list(found), format, errors, storage, found, progress=bar.update, sources=sources)
    finally:
        bar.close()
    return storage, shards, any(s is not None and s.indexed for s in found.values()), sources.downloaded


def _job_store() -> tuple[Any, int] | None:
    """The store of torch.distributed's default process group and this rank, where one of
    several ranks is initialized (torch is never imported for this)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    dist = torch.distributed
    try:
        if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() < 2:
            return None
        return dist.distributed_c10d._get_default_store(), dist.get_rank()
    except (AttributeError, RuntimeError, ValueError):
        return None


_opened: dict[str, int] = {}  # how many datasets of each key this process opened: the n-th of every rank agree


def _key(src: Source, format: str | None, errors: Errors, storage: Storage, follow_links: bool) -> str:
    """The store key of this process's n-th dataset over ``src``: the same on every rank, though
    nodes may reach the store through other endpoints and keep other caches."""
    what = repr((src, format, errors if isinstance(errors, str) else "fn", follow_links, storage.index_url))
    digest = hashlib.sha1(what.encode()).hexdigest()[:16]
    n = _opened.get(digest, 0)
    _opened[digest] = n + 1
    return f"tidal/dataset/{digest}/{n}"


def _from_rank_0(store: Any, key: str) -> tuple[Shards, bool] | None:
    """What rank 0 found, once it has; None if it never says it opens this dataset."""
    delay, deadline = 0.01, time.monotonic() + START_WAIT_S
    while not store.check([f"{key}/started"]):
        if time.monotonic() > deadline:
            log.warning("rank 0 did not open the same dataset within %.0f s: this rank lists it itself", START_WAIT_S)
            return None
        time.sleep(delay)
        delay = min(0.5, delay * 2)
    delay = 0.01
    while True:
        if store.check([f"{key}/shards"]):
            found = parse_listing(store.get(f"{key}/shards"))
            if found is None:
                log.warning("rank 0's listing of the dataset did not read as one: this rank lists it itself")
            return found
        if store.check([f"{key}/error"]):
            name, message = _error(store.get(f"{key}/error"))
            kind = getattr(tidal_errors, name, None)
            if isinstance(kind, type) and issubclass(kind, TidalError):
                raise kind(message)
            raise TidalError(f"rank 0 could not open the dataset: {name}: {message}")
        time.sleep(delay)
        delay = min(1.0, delay * 2)


# -- what crosses the store: JSON ----------------------------------------------------------------


def listing_json(shards: Shards, indexed: bool) -> bytes:
    """The shard list as JSON: its columns (:attr:`Shards._ORDER`) and whether it came from a
    published index. What a scan records of a file (``infos``) is JSON already: the index keeps it."""
    columns: dict[str, Any] = {name: getattr(shards, name) for name in Shards._ORDER}
    columns["rows"], columns["bytes"] = shards.rows.tolist(), shards.bytes.tolist()
    columns["infos"] = [None if info is NO_INFO else info for info in shards.infos]
    return json.dumps({"shards": columns, "indexed": bool(indexed)}, separators=(",", ":")).encode()


def parse_listing(data: bytes) -> tuple[Shards, bool] | None:
    """What :func:`listing_json` wrote, or None where ``data`` is not that."""
    try:
        found = json.loads(data)
        columns = found["shards"]
        if not isinstance(columns, dict) or set(columns) != set(Shards._ORDER):
            return None
        kinds = {"paths": (str,), "formats": (str,), "rows": (int,), "bytes": (int,), "infos": (dict, type(None))}
        for name in Shards._ORDER:
            values = columns[name]
            allowed = kinds.get(name, (str, type(None)))
            if not isinstance(values, list) or not all(type(v) in allowed for v in values):
                return None
        columns["infos"] = [info or NO_INFO for info in columns["infos"]]
        return Shards(*(columns[name] for name in Shards._ORDER)), bool(found["indexed"])
    except (ValueError, TypeError, KeyError):  # not JSON, or not of that shape (Shards checks the lengths)
        return None


def _error(data: bytes) -> tuple[str, str]:
    """Rank 0's error: its class name and message, as ``open_shards`` wrote them."""
    try:
        name, message = json.loads(data)
        if isinstance(name, str) and isinstance(message, str):
            return name, message
    except (ValueError, TypeError):
        pass
    return "error", data.decode(errors="replace")
