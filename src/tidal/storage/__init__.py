"""Remote data: fsspec access with timeouts and retries, and a bounded local shard cache.

A dataset whose files are URLs (``s3://``, ``gs://``, ``az://``, ``https://``, ``hf://``, any
fsspec protocol) reads them through this package; local paths never touch it.

- :mod:`~tidal.storage.config`: :class:`Storage`, the settings (storage_options, cache
  directory and limit, timeout, retries, prefetch), plain data that travels to workers.
- :mod:`~tidal.storage.fs`: a URL's filesystem and the requests tidal makes: list, stat,
  ranged GET; :mod:`~tidal.storage.clients`: the clients it builds (s3fs, obstore, gcsfs,
  adlfs, the Hub), their own retries off; :mod:`~tidal.storage.ranges`: what a ranged GET's
  answer says (a server that ignores ``Range``); :mod:`~tidal.storage.refusals`: what a
  store's refusal, or "not found", means.
- :mod:`~tidal.storage.retry`: which errors are transient; backoff with jitter.
- :mod:`~tidal.storage.cache`: the on-disk cache: atomic placement, hash and size checks;
  :mod:`~tidal.storage.eviction`: its space, a ledger under a limit and LRU eviction;
  :mod:`~tidal.storage.locks`: its ``flock`` locks that die with their process;
  :mod:`~tidal.storage.disk`: its modes and writes; :mod:`~tidal.storage.digests`: the
  hashes downloads are checked against.
- :mod:`~tidal.storage.fetch`: downloads into the cache in parallel parts; ranged reads.
- :mod:`~tidal.storage.prefetch`: one reader's shards, fetched ahead and held while used.

Cloud libraries are imported only when a URL of theirs is first used.
"""

from __future__ import annotations

from tidal.storage.config import Storage, parse_size
from tidal.storage.retry import Retry
from tidal.storage.urls import is_remote

__all__ = ["Retry", "Storage", "is_remote", "parse_size"]
