"""Writing under the cache directory: never world-writable, whole files, and what a failed write means.

Shared by the cache's entries, its ledger and the remote indexes kept beside them, so that
every file tidal leaves there has the same modes and every failed write the same message.
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

DIR_MODE = 0o755  # never group- or world-writable, whatever the umask
FILE_MODE = 0o644


def mkdirs(path: Path) -> None:
    """``mkdir -p`` that makes every level it creates ``DIR_MODE``, whatever the umask allows beyond it."""
    missing = []
    while not path.is_dir():
        missing.append(path)
        if path.parent == path:
            break
        path = path.parent
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):
            d.mkdir(mode=DIR_MODE)


def write_file(path: Path, data: bytes) -> None:
    """``data`` written to ``path`` whole (created ``FILE_MODE``, or truncated)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def write_error(root: Path, exc: OSError) -> str:
    """What a failed write into the cache directory means, naming it."""
    why = exc.strerror or str(exc)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"the disk of the shard cache {root} is full ({why}): free space there, or set a cache_limit it can hold"
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"the shard cache {root} is not writable ({why}): give Storage(cache_dir=...) a directory this process can write"
    return f"cannot write to the shard cache {root}: {why}"
