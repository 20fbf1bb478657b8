"""The cache's space: what its directory takes on disk, the ledger that bounds it, LRU eviction.

Space is what ``du`` counts: every file and directory under the root, a download in progress
at its full size. Reservations are made under ``<root>/cache.lock`` against a ledger,
``<root>/cache.usage``, which never says less than what is on disk: a reservation adds to it
before the space is used, and nothing but a full scan lowers it. When a reservation does not
fit the ledger, the directory is scanned, stale ``.part`` files are swept, and the least
recently used entries no one holds are evicted down to a low-water mark (90% of the limit),
so that scans are rare even when the cache is full; the scan's total, plus two blocks in
which the directories may grow, becomes the ledger. A crash can only leave the ledger too
high, which the next scan corrects. Recency is the mtime of ``k.meta``, touched on every use.

Apart from :mod:`tidal.storage.cache`, which places entries, because counting and evicting
is its own concept, and :func:`footprint` is what the room planners need without a cache.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from tidal.errors import StorageError
from tidal.storage.disk import FILE_MODE, write_error
from tidal.storage.locks import EntryFiles, lock
from tidal.storage.stats import Stats

GLOBAL_LOCK = "cache.lock"
LEDGER = "cache.usage"
LOW_WATER = 0.9  # a scan that must evict evicts down to this share of the limit
_META_SLACK = 4096  # a .meta file on disk
_DIR_SHARE = 4096  # what an entry's six names may add to its directory: at most a block
_DIR_GROWTH = 2 * 4096  # kept free by every scan: lock files are made before their entry reserves room,
# and ext4 turns a full one-block directory into an indexed one of three blocks at once


def footprint(size: int) -> int:
    """What an entry of ``size`` bytes takes on disk: its blocks, its meta file, its names."""
    return -(-size // 4096) * 4096 + _META_SLACK + _DIR_SHARE


def _usage(st: os.stat_result) -> int:
    return max(st.st_size, st.st_blocks * 512)


def fixed_on_disk(root: Path) -> int:
    """Bytes under ``root`` that are no entry: the directories, the ledger, the remote indexes."""
    total = 0
    for d in (root, root / "shards", root / "index"):
        with contextlib.suppress(FileNotFoundError):
            total += _usage(os.stat(d))
            if d.name != "shards":
                total += sum(_usage(e.stat()) for e in os.scandir(d) if e.is_file())
    return total


def fixed(root: Path) -> int:
    """Bytes kept for what is not an entry, which no eviction frees: :func:`fixed_on_disk`
    and two blocks in which the directories may grow."""
    return fixed_on_disk(root) + _DIR_GROWTH


def scan(root: Path) -> dict[str, tuple[float, int, bool]]:
    """``{key: (last use, bytes on disk, complete)}`` of every entry under ``root``."""
    out: dict[str, tuple[float, int, bool]] = {}
    try:
        files = list(os.scandir(root / "shards"))
    except FileNotFoundError:
        return out
    coming: set[str] = set()  # entries whose meta file is still to come
    for e in files:
        key, _, kind = e.name.partition(".")
        try:
            st = e.stat()
        except FileNotFoundError:
            if kind != "part":
                continue
            try:  # renamed into place since the listing, which has not got the new name: count it
                st, kind = os.stat(EntryFiles(root, key).shard), "shard"
            except FileNotFoundError:
                continue
        used, size, complete = out.get(key, (0.0, 0, False))
        if kind == "meta":
            used, complete = st.st_mtime, True
        elif kind in ("part", "shard"):  # downloading, or renamed into place: the meta is written next
            used = max(used, st.st_mtime)
            coming.add(key)
        out[key] = (used, size + _usage(st), complete)
    for key in coming:
        used, size, complete = out[key]
        if not complete:  # counted now, or a scan between the rename and the meta undercounts a block
            out[key] = (used, size + _META_SLACK, complete)
    return out


def evict(root: Path, key: str, *, pinned: bool = False) -> bool:
    """Remove entry ``key`` if no one holds it (nor pins it, unless ``pinned``); whether it was removed."""
    f = EntryFiles(root, key)
    fd = lock(f.use, fcntl.LOCK_EX | fcntl.LOCK_NB)
    if fd is None:
        return False
    pin = None
    try:
        if not pinned:
            pin = lock(f.pin, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if pin is None:
                return False
        for p in (f.meta, f.shard, f.part, f.fetch, f.pin, f.use):  # the lock files last, still locked
            p.unlink(missing_ok=True)
    finally:
        if pin is not None:
            os.close(pin)
        os.close(fd)
    return True


class Ledger:
    """The cache's space, as seen under ``cache.lock``: an upper bound of what is on disk.

    ``scanned``: whether this process has recounted the cache yet; each process scans once,
    first, which sweeps what dead ones left. It is True once this ledger has scanned."""

    def __init__(self, root: Path, limit: int, stats: Stats, *, scanned: bool):
        self.root, self.limit, self.stats, self.scanned = root, limit, stats, scanned
        self.path = root / LEDGER
        try:
            self.used: int | None = int(self.path.read_text())
        except (OSError, ValueError):
            self.used = None  # first use, or damaged: scan
        if not scanned:
            self.used = None

    def fits(self, need: int, force: bool) -> bool:
        """Whether ``need`` more bytes fit, scanning and evicting when the ledger says they do not
        (pinned entries too, with ``force``, as far as ``need`` requires)."""
        if self.used is not None and self.used + need <= self.limit:
            return True
        self._scan(need, force)
        assert self.used is not None
        return self.used + need <= self.limit

    def _evict(self, key: str, *, count: bool, pinned: bool = False) -> bool:
        if not evict(self.root, key, pinned=pinned):
            return False
        if count:
            self.stats.add(evictions=1)
        return True

    def _scan(self, need: int, force: bool) -> None:
        """Recount the disk; sweep stale downloads; evict LRU entries no one holds or pins down to
        the low-water mark; with ``force``, then pinned ones until ``need`` fits."""
        if not self.path.exists():
            self._write(0)  # the ledger file takes space too: let the scan see it
        entries = sorted(scan(self.root).items(), key=lambda kv: kv[1][0])
        total = sum(e[1] for _, e in entries) + fixed(self.root)
        target = min(self.limit, int(self.limit * LOW_WATER)) - need
        gone: set[str] = set()
        for key, (_, size, complete) in entries:
            if complete and total <= target:
                continue  # stale .part files and lock files of dead processes go whatever the room
            if self._evict(key, count=complete):
                total -= size
                gone.add(key)
        for key, (_, size, complete) in entries:
            if not force or total + need <= self.limit:
                break
            if complete and key not in gone and self._evict(key, count=True, pinned=True):
                total -= size
        self.used = total
        self._write(total)
        self.scanned = True

    def evict_one(self, force: bool) -> bool:
        """Evict the least recently used complete entry that no one holds (nor pins, unless ``force``)."""
        for pinned in (False, True) if force else (False,):
            for key, (_, _, complete) in sorted(scan(self.root).items(), key=lambda kv: kv[1][0]):
                if complete and self._evict(key, count=True, pinned=pinned):
                    self.used = None
                    self._scan(0, force=False)
                    return True
        return False

    def add(self, nbytes: int) -> None:
        assert self.used is not None
        self.used += nbytes
        self._write(self.used)

    def _write(self, value: int) -> None:
        # in place, not by rename: a second file would take a block the ledger does not count;
        # a torn write reads as damaged, which only costs a scan
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, FILE_MODE)
            try:
                data = str(value).encode()
                os.pwrite(fd, data, 0)
                os.ftruncate(fd, len(data))
            finally:
                os.close(fd)
        except OSError as exc:
            raise StorageError(write_error(self.root, exc)) from None
