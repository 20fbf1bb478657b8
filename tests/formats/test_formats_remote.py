"""The self-describing formats read from a URL like from disk, through the shard cache."""

from __future__ import annotations

import functools
import http.server
import importlib.util
import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from conftest import mds_writer
from http_servers import Quiet
from makers import ROWS, csv_bytes

import tidal
from tidal.formats.tokens import TokenWriter
from tidal.storage import Retry, Storage
from tidal.testing import same

pytest_plugins = ["s3_fixtures"]


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
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(data)))
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


# -- every format from a local directory and from the same files on S3 --------------------------------


def _tar(path: Path, samples: range) -> None:
    import io
    import tarfile

    with tarfile.open(path, "w") as tar:
        for i in samples:
            for ext, data in [("txt", f"doc {i}".encode()), ("json", json.dumps({"n": i}).encode())]:
                info = tarfile.TarInfo(f"{i:04d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def _formats(root: Path) -> dict[str, Path]:
    """One directory per format, of several files whose names' order is not their order of writing
    where the format keeps one (save_to_disk), and a parent holding two datasets of a kind."""
    import pyarrow.parquet as pq
    from conftest import write_jsonl
    from makers import corpus, write_megatron

    out = {name: root / name for name in ("parquet", "jsonl", "text", "csv", "arrow", "webdataset", "tokens",
                                            "flat", "megatron", "saved")}  # fmt: skip
    for d in out.values():
        d.mkdir(parents=True)
    for k in range(3):
        pq.write_table(
            pa.table({"id": list(range(k * 10, k * 10 + 10))}), out["parquet"] / f"p-{k}.parquet", row_group_size=4
        )
        write_jsonl(out["jsonl"] / f"j-{k}.jsonl.zst", [{"id": i} for i in range(k * 7, k * 7 + 7)], "zstd")
        (out["text"] / f"t-{k}.txt").write_text("".join(f"line {k} {i}\n" for i in range(6)))
        (out["csv"] / f"c-{k}.csv").write_bytes(csv_bytes(ROWS[k * 10 : k * 10 + 10]))
        table = pa.table({"id": list(range(k * 9, k * 9 + 9))})
        with pa.OSFile(str(out["arrow"] / f"a-{k}.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
            w.write_table(table, max_chunksize=4)
        _tar(out["webdataset"] / f"w-{k}.tar", range(k * 5, k * 5 + 5))
        np.save(out["flat"] / f"f-{k}.npy", np.arange(k * 5000, k * 5000 + 5000, dtype=np.uint16))
        write_megatron(out["megatron"] / f"m-{k}_text_document", corpus(12, seed=k))
    with mds_writer()(out=str(root / "mds"), columns={"id": "int", "s": "str"}, size_limit=200) as mds:
        for i in range(30):  # several shards: shard.00000.mds, shard.00001.mds, ...
            mds.write({"id": i, "s": f"s{i}"})
    out["mds"] = root / "mds"
    assert len(list(out["mds"].glob("shard.*.mds"))) > 2
    with TokenWriter(out["tokens"], shard_size=60) as writer:
        for i in range(30):
            writer.write(np.arange(i, 2 * i + 1))
    datasets = pytest.importorskip("datasets")
    for k in range(2):  # a parent of two saved datasets: each in the order its state.json lists its files
        saved = out["saved"] / f"part-{k}"
        datasets.Dataset.from_list([{"id": k * 100 + i} for i in range(40)]).save_to_disk(str(saved), num_shards=3)
        state = json.loads((saved / "state.json").read_text())
        state["_data_files"].reverse()
        (saved / "state.json").write_text(json.dumps(state))
    out["saved/part-0"] = out["saved"] / "part-0"
    return out


@pytest.fixture(scope="module")
def formats(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return _formats(tmp_path_factory.mktemp("formats"))


FORMATS = [
    "parquet",
    "jsonl",
    "text",
    "csv",
    "arrow",
    "webdataset",
    "mds",
    "tokens",
    "flat",
    "megatron",
    "saved",
    "saved/part-0",
]
GLOBS = {"parquet": "*.parquet", "jsonl": "*.jsonl.zst", "csv": "*.csv", "megatron": "*.bin", "flat": "*.npy"}


@pytest.mark.parametrize("name", FORMATS)
def test_each_format_reads_from_s3_as_from_its_local_directory(
    formats: dict[str, Path], name: str, s3: Any, bucket: str, tmp_path: Path
) -> None:
    """The same records in the same shuffled order, from the directory URL (with and without its
    slash, by a glob) and from the directory above it, before and after ``tidal index``."""
    local_dir = formats[name]
    url = s3.upload(local_dir, bucket, f"data/{name}")
    opened = {"storage_options": s3.options(), "cache_dir": tmp_path / "cache"}

    def order(ds: tidal.Dataset) -> list:
        return list(ds.shuffle(seed=7, block_size=8, shards_per_block=2))

    local = tidal.Dataset(local_dir)
    want = order(local)
    assert want and len(want) == local.num_records
    if name.startswith("saved"):  # each saved dataset's Arrow files, never its JSON files
        assert sorted(r["id"] for r in want) == [k * 100 + i for k in range(1 + (name == "saved")) for i in range(40)]
    ways = [url, url + "/"] + ([f"{url}/{GLOBS[name]}"] if name in GLOBS else [])
    for way in ways:
        remote = tidal.Dataset(way, **opened)
        assert [p.rsplit("/", 1)[1] for p in remote.shards.paths] == [Path(p).name for p in local.shards.paths], way
        got = order(remote)
        assert len(got) == len(want) and all(same(g, w) for g, w in zip(got, want, strict=True)), way
    tidal.index(url, **opened)  # then from the published index: one GET, the same order
    got = order(tidal.Dataset(url, **{**opened, "cache_dir": tmp_path / "cache2"}))
    assert len(got) == len(want) and all(same(g, w) for g, w in zip(got, want, strict=True))


def test_a_directory_of_every_format_reads_from_s3_as_locally(
    formats: dict[str, Path], s3: Any, bucket: str, tmp_path: Path
) -> None:
    """The directory above: every format's files, each saved dataset's in its state.json's order."""
    root = formats["parquet"].parent
    url = s3.upload(root, bucket, "all")
    opened = {"storage_options": s3.options(), "cache_dir": tmp_path / "cache"}
    local = tidal.Dataset(root)
    assert sum("/saved/" in p for p in local.shards.paths) == 6  # no state.json, no dataset_info.json
    want = list(local.shuffle(seed=3, block_size=16))
    for way in [url, "index"]:
        if way == "index":
            tidal.index(url, **opened)
            opened["cache_dir"] = tmp_path / "cache2"
        remote = tidal.Dataset(url, **opened)
        assert [p[len(url) :] for p in remote.shards.paths] == [p[len(str(root)) :] for p in local.shards.paths]
        got = list(remote.shuffle(seed=3, block_size=16))
        assert len(got) == len(want) and all(same(g, w) for g, w in zip(got, want, strict=True))


def test_a_remote_megatron_pair_reads_beside_a_local_index_served_with_it(
    formats: dict[str, Path], tmp_path: Path
) -> None:
    # before: the directory's local .tidal-index.json, served over HTTP beside the files, gave the
    # remote entries, which lack the .idx's size: "a Megatron .bin is read beside its .idx, which was
    # not fetched with it"
    data = formats["megatron"]
    local = tidal.Dataset(data)  # writes data/.tidal-index.json, which the server serves too
    assert (data / ".tidal-index.json").exists()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(data)))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        settings = Storage(cache_dir=str(tmp_path / "cache"), retry=Retry(backoff=0.01), timeout=5)
        for src in [base + "/", f"{base}/m-1_text_document.bin"]:
            remote = tidal.Dataset(src, storage=settings)
            want = list(local) if src.endswith("/") else list(tidal.Dataset(data / "m-1_text_document.bin"))
            got = list(remote)
            assert len(got) == len(want) > 0 and all(same(g, w) for g, w in zip(got, want, strict=True))
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
