"""Every format at the shapes real corpora have: hundreds of files in one shuffle block, files of
one record, very skewed file sizes, a document of several MB.

Books, code repositories and per-domain dumps hold few records per file, so one shuffle block
reads hundreds of files at once: more than a reader keeps open. Each format is read shuffled
in one process (where Parquet and Arrow are read in threads), with 2 DataLoader workers, and
resumed mid-block; every record comes exactly once, and a resumed run continues exactly.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from makers import write_megatron

import tidal

pytest_plugins = ["s3_fixtures"]

FILES = 300  # files in the one shuffle block (a reader keeps 64 idle ones open)
BIG_DOC = 3 << 20  # bytes of text (or of uint16 ids) of the largest record
ROW = 4096  # a headerless .bin is read as rows of this many ids


def layout() -> list[list[int]]:
    """The ids each file holds: most files one or two records, one file of 1,500, one file
    holding only the big document (id 1), files in no order of size."""
    rng = np.random.default_rng(5)
    sizes = [int(n) for n in rng.integers(1, 3, FILES)]
    sizes[17], sizes[240] = 1_500, 1
    out, at = [], 2
    for k, n in enumerate(sizes):
        if k == 240:
            out.append([1])
            continue
        out.append(list(range(at, at + n)))
        at += n
    return out


def text_of(i: int) -> str:
    return f"{i} doc " + ("x" * BIG_DOC if i == 1 else "w" * (i % 13))


def ids_of(i: int) -> np.ndarray:
    n = BIG_DOC // 2 if i == 1 else 1 + i % 5
    return np.concatenate([[i], np.full(n - 1, 7)]).astype(np.uint16)


# -- one writer per format: the files of ``layout()`` under ``d`` --------------------------------


def _records(ids: list[int]) -> list[dict]:
    return [{"id": i, "text": text_of(i)} for i in ids]


def jsonl(d: Path, files: list[list[int]]) -> None:
    for k, ids in enumerate(files):
        data = "".join(json.dumps(r) + "\n" for r in _records(ids)).encode()
        (d / f"f{k:04d}.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(data))


def text(d: Path, files: list[list[int]]) -> None:
    for k, ids in enumerate(files):
        (d / f"f{k:04d}.txt").write_text("".join(text_of(i) + "\n" for i in ids))


def csv(d: Path, files: list[list[int]]) -> None:
    for k, ids in enumerate(files):
        (d / f"f{k:04d}.csv").write_text("id,text\n" + "".join(f"{i},{text_of(i)}\n" for i in ids))


def parquet(d: Path, files: list[list[int]]) -> None:
    for k, ids in enumerate(files):
        pq.write_table(pa.Table.from_pylist(_records(ids)), d / f"f{k:04d}.parquet", row_group_size=500)


def arrow(d: Path, files: list[list[int]]) -> None:
    for k, ids in enumerate(files):
        table = pa.Table.from_pylist(_records(ids))
        stream = k % 2 == 1  # the file format and the stream format, in turn
        new = pa.ipc.new_stream if stream else pa.ipc.new_file
        with (
            pa.OSFile(str(d / f"f{k:04d}.{'arrows' if stream else 'arrow'}"), "wb") as sink,
            new(sink, table.schema) as w,
        ):
            w.write_table(table, max_chunksize=400)


def webdataset(d: Path, files: list[list[int]]) -> None:
    for k, ids in enumerate(files):
        with tarfile.open(d / f"f{k:04d}.tar", "w") as tf:
            for i in ids:
                data = text_of(i).encode()
                info = tarfile.TarInfo(f"s{i:06d}.txt")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))


def mds(d: Path, files: list[list[int]]) -> None:
    from conftest import mds_writer

    # MDS closes a shard by size: the big document's shard is one record, the rest a few each
    with mds_writer()(out=str(d), columns={"id": "int", "text": "str"}, size_limit=1 << 10) as w:
        for ids in files:
            for r in _records(ids):
                w.write(r)


def litdata(d: Path, files: list[list[int]]) -> None:
    from litdata.streaming.writer import BinaryWriter

    writer = BinaryWriter(str(d), chunk_size=2)  # chunks of two records: 1,800 of them
    for n, r in enumerate(r for ids in files for r in _records(ids)):
        writer[n] = {"id": r["id"], "text": r["text"]}
    writer.done()
    writer.merge()


def tokens(d: Path, files: list[list[int]]) -> None:
    from tidal.formats.tokens import TokenWriter

    with TokenWriter(d, dtype="uint16") as w:
        for ids in files:
            for i in ids:
                w.write(ids_of(i))
            w._flush()  # a shard per file of the layout (a writer closes shards by size)


def megatron(d: Path, files: list[list[int]]) -> None:
    for k, ids in enumerate(files):
        write_megatron(d / f"f{k:04d}", [[ids_of(i)] for i in ids])


def flat(d: Path, files: list[list[int]]) -> None:
    for k, ids in enumerate(files):  # one row of ROW ids per record, its first id the record's
        rows = np.full((len(ids), ROW), 7, dtype="<u2")
        rows[:, 0] = ids
        (d / f"f{k:04d}.bin").write_bytes(rows.tobytes())


WRITERS: dict[str, Callable[[Path, list[list[int]]], None]] = {
    "jsonl": jsonl,
    "text": text,
    "csv": csv,
    "parquet": parquet,
    "arrow": arrow,
    "webdataset": webdataset,
    "mds": mds,
    "litdata": litdata,
    "tokens": tokens,
    "megatron": megatron,
    "flat": flat,
}


def key(record: dict) -> int:
    """The id a record carries, in whatever columns its format gives it."""
    if "id" in record:
        return int(record["id"])
    if "input_ids" in record:
        return int(record["input_ids"][0])
    line = record.get("text", record.get("txt"))
    return int(line.split(" ", 1)[0])


def keyed(record: dict) -> dict:
    """What a DataLoader worker sends back: the id, and the length of the record's text or ids."""
    body = record.get("text", record.get("txt", record.get("input_ids")))
    return {"key": key(record), "size": len(body)}


@pytest.fixture(scope="module", params=sorted(WRITERS))
def corpus(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, list[int]]:
    name = request.param
    d = tmp_path_factory.mktemp(name)
    files = layout()
    WRITERS[name](d, files)
    return name, d, sorted(i for ids in files for i in ids)


def test_a_block_of_hundreds_of_files_reads_every_record_once(corpus: tuple[str, Path, list[int]]) -> None:
    _, d, ids = corpus
    ds = tidal.Dataset(d).shuffle(seed=1)
    got = [key(r) for r in ds]
    assert sorted(got) == ids
    assert got != ids  # shuffled across the files of the block
    big = next(r for r in ds if key(r) == 1)
    body = big.get("text", big.get("txt", big.get("input_ids")))
    assert len(body) in (len(text_of(1)), len(ids_of(1)), ROW)


def test_a_block_of_hundreds_of_files_resumes_mid_block(corpus: tuple[str, Path, list[int]]) -> None:
    ds = tidal.Dataset(corpus[1]).shuffle(seed=2).repeat(2)
    it = ds.iterator()
    full = [key(r) for r in it]
    for cut in (1, 999, len(full) // 2 + 3):
        it = ds.iterator()
        for _ in range(cut):
            next(it)
        state = json.loads(json.dumps(it.state()))
        it.close()
        resumed = ds.iterator(state=state)
        assert [key(r) for r in resumed] == full[cut:]


def test_two_workers_read_a_block_of_hundreds_of_files_once_and_resume(corpus: tuple[str, Path, list[int]]) -> None:
    pytest.importorskip("torch")
    _, d, ids = corpus
    ds = tidal.Dataset(d).shuffle(seed=3).map(keyed).batch(16, drop_last=False)
    loader = tidal.DataLoader(ds, num_workers=2)
    batches = [(b["key"].tolist(), b["size"].tolist()) for b in loader]
    got = [i for keys, _ in batches for i in keys]
    assert len(got) == len(set(got)) and set(got) <= set(ids)
    assert len(got) >= len(ids) - 1  # two readers share an odd epoch: one record waits for the next epoch
    sizes = dict(zip(got, [s for _, sizes in batches for s in sizes], strict=True))
    if 1 in sizes:
        assert sizes[1] in (len(text_of(1)), len(ids_of(1)), ROW)

    loader = tidal.DataLoader(ds, num_workers=2)
    taken = []
    for step, b in enumerate(loader):
        taken.append(b["key"].tolist())
        if step == 40:
            state = loader.state_dict()
            break
    resumed = tidal.DataLoader(ds, num_workers=2)
    resumed.load_state_dict(json.loads(json.dumps(state)))
    rest = [b["key"].tolist() for b in resumed]
    assert taken + rest == [keys for keys, _ in batches]


@pytest.fixture
def few_descriptors() -> Iterator[int]:
    """This process may open only 300 more files than it has open now: fewer than a block reads."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = len(os.listdir("/proc/self/fd")) + 300
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    try:
        yield limit
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.parametrize("name", ["parquet", "jsonl"])
def test_a_block_of_hundreds_of_remote_files_reads_as_the_local_one_does(
    name: str, s3: Any, bucket: str, tmp_path: Path, few_descriptors: int
) -> None:
    files = [[k] for k in range(400)]  # 400 files of one record: one block, more than the files it may open
    local = tmp_path / "data"
    local.mkdir()
    WRITERS[name](local, files)
    url = s3.upload(local, bucket, name)
    remote = tidal.Dataset(url, storage_options=s3.options(), cache_dir=tmp_path / "cache").shuffle(seed=6)
    want = [key(r) for r in tidal.Dataset(local).shuffle(seed=6)]
    assert sorted(want) == list(range(400))
    it = remote.iterator()
    assert [key(r) for r in it] == want
    stats = it.stats()
    assert stats["cache_misses"] + stats["cache_hits"] == 400  # each file opened once (JSONL: counted from a copy)
