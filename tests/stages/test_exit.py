"""Reading while the interpreter exits.

A script that ends mid-epoch: its iterators are still open as the interpreter exits, their
threads (the block loading behind the first batch, the read threads) still reading. Closed by
the collector once the interpreter had frozen those threads, an iterator waited on a file's lock
a frozen thread held, and the interpreter aborted the process (SIGABRT, "could not acquire lock
... at interpreter shutdown").

A script whose main thread ends while a thread of its own still reads (Python waits for it):
``concurrent.futures`` refuses new work from then on, and the thread's next block failed
("cannot schedule new futures after interpreter shutdown").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conformance.data import FORMATS, write

pytest_plugins = ["s3_fixtures"]

SCRIPT = """
import sys, tidal
ds = tidal.Dataset(sys.argv[1]).shuffle(seed=1).batch(4)
kept = []  # every reader of 8 ranks, one batch each, left open
for rank in range(8):
    it = iter(ds.iterator(tidal.World(rank=rank, world_size=8)))
    next(it)
    kept.append(it)
print("read", flush=True)
"""


@pytest.mark.parametrize("fmt", FORMATS)
def test_readers_left_open_at_exit_end_the_script_cleanly(tmp_path: Path, fmt: str) -> None:
    corpus = write(fmt, tmp_path / "data", "files", np.random.default_rng(3), 0, 4000)
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(corpus.root)], capture_output=True, text=True, timeout=120)
    # before the fix: the line formats aborted in about 5 runs of 6 each
    assert (done.returncode, done.stdout, done.stderr) == (0, "read\n", "")


THREAD = """
import sys, threading, tidal
options = {} if len(sys.argv) < 3 else {"storage_options": __import__("json").loads(sys.argv[2])}
ds = tidal.Dataset(sys.argv[1], **options).shuffle(seed=1, block_size=50).repeat(2).batch(4, drop_last=False)

def train():
    print(sum(len(b[next(iter(b))]) for b in ds), flush=True)

threading.Thread(target=train).start()  # the main thread ends here
"""


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_thread_that_reads_on_after_the_main_thread_ended_reads_every_record(tmp_path: Path, fmt: str) -> None:
    corpus = write(fmt, tmp_path / "data", "files", np.random.default_rng(5), 0, 400)
    rows = sum(1 for ids in corpus.files.values() for i in ids if i is not None)
    done = subprocess.run([sys.executable, "-c", THREAD, str(corpus.root)], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout, done.stderr) == (0, f"{2 * rows}\n", "")


def test_a_thread_that_reads_on_after_the_main_thread_ended_reads_remote_data_too(
    tmp_path: Path, s3: Any, bucket: str
) -> None:
    corpus = write("parquet", tmp_path / "data", "files", np.random.default_rng(6), 0, 400)
    rows = sum(1 for ids in corpus.files.values() for i in ids if i is not None)
    url = s3.upload(corpus.root, bucket, "web")
    args = [sys.executable, "-c", THREAD, url, json.dumps(s3.options())]
    done = subprocess.run(
        args, capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONWARNINGS": "ignore"}
    )
    assert (done.returncode, done.stdout) == (0, f"{2 * rows}\n"), done.stderr[-3000:]
