"""LitData directories written by the real ``litdata.optimize`` (slow to start: one module fixture)."""

from __future__ import annotations

import itertools
import json
import multiprocessing
import struct
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tidal
from tidal.testing import assert_partition_exact, assert_resumes_exactly, same

litdata = pytest.importorskip("litdata")
pytest_plugins = ["s3_fixtures"]
pytestmark = pytest.mark.slow  # litdata.optimize starts worker processes: seconds per dataset


def plain(i: int) -> dict:
    return {"text": f"doc {i}", "n": i, "x": i / 4}


def mixed(i: int) -> dict:
    return {"text": f"doc {i}", "n": i, "raw": bytes([i, 7]), "v": np.arange(i + 1, dtype=np.int32),
            "m": np.full((2, 3), i, dtype=np.float32), "pair": (i, f"p{i}")}  # fmt: skip


def tokens(i: int):
    yield np.arange(i * 10, i * 10 + 3 + i, dtype=np.uint16)


def tokens32(i: int):
    yield np.arange(70_000 + i * 10, 70_000 + i * 10 + 3 + i, dtype=np.int32)


COMPRESSED = ("mixed-batch", "mixed-sample", "mixed-chunk", "plain-zstd", "tokens-zstd")


def same_mixed(got: dict, i: int) -> bool:
    return same(got, {**mixed(i), "pair": (i, f"p{i}")})


def _optimize(**kwargs: Any) -> None:
    """``litdata.optimize`` in one forked worker: a spawned one imports torch first (4-5 s each)."""
    litdata.optimize(num_workers=1, start_method="fork", **kwargs)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    from litdata.streaming.item_loader import TokensLoader

    method = multiprocessing.get_start_method(allow_none=True)

    root = tmp_path_factory.mktemp("lit")
    out = {name: root / name for name in ("plain", "mixed", "tokens", "tokens32", *COMPRESSED)}
    _optimize(fn=plain, inputs=list(range(20)), output_dir=str(out["plain"]), chunk_size=6)
    _optimize(fn=mixed, inputs=list(range(14)), output_dir=str(out["mixed"]), chunk_size=4)
    _optimize(fn=tokens, inputs=list(range(12)), output_dir=str(out["tokens"]), chunk_size=40,
              item_loader=TokensLoader())  # fmt: skip
    _optimize(fn=tokens32, inputs=list(range(12)), output_dir=str(out["tokens32"]), chunk_size=40,
              item_loader=TokensLoader())  # fmt: skip
    # compression as LitData writes it: zstd frames of 3 items inside the .bin (its default, "batch"),
    # each item its own frame ("sample"), the whole chunk (.zstd.bin); rows as a zstd Arrow footer
    for level in ("batch", "sample", "chunk"):
        _optimize(fn=mixed, inputs=list(range(30)), output_dir=str(out[f"mixed-{level}"]), chunk_size=8,
                  compression="zstd", compression_level=None if level == "batch" else level,
                  compression_batch_size=3 if level == "batch" else None)  # fmt: skip
    _optimize(fn=plain, inputs=list(range(20)), output_dir=str(out["plain-zstd"]), chunk_size=6,
              compression="zstd")  # fmt: skip
    _optimize(fn=tokens, inputs=list(range(30)), output_dir=str(out["tokens-zstd"]), chunk_size=60,
              item_loader=TokensLoader(), compression="zstd:3", compression_level="chunk")  # fmt: skip
    # optimize() sets the process's start method (to fork here), for every later test's DataLoader workers
    multiprocessing.set_start_method(method, force=True)
    yield out


def test_plain_records_read_back_through_the_arrow_footer(dirs: dict[str, Path]) -> None:
    assert len(list(dirs["plain"].glob("chunk-*.bin"))) == 4
    assert list(tidal.Dataset(dirs["plain"])) == [plain(i) for i in range(20)]
    assert list(tidal.Dataset(dirs["plain"], columns=["n"]))[:2] == [{"n": 0}, {"n": 1}]


def test_pytree_leaves_read_back(dirs: dict[str, Path]) -> None:
    got = list(tidal.Dataset(dirs["mixed"]))
    assert len(got) == 14
    for i, g in enumerate(got):
        want = mixed(i)
        assert g.keys() == want.keys() and g["pair"] == (i, f"p{i}")
        assert (g["text"], g["n"], g["raw"]) == (want["text"], want["n"], want["raw"])
        for k in ("v", "m"):
            assert g[k].dtype == want[k].dtype and np.array_equal(g[k], want[k])


def test_token_chunks_are_documents(dirs: dict[str, Path]) -> None:
    got = [r["input_ids"] for r in tidal.Dataset(dirs["tokens"])]
    want = [next(tokens(i)) for i in range(12)]
    assert len(got) == 12 and all(g.dtype == np.uint16 and np.array_equal(g, w) for g, w in zip(got, want, strict=True))


def test_tree_shuffle_and_resume(dirs: dict[str, Path]) -> None:
    for name in ("plain", "mixed", "tokens"):
        ds = tidal.Dataset(dirs[name])
        assert len(list(ds.shuffle(seed=0))) == ds.num_records
        assert assert_resumes_exactly(ds.shuffle(seed=1, block_size=8).batch(3)) == ds.num_records // 3
    # several datasets in one tree read as one: every record has every column, None where its chunk lacks it
    tree = tidal.Dataset(dirs["plain"].parent)
    assert tree.num_records == sum(tidal.Dataset(d).num_records for d in dirs.values())
    keys = {tuple(r) for r in tree}
    assert len(keys) == 1 and {"text", "n", "x", "input_ids", "pair"} <= set(next(iter(keys)))


def test_bad_item_offsets_are_a_format_error(dirs: dict[str, Path], tmp_path: Path) -> None:
    import shutil

    copy = Path(shutil.copytree(dirs["mixed"], tmp_path / "m"))
    chunk = copy / json.loads((copy / "index.json").read_text())["chunks"][1]["filename"]
    data = bytearray(chunk.read_bytes())
    struct.pack_into("<I", data, 8, 1 << 30)
    chunk.write_bytes(bytes(data))
    with pytest.raises(tidal.FormatError, match=rf"{chunk.name}: corrupt item offsets"):
        tidal.Dataset(copy)


def test_each_compressed_layout_is_what_litdata_wrote(dirs: dict[str, Path]) -> None:
    def config(name: str) -> dict:
        return json.loads((dirs[name] / "index.json").read_text())["config"]

    assert (
        config("mixed-batch")["compression_level"] == "batch" and config("mixed-batch")["compression_batch_size"] == 3
    )
    assert (dirs["mixed-batch"] / "chunk-0-0.bin").read_bytes()[:4] == b"LDFZ"
    assert config("mixed-sample")["compression_level"] == "sample"
    assert len(list(dirs["mixed-chunk"].glob("chunk-*.zstd.bin"))) == 4
    assert config("plain-zstd")["ipc_compression"] == "zstd"
    assert (dirs["tokens-zstd"] / "chunk-0-0.zstd:3.bin").exists()


@pytest.mark.parametrize("name", ["mixed-batch", "mixed-sample", "mixed-chunk"])
def test_compressed_pytree_chunks_read_back_every_record_in_order_and_shuffled(
    dirs: dict[str, Path], name: str
) -> None:
    ds = tidal.Dataset(dirs[name])
    assert ds.num_records == 30
    got = list(ds)
    assert len(got) == 30 and all(same_mixed(g, i) for i, g in enumerate(got))
    shuffled = list(ds.shuffle(seed=3, block_size=8))
    assert [g["n"] for g in shuffled] != list(range(30)) and sorted(g["n"] for g in shuffled) == list(range(30))
    assert all(same_mixed(g, g["n"]) for g in shuffled)
    assert [r["n"] for r in tidal.Dataset(dirs[name], columns=["n"])] == list(range(30))


@pytest.mark.parametrize("name", ["mixed-batch", "mixed-sample", "mixed-chunk", "plain-zstd", "tokens-zstd"])
def test_compressed_chunks_resume_and_split_over_ranks_and_workers(dirs: dict[str, Path], name: str) -> None:
    ds = tidal.Dataset(dirs[name])
    assert assert_resumes_exactly(ds.shuffle(seed=1, block_size=8).repeat(2).batch(3)) == 2 * ds.num_records // 3

    def key(r: dict) -> object:
        return r["input_ids"].tobytes() if "input_ids" in r else r["n"]

    assert_partition_exact(ds.shuffle(seed=2, block_size=8), world_size=2, num_workers=2, key=key)


def test_zstd_arrow_footer_rows_read_back(dirs: dict[str, Path]) -> None:
    assert list(tidal.Dataset(dirs["plain-zstd"])) == [plain(i) for i in range(20)]


def test_token_chunks_of_two_dtypes_read_and_pack_as_the_wider(dirs: dict[str, Path]) -> None:
    # before: uint16 documents next to int32 ones; a best-fit pack whose first document was uint16
    # wrapped the ids past 65,535 of the others
    ds = tidal.Dataset([dirs["tokens"], dirs["tokens32"], dirs["tokens-zstd"]])
    docs = [r["input_ids"] for r in ds]
    assert {d.dtype for d in docs} == {np.dtype(np.int32)}
    want = [next(f(i)) for f, n in ((tokens, 12), (tokens32, 12), (tokens, 30)) for i in range(n)]
    assert [d.tolist() for d in docs] == [w.tolist() for w in want]
    packed = [int(x) for p in ds.pack(16, "best_fit", pad_id=999_999, outputs=("input_ids",)) for x in p["input_ids"]]
    assert sorted(x for x in packed if x != 999_999) == sorted(int(x) for d in docs for x in d)


def test_compressed_token_chunks_pack_in_dataloader_workers(dirs: dict[str, Path]) -> None:
    assert len(list(dirs["tokens-zstd"].glob("chunk-*"))) > 10  # chunk-0-10 sorts before chunk-0-2: index.json decides
    want = [next(tokens(i)) for i in range(30)]
    got = [r["input_ids"] for r in tidal.Dataset(dirs["tokens-zstd"])]
    assert len(got) == 30 and all(g.dtype == np.uint16 and np.array_equal(g, w) for g, w in zip(got, want, strict=True))
    torch = pytest.importorskip("torch")
    ds = tidal.Dataset(dirs["tokens-zstd"]).shuffle(seed=4, block_size=8).pack(seq_len=16, column="input_ids").batch(2)
    full = [b["input_ids"].tolist() for b in tidal.DataLoader(ds, num_workers=2)]
    loader = tidal.DataLoader(ds, num_workers=2)
    head = [b["input_ids"] for b in itertools.islice(loader, 3)]
    assert all(isinstance(b, torch.Tensor) and b.shape == (2, 16) for b in head)
    state = json.loads(json.dumps(loader.state_dict()))
    resumed = tidal.DataLoader(ds, num_workers=2)
    resumed.load_state_dict(state)
    assert [b.tolist() for b in head] + [b["input_ids"].tolist() for b in resumed] == full
    read = Counter(t for b in full for row in b for t in row)
    written = Counter(int(t) for w in want for t in w)
    assert not read - written  # no token twice; each worker leaves less than a batch of its share unpacked
    assert sum(read.values()) > sum(written.values()) - 2 * 2 * 16


def _damage(src: Path, to: Path, name: str, edit: Callable[[bytearray], None]) -> Path:
    import shutil

    copy = Path(shutil.copytree(src, to))
    chunk = copy / name
    data = bytearray(chunk.read_bytes())
    edit(data)
    chunk.write_bytes(bytes(data))
    return chunk


def test_a_truncated_whole_zstd_chunk_is_a_format_error_naming_it(dirs: dict[str, Path], tmp_path: Path) -> None:
    chunk = _damage(dirs["mixed-chunk"], tmp_path / "c", "chunk-0-1.zstd.bin", lambda d: d.__delitem__(slice(-9, None)))
    with pytest.raises(tidal.FormatError, match=rf"{chunk.name}: truncated zstd"):
        tidal.Dataset(chunk.parent)
    chunk = _damage(
        dirs["tokens-zstd"], tmp_path / "t", "chunk-0-0.zstd:3.bin", lambda d: d.__delitem__(slice(20, None))
    )
    with pytest.raises(tidal.FormatError, match=rf"{chunk.name}: truncated zstd"):
        tidal.Dataset(chunk.parent)


def test_a_corrupt_zstd_frame_is_a_record_error_naming_file_and_row(dirs: dict[str, Path], tmp_path: Path) -> None:
    def garble(at: int) -> Callable[[bytearray], None]:
        def edit(d: bytearray) -> None:
            d[at : at + 6] = b"\xff" * 6

        return edit

    # batch: chunk 1 holds items 8..15, its frame 1 items 3..5 of the chunk (11..13 of the dataset)
    chunk = dirs["mixed-batch"] / "chunk-0-1.bin"
    frame = np.frombuffer(chunk.read_bytes(), dtype=np.uint8)
    n, k = struct.unpack("<II", frame[12:20].tobytes())
    assert (n, k) == (8, 3)
    at = struct.unpack("<Q", frame[24 + 4 * (n + 1) + 24 + 8 : 24 + 4 * (n + 1) + 24 + 16].tobytes())[0]
    chunk = _damage(dirs["mixed-batch"], tmp_path / "b", chunk.name, garble(at))
    ds = tidal.Dataset(chunk.parent)  # frames are checked when read, not when indexed
    with pytest.raises(tidal.RecordError, match=rf"{chunk.name}.*row 3.*zstd frame 1 \(items 3..6\)"):
        list(ds)
    skipped = tidal.Dataset(chunk.parent, errors="skip")
    assert [r["n"] for r in skipped] == [i for i in range(30) if i not in (11, 12, 13)]
    # sample: one item is its own frame
    chunk = _damage(dirs["mixed-sample"], tmp_path / "s", "chunk-0-2.bin", garble(4 * (8 + 2) + 2))
    with pytest.raises(tidal.RecordError, match=rf"{chunk.name}.*row 0"):
        list(tidal.Dataset(chunk.parent))
    assert [r["n"] for r in tidal.Dataset(chunk.parent, errors="skip")] == [i for i in range(30) if i != 16]


def test_a_framed_chunk_whose_frame_table_runs_past_its_end_is_a_format_error(
    dirs: dict[str, Path], tmp_path: Path
) -> None:
    chunk = _damage(dirs["mixed-batch"], tmp_path / "b", "chunk-0-0.bin", lambda d: d.__delitem__(slice(-5, None)))
    with pytest.raises(tidal.FormatError, match=rf"{chunk.name}: corrupt framed chunk: frame 2"):
        tidal.Dataset(chunk.parent)

    def many(d: bytearray) -> None:  # frame 0 claims 1,000 items of the chunk's 8
        struct.pack_into("<I", d, 24 + 4 * (8 + 1) + 4, 1000)

    chunk = _damage(dirs["mixed-batch"], tmp_path / "m", "chunk-0-0.bin", many)
    with pytest.raises(tidal.FormatError, match=rf"{chunk.name}: corrupt framed chunk: frame 0 \(items 0..1000"):
        tidal.Dataset(chunk.parent)


def test_an_index_json_naming_a_chunk_outside_its_directory_is_refused(dirs: dict[str, Path], tmp_path: Path) -> None:
    import shutil

    copy = Path(shutil.copytree(dirs["plain"], tmp_path / "p"))
    index = json.loads((copy / "index.json").read_text())
    index["chunks"][1]["filename"] = "../elsewhere.bin"
    (copy / "index.json").write_text(json.dumps(index))
    with pytest.raises(tidal.FormatError, match=r"index.json: chunk '../elsewhere.bin' is not a file name"):
        tidal.Dataset(copy)


@pytest.mark.parametrize("name", ["mixed", "tokens", "mixed-batch", "tokens-zstd"])
def test_a_litdata_directory_on_s3_reads_as_the_local_one(
    dirs: dict[str, Path], name: str, s3: Any, bucket: str, tmp_path: Path
) -> None:
    # a remote chunk-*.bin is LitData when index.json is beside it, and is scanned with that
    # index.json (fetched once for the directory): before, it asked for format= and then failed
    url = s3.upload(dirs[name], bucket, name)
    remote = tidal.Dataset(url, storage_options=s3.options(), cache_dir=tmp_path / "cache")
    local = tidal.Dataset(dirs[name])
    assert remote.num_records == local.num_records > 0
    key = "input_ids" if name.startswith("tokens") else "n"
    # in index.json's order, as a local directory (chunk-0-2 before chunk-0-10): before, in the names'
    assert [s.path.rsplit("/", 1)[1] for s in remote.shards] == [Path(s.path).name for s in local.shards]
    got, want = list(remote), list(local)
    assert [np.asarray(g[key]).tolist() for g in got] == [np.asarray(w[key]).tolist() for w in want]
    assert [np.asarray(g[key]).tolist() for g in remote.shuffle(seed=4)] == [
        np.asarray(w[key]).tolist() for w in local.shuffle(seed=4)
    ]


def test_a_litdata_directory_given_by_its_parent_reads_in_index_json_order_here_and_on_s3(
    dirs: dict[str, Path], s3: Any, bucket: str, tmp_path: Path
) -> None:
    # before: a directory holding a LitData directory listed its chunks in their names' order,
    # here and on S3, not in index.json's (what the directory itself gives)
    import shutil

    copy = Path(shutil.copytree(dirs["plain"], tmp_path / "parent" / "optimized"))
    index = json.loads((copy / "index.json").read_text())
    index["chunks"].reverse()  # not the names' order: index.json decides
    (copy / "index.json").write_text(json.dumps(index))
    order = [c["filename"] for c in index["chunks"]]
    assert order != sorted(order)
    own = tidal.Dataset(copy)
    local = tidal.Dataset(copy.parent)
    url = s3.upload(copy.parent, bucket, "parent")
    remote = tidal.Dataset(url, storage_options=s3.options(), cache_dir=tmp_path / "cache")
    for ds in (own, local, remote):
        assert [Path(p).name for p in ds.shards.paths] == order
    want = [r["n"] for r in own.shuffle(seed=1, block_size=4)]
    assert [r["n"] for r in local.shuffle(seed=1, block_size=4)] == want
    assert [r["n"] for r in remote.shuffle(seed=1, block_size=4)] == want
    tidal.index(url, storage_options=s3.options(), cache_dir=tmp_path / "cache2")
    indexed = tidal.Dataset(url, storage_options=s3.options(), cache_dir=tmp_path / "cache3")
    assert [r["n"] for r in indexed.shuffle(seed=1, block_size=4)] == want
