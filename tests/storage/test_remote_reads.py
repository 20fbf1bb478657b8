"""A remote block reads what it serves: the row groups and lines of its slices by ranges, its first
batch by point reads, and a job's ranks only the files their first records are in.

Every request goes through a proxy in front of a real S3 server (moto) that counts the bytes it
sent, so the tests count bytes over the network, not time.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from fault_proxy import FaultProxy
from s3_server import S3Server

import tidal
from tidal.stages.blocks import BlockReader
from tidal.storage import Storage
from tidal.storage import prefetch as prefetch_module

pytest_plugins = ["s3_fixtures"]

FILES, GROUPS, ROWS = 4, 8, 200  # Parquet: 4 files of 8 row groups of 200 records of 1 KB: 1.6 MB a file
BLOB = 1000


@pytest.fixture
def proxy(s3: S3Server) -> Iterator[FaultProxy]:
    with FaultProxy(("127.0.0.1", s3.port), every=0) as p:  # counts every body the store sent
        yield p


@pytest.fixture
def in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    """These small files count as large: read in place by ranges."""
    monkeypatch.setattr(prefetch_module, "RANGE_MIN_BYTES", 0)
    monkeypatch.setattr(prefetch_module, "LINE_WINDOW", 64 << 10)


@contextlib.contextmanager
def held_back(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The block a first batch comes from is not loaded behind it (what the first batch read, alone)."""
    asked: list[int] = []
    with monkeypatch.context() as m:
        m.setattr(BlockReader, "_load_behind", lambda self, order, b: asked.append(b))
        yield asked


@contextlib.contextmanager
def whole_blocks(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    with monkeypatch.context() as m:
        m.setattr(BlockReader, "_points", lambda self, *args: None)
        yield


def parquet_corpus(root: Path) -> Path:
    root.mkdir()
    for f in range(FILES):
        n = GROUPS * ROWS
        ids = list(range(f * n, (f + 1) * n))
        blobs = [os.urandom(BLOB) for _ in ids]  # incompressible: a row group is 200 KB of them
        pq.write_table(pa.table({"id": ids, "blob": blobs}), root / f"part-{f}.parquet", row_group_size=ROWS)
    return root


def storage(s3: S3Server, proxy: FaultProxy, cache: Path) -> Storage:
    return Storage(options=s3.options(proxy.endpoint), cache_dir=str(cache))


def sent(proxy: FaultProxy) -> int:
    return int(proxy.traffic.snapshot()["bytes_out"])


def shards_in(cache: Path) -> list[Path]:
    return list(cache.glob("shards/*.shard"))


SHUFFLE = {"seed": 1, "block_size": 1600, "shards_per_block": FILES}  # 4 blocks: a slice is 2 row groups of a file


def test_a_large_parquet_block_reads_the_row_groups_of_its_slices_and_its_first_batch_those_of_its_records(
    s3: S3Server, bucket: str, tmp_path: Path, proxy: FaultProxy, in_place: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = parquet_corpus(tmp_path / "data")
    size = sum(p.stat().st_size for p in data.iterdir())
    group = size // (FILES * GROUPS)
    url = s3.upload(data, bucket, "pq")
    cache = tmp_path / "cache"
    ds = tidal.Dataset(url, columns=["id", "blob"], storage=storage(s3, proxy, cache)).shuffle(**SHUFFLE).batch(2)
    before = sent(proxy)
    with held_back(monkeypatch) as asked:
        it = ds.iterator()
        first = [int(i) for i in next(it)["id"]]
        first_bytes = sent(proxy) - before
        it.close()
    assert asked == [0]
    files = {i // (GROUPS * ROWS) for i in first}
    groups = {(i // (GROUPS * ROWS), i // ROWS) for i in first}
    # each record's file's footer and its row group: not the block's 8 row groups, nor whole files
    assert first_bytes < len(groups) * group + len(files) * (64 << 10) + (32 << 10), (first_bytes, group)
    before = sent(proxy)
    ids = [int(i) for b in ds.iterator() for i in b["id"]]
    epoch = sent(proxy) - before
    assert sorted(ids) == list(range(FILES * GROUPS * ROWS))
    assert size < epoch < size + FILES * (128 << 10)  # each row group once: those of the points kept for the block
    assert shards_in(cache) == []  # one epoch: nothing copied
    with whole_blocks(monkeypatch):
        before = sent(proxy)
        assert [int(i) for b in ds.iterator() for i in b["id"]] == ids
        assert abs(sent(proxy) - before - epoch) < 4 * (64 << 10)  # point reads cost no byte more


def test_files_read_in_place_are_copied_whole_for_the_next_epochs(
    s3: S3Server, bucket: str, tmp_path: Path, proxy: FaultProxy, in_place: None
) -> None:
    data = parquet_corpus(tmp_path / "data")
    size = sum(p.stat().st_size for p in data.iterdir())
    url = s3.upload(data, bucket, "pq")
    cache = tmp_path / "cache"
    ds = tidal.Dataset(url, storage=storage(s3, proxy, cache)).shuffle(**SHUFFLE).repeat(3).batch(50)
    before = sent(proxy)
    ids = [int(i) for b in ds.iterator() for i in b["id"]]
    assert sorted(ids) == sorted(list(range(FILES * GROUPS * ROWS)) * 3)
    # the first block's row groups by ranges, then each file once whole: not three epochs of ranges
    assert sent(proxy) - before < 2 * size + FILES * (128 << 10)
    assert len(shards_in(cache)) == FILES


def test_a_large_line_file_is_read_by_ranges_from_its_line_offsets(
    s3: S3Server, bucket: str, tmp_path: Path, proxy: FaultProxy, in_place: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    n = 50_000
    (data / "big.jsonl").write_text("".join(json.dumps({"id": i, "text": "y" * 60}) + "\n" for i in range(n)))
    size = (data / "big.jsonl").stat().st_size
    url = s3.upload(data, bucket, "lines")
    tidal.index(url, storage_options=s3.options(), cache_dir=tmp_path / "indexer")  # its line offsets, published
    cache = tmp_path / "cache"
    ds = tidal.Dataset(url, storage=storage(s3, proxy, cache)).shuffle(seed=3, block_size=5000).batch(4)
    assert ds.shards[0].info["checkpoints"]
    before = sent(proxy)
    with held_back(monkeypatch):
        it = ds.iterator()
        next(it)
        first_bytes = sent(proxy) - before
        it.close()
    assert first_bytes < 4 * (400_000 + (64 << 10))  # each record from the line offset before it: not the file
    assert first_bytes < size / 3
    before = sent(proxy)
    ids = [int(i) for b in ds.iterator() for i in b["id"]]
    assert sorted(ids) == list(range(n))
    assert sent(proxy) - before < 1.5 * size  # the slices' lines, never the file for each block
    assert shards_in(cache) == []


def zst_corpus(root: Path, files: int, per_file: int) -> Path:
    root.mkdir()
    for k in range(files):
        lines = "".join(json.dumps({"id": k * per_file + i, "text": "x" * 200}) + "\n" for i in range(per_file))
        (root / f"part-{k:04d}.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(lines.encode()))
    return root


@pytest.mark.slow
def test_at_a_jobs_start_a_node_downloads_only_the_files_its_ranks_first_records_are_in(
    s3: S3Server, bucket: str, tmp_path: Path, proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """8 ranks on 2 nodes over 200 small objects (an index published): each rank's first batch of 2
    downloads the files its 2 records are in, not the 20 files of its block and those fetched ahead."""
    files, per_file, ranks = 200, 20, 8
    data = zst_corpus(tmp_path / "data", files, per_file)
    largest = max(p.stat().st_size for p in data.iterdir())
    url = s3.upload(data, bucket, "web")
    tidal.index(url, storage_options=s3.options(), cache_dir=tmp_path / "indexer")

    def start(name: str) -> tuple[list[int], list[set[int]]]:
        """Per node, the bytes its ranks downloaded before their first batches; per rank, the files of its batch."""
        per_node, held = [0, 0], []
        for rank in range(ranks):
            node = rank // 4
            settings = Storage(options=s3.options(proxy.endpoint), cache_dir=str(tmp_path / f"{name}-node{node}"))
            ds = tidal.Dataset(url, storage=settings).shuffle(seed=1, block_size=400, shards_per_block=4).batch(2)
            it = ds.iterator(tidal.World(rank=rank, world_size=ranks))
            batch = next(it)
            per_node[node] += it.stats()["bytes_downloaded"]
            held.append({int(i) // per_file for i in batch["id"]})
            it.close()
        return per_node, held

    with held_back(monkeypatch):
        nodes, held = start("points")
    assert all(node <= 2 * 4 * largest for node in nodes), nodes  # at most 2 files per rank
    assert all(1 <= len(batch_files) <= 2 for batch_files in held)  # exactly the files of its records...
    cached = [len(shards_in(tmp_path / f"points-node{n}")) for n in range(2)]
    assert cached == [len(set().union(*held[n * 4 : n * 4 + 4])) for n in range(2)]
    with whole_blocks(monkeypatch):
        before, _ = start("blocks")
    assert all(b > 8 * n for b, n in zip(before, nodes, strict=True)), (before, nodes)  # whole blocks, and ahead


def test_a_remote_blocks_files_are_read_side_by_side_whatever_the_cores(
    s3: S3Server, bucket: str, tmp_path: Path, proxy: FaultProxy, in_place: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ranged GETs wait on the network, not the cores: on a machine of one core, the row groups a
    block needs of its 8 remote files are read at once (8 threads), where the cores' share gave
    one thread, and the files one after another at one connection's speed."""
    import threading
    import time

    from tidal import env

    root = tmp_path / "data"
    root.mkdir()
    for f in range(8):
        pq.write_table(pa.table({"id": list(range(f * 50, f * 50 + 50))}), root / f"part-{f}.parquet")
    url = s3.upload(root, bucket, "side")
    monkeypatch.setattr(env, "_cores", lambda: 1)
    lock, flight = threading.Lock(), {"now": 0, "most": 0}
    read_held = BlockReader._read_held

    def counted(self: BlockReader, *args: object) -> object:
        with lock:
            flight["now"] += 1
            flight["most"] = max(flight["most"], flight["now"])
        try:
            time.sleep(0.2)  # a slow link: the reads in flight overlap
            return read_held(self, *args)
        finally:
            with lock:
                flight["now"] -= 1

    monkeypatch.setattr(BlockReader, "_read_held", counted)
    ds = tidal.Dataset(url, storage=storage(s3, proxy, tmp_path / "cache")).shuffle(seed=1, shards_per_block=8)
    with whole_blocks(monkeypatch):
        assert sorted(r["id"] for r in ds) == list(range(400))
    assert flight["most"] == 8
    monkeypatch.setenv("TIDAL_READ_THREADS", "1")  # as set: the reader's own thread
    flight["most"] = 0
    with whole_blocks(monkeypatch):
        assert sorted(r["id"] for r in ds) == list(range(400))
    assert flight["most"] == 1


def test_a_point_read_in_a_large_remote_row_group_fetches_the_group_only_up_to_its_record(
    s3: S3Server, bucket: str, tmp_path: Path, proxy: FaultProxy, in_place: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record's strip is decoded from its row group's first row (a remote file's page headers
    are not read): the group is fetched as far as the strip, not whole, and the block loading
    behind the first batch fetches only the rest of it. The footer is one GET."""
    root = tmp_path / "data"
    root.mkdir()
    rows = 8000
    for f in range(2):  # one row group of 8 MB a file, pages of 2,048 rows
        ids = list(range(f * rows, (f + 1) * rows))
        table = pa.table({"id": ids, "blob": [os.urandom(BLOB) for _ in ids]})
        pq.write_table(table, root / f"p{f}.parquet", use_dictionary=["id"])
    size = sum(p.stat().st_size for p in root.iterdir())
    url = s3.upload(root, bucket, "one-group")
    ds = tidal.Dataset(url, storage=storage(s3, proxy, tmp_path / "cache")).batch(2)  # in order: rows 0 and 1
    asked = sum(proxy.traffic.snapshot()["requests"].values())
    before = sent(proxy)
    with held_back(monkeypatch):
        it = ds.iterator()
        assert [int(i) for i in next(it)["id"]] == [0, 1]
        first_bytes = sent(proxy) - before
        it.close()
    assert first_bytes < 0.5 * size / 2, first_bytes  # its first page (2 MB) and a little: not the group (8 MB)
    requests = proxy.traffic.snapshot()["requests"]
    assert sum(requests.values()) - asked <= 2 * 3, requests  # a file: a HEAD, its footer, its group up to the strip
    before = sent(proxy)
    ids = [int(i) for b in ds.iterator() for i in b["id"]]
    assert ids == list(range(2 * rows))
    assert size < sent(proxy) - before < 1.05 * size  # the group once: the points' part (2.7 MB) not again
