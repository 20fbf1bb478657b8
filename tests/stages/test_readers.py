"""OpenReaders: a read stage's open readers, never closed while a read holds them, few kept idle."""

from __future__ import annotations

import errno
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tidal.formats import Piece
from tidal.formats.bad_data import exhausted
from tidal.stages.readers import NotOpened, OpenReaders


class FakeReader:
    def __init__(self, index: int, log: list):
        self.index, self.closed, self._log = index, False, log

    def read(self, start: int, stop: int) -> Piece:
        time.sleep(0.001)  # long enough for the other threads to open and give back theirs
        if self.closed:
            raise ValueError(f"reader {self.index}: Invalid operation on closed file")
        return Piece(list(range(start, stop)))

    def close(self) -> None:
        self.closed = True
        self._log.append(self.index)


def make(limit: int = 4) -> tuple[OpenReaders, list[int], list[int], list[FakeReader]]:
    closed_log: list[int] = []
    released: list[int] = []
    made: list[FakeReader] = []

    def open_reader(i: int) -> FakeReader:
        if i < 0:
            raise OSError(f"file {i} cannot be opened")
        made.append(FakeReader(i, closed_log))
        return made[-1]

    return OpenReaders(open_reader, released.append, limit=limit), closed_log, released, made


def test_readers_in_use_are_never_closed_however_many_files_a_block_reads() -> None:
    readers, closed, released, made = make(limit=4)

    def read(i: int) -> list:
        with readers.using(i) as r:
            return r.read(i, i + 2).table

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(read, range(300)))
    assert got == [[i, i + 1] for i in range(300)]
    assert len(readers) == 4  # the idle ones within the limit
    assert sorted(closed) == sorted(released) and len(closed) == 296
    assert len(made) == 300


def test_an_idle_reader_is_reused_and_the_least_recent_closed() -> None:
    readers, closed, _, made = make(limit=2)
    for i in (0, 1, 0, 2):
        with readers.using(i):
            pass
    assert [r.index for r in made] == [0, 1, 2]  # 0 was reused
    assert closed == [1]  # the least recently used idle reader went
    assert sorted(readers.indices()) == [0, 2]


def test_a_failed_read_closes_its_reader_and_a_failed_open_says_why() -> None:
    readers, closed, released, _ = make()
    with pytest.raises(RuntimeError), readers.using(3):
        raise RuntimeError("bad bytes")
    assert closed == [3] and released == [3] and len(readers) == 0
    with pytest.raises(NotOpened) as info:
        readers.take(-1)
    assert isinstance(info.value.cause, OSError) and "file -1" in str(info.value)


def test_close_idle_keeps_what_is_asked_and_close_ends_everything() -> None:
    readers, closed, _, _ = make(limit=10)
    for i in range(5):
        with readers.using(i):
            pass
    held = readers.take(7)
    readers.close_idle(lambda i: i % 2 == 0)
    assert sorted(closed) == [1, 3] and not held.closed  # a reader in use is not idle
    readers.close()
    assert sorted(closed) == [0, 1, 2, 3, 4, 7] and len(readers) == 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_closes_the_parents_readers_and_opens_its_own() -> None:
    readers, _, _, made = make()
    with readers.using(1):
        pass
    lock_held = threading.Event()
    release = threading.Event()

    def hold() -> None:  # a thread of the parent holds the lock while the fork happens
        with readers._lock:
            lock_held.set()
            release.wait(5)

    t = threading.Thread(target=hold)
    t.start()
    lock_held.wait(5)
    pid = os.fork()
    if pid == 0:  # the child: the lock's holder is not here; it must not wait for it
        ok = False
        try:
            with readers.using(1) as r:
                ok = r is made[-1] and len(made) == 2 and made[0].closed
        finally:
            os._exit(0 if ok else 1)
    release.set()
    t.join()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert not made[0].closed  # the parent's own reader is untouched


def test_a_machine_out_of_file_descriptors_is_never_taken_for_a_bad_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under errors="skip" too: the file is fine, so skipping it would lose its records."""
    import tidal
    from tidal.formats import parquet

    for k in range(3):
        pq.write_table(pa.table({"id": [k]}), tmp_path / f"f{k}.parquet")
    original = parquet.ParquetReader.read

    def read(self: Any, start: int, stop: int) -> Piece:
        if self._path.endswith("f1.parquet"):
            raise OSError(errno.EMFILE, "Too many open files")
        return original(self, start, stop)

    monkeypatch.setattr(parquet.ParquetReader, "read", read)
    with pytest.raises(tidal.StorageError, match=r"f1\.parquet: out of file descriptors"):
        list(tidal.Dataset(tmp_path, errors="skip"))

    def scan(path: str, compression: Any, file: Any = None) -> dict:
        raise tidal.FormatError(f"{path}: not a readable Parquet file: [Errno 24] Too many open files")

    (tmp_path / "f3.parquet").write_bytes((tmp_path / "f0.parquet").read_bytes())
    monkeypatch.setattr(parquet, "scan", scan)
    with pytest.raises(tidal.StorageError, match=r"f3\.parquet: out of file descriptors .* while indexing"):
        tidal.Dataset(tmp_path, errors="skip")
    monkeypatch.undo()
    assert sorted(r["id"] for r in tidal.Dataset(tmp_path)) == [0, 0, 1, 2]  # nothing about f3 was remembered


def test_what_ran_out_is_read_from_the_error_or_its_cause() -> None:
    assert exhausted(OSError(errno.EMFILE, "x")) == "file descriptors (ulimit -n)"
    assert exhausted(MemoryError()) == "memory"
    assert exhausted(OSError(errno.ENOSPC, "x")) == "disk space"
    wrapped = ValueError("read failed")
    wrapped.__cause__ = OSError(errno.ENFILE, "x")
    assert exhausted(wrapped) == "file descriptors"
    assert exhausted(ValueError("Failed to open local file. Detail: [errno 24] Too many open files"))
    assert exhausted(OSError(errno.ENOENT, "x")) is None and exhausted(ValueError("errno 240")) is None


@pytest.mark.parametrize("errors", ["raise", "skip"])
def test_a_slice_read_as_fewer_records_than_it_holds_is_an_error_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, errors: str
) -> None:
    """A reader (or a file changed since it was counted) that gives a slice fewer rows than it
    holds would lose records without a word: the block says so, naming the file and rows."""
    import tidal
    from tidal.formats import parquet

    for k in range(2):
        pq.write_table(pa.table({"id": list(range(10 * k, 10 * k + 10))}), tmp_path / f"f{k}.parquet")
    original = parquet.ParquetReader.read

    def read(self: Any, start: int, stop: int) -> Piece:
        piece = original(self, start, stop)
        if self._path.endswith("f1.parquet"):
            return Piece(piece.table.slice(1))
        return piece

    monkeypatch.setattr(parquet.ParquetReader, "read", read)
    with pytest.raises(tidal.FormatError, match=r"f1\.parquet: rows 0 to 10 read as 9 records, not 10"):
        list(tidal.Dataset(tmp_path, errors=errors).shuffle(seed=0))
