"""The self-describing formats read from a URL like from disk, through the shard cache."""

from __future__ import annotations

import functools
import http.server
import importlib.util
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
from conftest import mds_writer
from test_formats_csv import ROWS, csv_bytes
from test_storage_http import _Quiet

import tidal
from tidal.formats.tokens import TokenWriter
from tidal.storage import Retry, Storage
from tidal.testing import same


def test_token_csv_arrow_and_mds_shards_over_http_read_like_local_ones(tmp_path: Path) -> None:
    data = tmp_path / "data"
    names = ["shard-00000.tokens", "shard-00003.tokens", "a.csv", "b.arrow"]
    if importlib.util.find_spec("streaming") is not None:  # an MDS shard too, where Mosaic's writer is installed
        with mds_writer()(out=str(data), columns={"n": "int", "s": "str"}) as mds:
            for i in range(5):
                mds.write({"n": i, "s": f"s{i}"})
        names.append("shard.00000.mds")
    with TokenWriter(data, shard_size=100) as w:  # its index.json replaces the MDS one: fine, MDS needs none
        for i in range(20):
            w.write(np.arange(i, 2 * i + 1))
    (data / "a.csv").write_bytes(csv_bytes(ROWS[:10]))
    table = pa.table({"id": list(range(7))})
    with pa.OSFile(str(data / "b.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=3)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(data)))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        settings = Storage(cache_dir=str(tmp_path / "cache"), retry=Retry(backoff=0.01), timeout=5)
        for name in names:
            remote = list(tidal.Dataset(f"{base}/{name}", storage=settings))
            local = list(tidal.Dataset(data / name))
            assert len(remote) == len(local) > 0
            assert all(same(r, x) for r, x in zip(remote, local, strict=True)), name
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
