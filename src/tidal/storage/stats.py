"""Counters of remote I/O, shared by the threads of one reader and read by ``stats()``."""

from __future__ import annotations

from tidal import fork_safe

FIELDS = (
    "bytes_downloaded",  # bytes that came over the network: whole shards, parts, ranges
    "requests",  # requests that returned data
    "retries",  # requests tried again after a transient error
    "cache_hits",  # shards the reader opened that were in the local cache before it asked
    "cache_misses",  # shards the reader opened that had to be downloaded first (here or by another process)
    "evictions",  # shards this process removed from the cache to make room
    "corrupt",  # downloads or cached files rejected by a size or hash check
    "io_wait_s",  # seconds the reader waited for a shard or a remote range
)


class Stats:
    """Thread-safe counters; ``dict()`` is a snapshot with every field of :data:`FIELDS`."""

    def __init__(self) -> None:
        self._lock = fork_safe.Lock()
        self._values: dict[str, float] = dict.fromkeys(FIELDS, 0)

    def add(self, **counts: float) -> None:
        with self._lock:
            for k, v in counts.items():
                self._values[k] += v

    def dict(self) -> dict[str, float]:
        with self._lock:
            out = dict(self._values)
        out["io_wait_s"] = round(out["io_wait_s"], 4)
        return out
