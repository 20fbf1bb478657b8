"""Any fsspec URL, not only S3: plain HTTP from Python's own server on 127.0.0.1."""

from __future__ import annotations

import functools
import http.server
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import make_shards

import tidal
from tidal.storage import Retry, Storage


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A directory of shards behind ``http://127.0.0.1:<free port>/``."""
    data = make_shards(tmp_path / "data", [10, 20, 5, 17])
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(data)))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", data
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_an_http_dataset_reads_like_the_local_one(served: tuple[str, Path], tmp_path: Path) -> None:
    base, data = served
    settings = Storage(cache_dir=str(tmp_path / "cache"), retry=Retry(backoff=0.01), timeout=5)
    listed = tidal.Dataset(base + "/", storage=settings)  # a directory page: its links
    named = tidal.Dataset(
        [f"{base}/part-{k:03d}.{kind}" for k, kind in enumerate(["jsonl", "jsonl.zst"])], storage=settings
    )
    assert [s.rows for s in listed.shards] == [10, 20, 5, 17] and named.num_records == 30
    shutil.rmtree(tmp_path / "cache" / "shards")
    local = tidal.Dataset(data).shuffle(seed=4, block_size=9, shards_per_block=2)
    remote = listed.shuffle(seed=4, block_size=9, shards_per_block=2)
    it = remote.iterator()
    assert list(it) == list(local)
    assert it.stats()["cache_misses"] == 4 and it.stats()["bytes_downloaded"] > 0
