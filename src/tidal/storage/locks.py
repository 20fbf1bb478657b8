"""The cache's locks: an entry's files by name, and ``flock`` locks that die with their process.

An entry ``k`` is up to six files in ``<root>/shards/`` (see :mod:`tidal.storage.cache`);
three of them are only ever locked: ``k.use`` (shared by readers, exclusive to evict),
``k.fetch`` (exclusive to the one downloader) and ``k.pin`` (shared by a prefetch that reads
it soon). The kernel drops a ``flock`` when its process dies, so ``kill -9`` leaves nothing
that blocks anyone.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from tidal.storage.disk import DIR_MODE, FILE_MODE


class EntryFiles:
    """The paths of entry ``key``'s files under ``root``."""

    def __init__(self, root: Path, key: str):
        d = root / "shards"
        self.dir = d
        self.shard, self.meta, self.part = d / f"{key}.shard", d / f"{key}.meta", d / f"{key}.part"
        self.use, self.fetch, self.pin = d / f"{key}.use", d / f"{key}.fetch", d / f"{key}.pin"


def lock(path: Path, how: int) -> int | None:
    """An fd of ``path`` locked with ``how``; None if ``LOCK_NB`` and it is busy.

    The lock is taken on the file the path names *after* locking: an evictor may have
    unlinked the path while we waited, and a lock on an unlinked file protects nothing.
    """
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, FILE_MODE)
        try:
            fcntl.flock(fd, how)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)


def hold(f: EntryFiles) -> int:
    """An fd holding ``f``'s ``use`` lock shared (its directory made first, if it went)."""
    f.dir.mkdir(mode=DIR_MODE, exist_ok=True)
    fd = lock(f.use, fcntl.LOCK_SH)
    assert fd is not None
    return fd
