"""A reader alone in its process reads a block's Parquet files side by side in threads: the same
records, and the same errors, counts, logs and calls of an ``errors=`` function, in the same
order, as reading them one by one (``TIDAL_READ_THREADS=1``)."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tidal


def _corpus(root: Path) -> Path:
    """Six Parquet files of several row groups; one with a zeroed row group, one with a string
    that is not UTF-8, one whose footer is damaged after it was indexed (it cannot be opened)."""
    root.mkdir()
    for f in range(6):
        ids = list(range(f * 1000, f * 1000 + 90))
        text = pa.array([f"row {i} ".encode() * 3 for i in ids], pa.binary())
        if f == 2:
            text = pa.array(
                [b"bad \xff" if i % 45 == 7 else t.as_py() for i, t in zip(ids, text, strict=True)], pa.binary()
            )
        path = root / f"part-{f}.parquet"
        pq.write_table(pa.table({"id": ids, "text": text.view(pa.string())}), path, row_group_size=20)
        if f == 1:
            col = pq.ParquetFile(path).metadata.row_group(2).column(1)
            start = col.dictionary_page_offset or col.data_page_offset
            data = bytearray(path.read_bytes())
            data[start : start + col.total_compressed_size] = b"\x00" * col.total_compressed_size
            path.write_bytes(bytes(data))
    tidal.Dataset(root)  # indexed whole; then part-4's footer is damaged, its size and time kept
    damaged = root / "part-4.parquet"
    stat = damaged.stat()
    damaged.write_bytes(damaged.read_bytes()[:-4] + b"XXXX")
    os.utime(damaged, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # the index cannot see it
    return root


def _read(root: Path, threads: str, monkeypatch: pytest.MonkeyPatch, caplog: Any, errors: Any) -> tuple:
    monkeypatch.setenv("TIDAL_READ_THREADS", threads)
    caplog.clear()
    seen_threads = set()
    ds = tidal.Dataset(root, errors=errors).shuffle(seed=3, block_size=200, shards_per_block=4)
    it = ds.iterator()
    records = []
    for rec in it:
        records.append(rec)
        seen_threads |= {t.name.split("_")[0] for t in threading.enumerate() if t.name.startswith("tidal-read_")}
    stats = {k: it.stats()[k] for k in ("rows_read", "skipped", "bad_files")}
    logged = [r.getMessage() for r in caplog.records if r.name == "tidal"]
    return records, stats, logged, seen_threads


def test_threads_read_the_same_records_and_skip_the_same_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    root = _corpus(tmp_path / "data")
    caplog.set_level(logging.WARNING, logger="tidal")
    one = _read(root, "1", monkeypatch, caplog, "skip")
    four = _read(root, "4", monkeypatch, caplog, "skip")
    assert one[3] == set() and four[3] == {"tidal-read"}  # threads only where asked for
    assert four[0] == one[0]
    assert four[1] == one[1]
    assert one[1]["skipped"] > 0 and one[1]["bad_files"] >= 1
    assert four[2] == one[2] and len(one[2]) == 3  # one warning per bad file, in the same order

    calls: dict[str, list[str]] = {"1": [], "4": []}
    for threads, seen in calls.items():
        _read(root, threads, monkeypatch, caplog, lambda e, seen=seen: seen.append(str(e)))
    assert calls["4"] == calls["1"] and len(calls["1"]) > 3


def test_threads_raise_the_first_error_in_file_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _corpus(tmp_path / "data")
    raised = {}
    for threads in ("1", "4"):
        monkeypatch.setenv("TIDAL_READ_THREADS", threads)
        ds = tidal.Dataset(root).shuffle(seed=3, block_size=200, shards_per_block=4)
        got = []
        with pytest.raises(tidal.TidalError) as info:
            for rec in ds:
                got.append(rec["id"])
        raised[threads] = (str(info.value), got)
    assert raised["4"] == raised["1"]


def test_a_function_that_stops_the_reader_stops_it_at_the_same_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _corpus(tmp_path / "data")

    class Enough(Exception):
        pass

    def stop(error: tidal.TidalError) -> None:
        raise Enough(str(error))

    outcome = {}
    for threads in ("1", "4"):
        monkeypatch.setenv("TIDAL_READ_THREADS", threads)
        ds = tidal.Dataset(root, errors=stop).shuffle(seed=3, block_size=200, shards_per_block=4)
        with pytest.raises(Enough) as info:
            list(ds)
        outcome[threads] = str(info.value)
    assert outcome["4"] == outcome["1"]


def test_bad_setting_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"id": [1, 2]}), path)
    monkeypatch.setenv("TIDAL_READ_THREADS", "two")
    with pytest.raises(tidal.TidalError, match="TIDAL_READ_THREADS must be a positive integer, not 'two'"):
        list(tidal.Dataset(path))


def test_an_iterator_left_open_at_exit_says_nothing(tmp_path: Path) -> None:
    """The interpreter exits with a reader and its threads still open: no error on the way out."""
    import subprocess
    import sys

    for f in range(8):
        pq.write_table(pa.table({"id": list(range(f * 5000, f * 5000 + 5000))}), tmp_path / f"{f}.parquet")
    code = (
        f"import torch, tidal, threading, time; ds = tidal.Dataset({str(tmp_path)!r}).shuffle(seed=1).repeat().batch(8)\n"
        "loader = tidal.DataLoader(ds); it = iter(loader); b = next(it)\n"
        "reading = lambda: any(t.name.startswith('tidal-read_') for t in threading.enumerate())\n"
        "waited = 0\n"
        "while not reading() and waited < 500:  # the first batch by point reads: the block's threads come after\n"
        "    time.sleep(0.01); waited += 1\n"
        "assert reading()"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stderr == ""


def _spy_reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    from tidal.formats import parquet

    reads: list[tuple[int, int]] = []
    read = parquet.ParquetReader.read

    def spied(self: Any, start: int, stop: int) -> Any:
        reads.append((start, stop))
        return read(self, start, stop)

    monkeypatch.setattr(parquet.ParquetReader, "read", spied)
    return reads


def test_the_next_block_is_read_while_the_loop_takes_this_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader alone in its process starts reading the next block as soon as it has this one;
    a state taken meanwhile still restores to exactly the next record."""
    for f in range(4):
        pq.write_table(pa.table({"id": list(range(f * 100, f * 100 + 100))}), tmp_path / f"{f}.parquet")
    monkeypatch.setenv("TIDAL_READ_THREADS", "2")
    reads = _spy_reads(monkeypatch)
    ds = tidal.Dataset(tmp_path).shuffle(seed=1, block_size=80, shards_per_block=4)  # 5 blocks of 4 slices
    it = ds.iterator()
    first = [next(it)["id"] for _ in range(10)]
    state = it.state()
    it.close()
    assert len(reads) == 8  # the first block's four slices, and the second's, read ahead
    whole = [r["id"] for r in ds]
    resumed = ds.iterator(state=state)
    assert first + [r["id"] for r in resumed] == whole and sorted(whole) == list(range(400))


def test_the_next_epochs_first_block_is_read_while_the_loop_ends_this_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under repeat() the block read ahead after an epoch's last one is the next epoch's first (a
    small dataset starts an epoch every few blocks); none is read past the pass's last epoch, and
    the records are those of reading without threads."""
    for f in range(4):
        pq.write_table(pa.table({"id": list(range(f * 100, f * 100 + 100))}), tmp_path / f"{f}.parquet")
    ds = tidal.Dataset(tmp_path).shuffle(seed=1, block_size=80, shards_per_block=4).repeat(3)  # 5 blocks of 4 slices
    monkeypatch.setenv("TIDAL_READ_THREADS", "1")
    alone = [r["id"] for r in ds]
    monkeypatch.setenv("TIDAL_READ_THREADS", "2")
    reads = _spy_reads(monkeypatch)
    it = ds.iterator()
    first_epoch = [next(it)["id"] for _ in range(400)]
    state = it.state()
    it.close()  # waits for the reads in flight
    assert sorted(first_epoch) == list(range(400))
    assert len(reads) == 24  # the epoch's 5 blocks of 4 slices, and the next epoch's first block
    rest = [r["id"] for r in ds.iterator(state=state)]
    assert first_epoch + rest == alone and len(alone) == 1200
    assert len(reads) == 64  # the 2 epochs left read once each (4 slices a block): nothing after the last


def test_a_block_of_one_file_is_read_ahead_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pq.write_table(pa.table({"id": list(range(400))}), tmp_path / "one.parquet", row_group_size=50)
    monkeypatch.setenv("TIDAL_READ_THREADS", "2")
    reads = _spy_reads(monkeypatch)
    ds = tidal.Dataset(tmp_path).shuffle(seed=1, block_size=80)  # 5 blocks of one slice
    it = ds.iterator()
    first = [next(it)["id"] for _ in range(10)]
    state = it.state()
    it.close()  # waits for the reads in flight
    assert len(reads) == 2  # this block's slice and the next one's
    assert first + [r["id"] for r in ds.iterator(state=state)] == [r["id"] for r in ds]


def _read_threads_here(record: dict) -> dict:
    return {**record, "threads": any(t.name.startswith("tidal-read_") for t in threading.enumerate())}


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers_read_their_next_block_in_a_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, context: str
) -> None:
    """Each DataLoader worker reads its next Parquet block in a thread while it sends batches of
    this one: the loop takes the workers' batches in turn, so a worker decoding in its own thread
    held up the loop and every other worker with it. The batches are the same either way."""
    import multiprocessing

    for f in range(4):
        pq.write_table(pa.table({"id": list(range(f * 500, f * 500 + 500))}), tmp_path / f"{f}.parquet")
    ds = tidal.Dataset(tmp_path).shuffle(seed=1, block_size=200, shards_per_block=4).map(_read_threads_here).batch(10)

    def run(threads: str) -> tuple[list[list[int]], set[bool]]:
        monkeypatch.setenv("TIDAL_READ_THREADS", threads)
        loader = tidal.DataLoader(ds, num_workers=2, multiprocessing_context=multiprocessing.get_context(context))
        batches = list(loader)
        return [b["id"].tolist() for b in batches], {bool(t) for b in batches for t in b["threads"]}

    own, threaded = run("1"), run("2")
    assert threaded[1] == {True} and own[1] == {False}
    assert threaded[0] == own[0] and sorted(i for b in own[0] for i in b) == list(range(2000))


def test_workers_reading_ahead_skip_bad_data_as_one_thread_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Bad rows, a damaged row group and a file that cannot be opened, read by 2 workers over 3
    epochs (blocks read ahead across the epochs): the same batches, the same skip counts and bad
    files, as reading in the workers' own threads."""
    root = _corpus(tmp_path / "data")
    ds = tidal.Dataset(root, errors="skip").shuffle(seed=3, block_size=60, shards_per_block=3).repeat(3).batch(7)

    def run(threads: str) -> tuple[list[list[int]], dict]:
        monkeypatch.setenv("TIDAL_READ_THREADS", threads)
        loader = tidal.DataLoader(ds, num_workers=2)
        batches = [b["id"].tolist() for b in loader]
        stats = loader.stats()
        return batches, {k: stats[k] for k in ("batches", "rows_read", "skipped", "bad_files")}

    own, threaded = run("1"), run("2")
    assert threaded == own
    assert own[1]["skipped"] > 0 and own[1]["bad_files"] >= 2
    served = [i for b in own[0] for i in b]
    assert len(own[0]) == own[1]["batches"] and len(set(served)) < len(served)  # 3 epochs of the good rows


def test_an_iterator_continued_in_a_forked_child_reads_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fork copies an iterator whose next block is being read by threads the child does not
    have: the child reads that block afresh instead of waiting on them forever."""
    import json
    import signal

    for f in range(4):
        pq.write_table(pa.table({"id": list(range(f * 100, f * 100 + 100))}), tmp_path / f"{f}.parquet")
    monkeypatch.setenv("TIDAL_READ_THREADS", "2")
    ds = tidal.Dataset(tmp_path).shuffle(seed=1, block_size=80, shards_per_block=4)
    whole = [r["id"] for r in ds]
    it = ds.iterator()
    first = [next(it)["id"] for _ in range(10)]  # the second block is being read ahead
    out, into = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: read the rest, report it, leave without running the parent's cleanup
        try:
            signal.alarm(20)
            os.write(into, json.dumps([r["id"] for r in it]).encode())
        finally:
            os._exit(0)
    os.close(into)
    with os.fdopen(out) as reader:
        rest = json.loads(reader.read() or "null")
    os.waitpid(pid, 0)
    assert rest is not None and first + rest == whole
    it.close()


def test_an_iterator_collected_inside_threadings_bookkeeping_does_not_hang(tmp_path: Path) -> None:
    """The garbage collector can finalize a dropped iterator inside threading's bookkeeping (a
    thread starting up prunes its list of locks with ``_shutdown_locks_lock`` held): closing the
    iterator there joins its read threads, which takes that lock, and the process hung for ever
    (seen once in the test suite). It is handed to a thread of its own instead. Here the
    collector runs in a function of threading's file and name, with the lock held (tidal.closing)."""
    import subprocess
    import sys

    if not hasattr(threading, "_shutdown_locks_lock"):
        pytest.skip("no threading._shutdown_locks_lock in this Python")
    for f in range(4):
        pq.write_table(pa.table({"id": list(range(f * 100, f * 100 + 100))}), tmp_path / f"{f}.parquet")
    code = (
        "import gc, os, threading, tidal; os.environ['TIDAL_READ_THREADS'] = '2'\n"
        f"ds = tidal.Dataset({str(tmp_path)!r}).shuffle(seed=1, block_size=80, shards_per_block=4)\n"
        "held = [ds.iterator()]; next(held[0])\n"
        "space = {'gc': gc}\n"
        "exec(compile('def _maintain_shutdown_locks(held):\\n    del held[0]\\n    gc.collect()', "
        "threading.__file__, 'exec'), space)\n"
        "with threading._shutdown_locks_lock:\n"
        "    space['_maintain_shutdown_locks'](held)\n"
        "print('ok')\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr


def test_closes_handed_to_the_closer_thread_end_before_the_process_exits(tmp_path: Path) -> None:
    """The closer thread is a daemon: a close it was still running as the interpreter exited was
    cut off mid-way (with pyarrow's readers, an abort: "terminate called without an active
    exception"). Exit waits for the closes handed over."""
    import subprocess
    import sys

    marker = tmp_path / "closed"
    code = (
        "import time\n"
        "from tidal import closing\n"
        "class Slow:\n"
        "    def close(self):\n"
        "        time.sleep(0.5)\n"
        f"        open({str(marker)!r}, 'w').close()\n"
        "closing.start()\n"
        "closing.CLOSER.put(Slow())\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stderr == "", run.stderr
    assert marker.exists()
