"""What a shard's bytes hash to: the ``"algo:hex"`` digests that indexes record and downloads are checked against.

Apart from the cache because the writers (a converted shard's hash in its index) and the
fetcher (hashing parts as they arrive) need them without a cache.
"""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path
from typing import Any

from tidal.errors import needs


def file_digest(path: Path, algorithm: str) -> str:
    """``"algo:hex"`` of a file's bytes."""
    with open(path, "rb") as fh:
        return f"{algorithm}:{hashlib.file_digest(fh, lambda: hasher(algorithm)).hexdigest()}"


def hasher(algorithm: str) -> Any:
    """A hash object: ``xxh3_128``, ``xxh64`` (xxhash, which the remote extras install) or any of hashlib's."""
    if algorithm.startswith("xxh"):
        xxhash = needs("xxhash", f"checking shards hashed with {algorithm}", package="xxhash")
        return getattr(xxhash, algorithm)()
    return hashlib.new(algorithm)


def default_algorithm() -> str:
    """What tidal hashes downloads with when the index names no algorithm: xxh3-128 (16 GB/s)
    where xxhash is installed, else SHA-256 (1.5 GB/s): on a fast link, hashing is a real cost."""
    return "xxh3_128" if importlib.util.find_spec("xxhash") is not None else "sha256"
