from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

import tidal
from tidal.testing import assert_resumes_exactly

wds = pytest.importorskip("webdataset")


def samples(n: int, start: int = 0) -> list[dict]:
    out = []
    for i in range(start, start + n):
        buf = io.BytesIO()
        np.save(buf, np.arange(i % 5 + 1, dtype=np.int16))
        out.append({"__key__": f"s{i:04d}", "txt": f"caption {i}", "json": {"i": i}, "cls": i % 3,
                    "jpg": bytes([255, 216, i % 256]), "npy": buf.getvalue()})  # fmt: skip
    return out


def write_shards(root: Path, n: int, per_shard: int) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(str(root / "shard-%04d.tar"), maxcount=per_shard, verbose=0) as sink:
        for s in samples(n):
            sink.write({**s, "json": json.dumps(s["json"]).encode(), "cls": str(s["cls"]).encode()})
    return root


def expected(s: dict) -> dict:
    return {**s, "npy": np.load(io.BytesIO(s["npy"]))}


def test_samples_decode_by_extension_in_order(tmp_path: Path) -> None:
    root = write_shards(tmp_path / "wds", 23, per_shard=10)
    got = list(tidal.Dataset(root))
    assert len(got) == 23
    for g, w in zip(got, samples(23), strict=True):
        assert g.keys() == w.keys()
        assert {k: v for k, v in g.items() if k != "npy"} == {k: v for k, v in w.items() if k != "npy"}
        assert np.array_equal(g["npy"], expected(w)["npy"]) and g["npy"].dtype == np.int16


def test_projection_and_resume(tmp_path: Path) -> None:
    root = write_shards(tmp_path / "wds", 30, per_shard=7)
    ds = tidal.Dataset(root, columns=["txt", "cls"])
    assert next(iter(ds)) == {"__key__": "s0000", "txt": "caption 0", "cls": 0}
    assert sorted(r["__key__"] for r in ds.shuffle(seed=0)) == [f"s{i:04d}" for i in range(30)]
    assert assert_resumes_exactly(tidal.Dataset(root).shuffle(seed=1, block_size=8).batch(3)) == 10


def test_gzipped_tar_reads_sequentially(tmp_path: Path) -> None:
    import gzip

    root = write_shards(tmp_path / "wds", 12, per_shard=100)
    raw = (root / "shard-0000.tar").read_bytes()
    (root / "shard-0000.tar").unlink()
    (root / "shard-0000.tar.gz").write_bytes(gzip.compress(raw))
    assert [r["cls"] for r in tidal.Dataset(root)] == [i % 3 for i in range(12)]
    assert assert_resumes_exactly(tidal.Dataset(root).shuffle(seed=1, block_size=4).batch(3)) == 4


def test_truncated_tar_is_a_format_error_with_the_offset(tmp_path: Path) -> None:
    root = write_shards(tmp_path / "wds", 10, per_shard=100)
    path = root / "shard-0000.tar"
    data = path.read_bytes()
    import tarfile

    with tarfile.open(path) as tf:
        last = tf.getmembers()[-1]
    end = last.offset_data + -(-last.size // 512) * 512  # where the end-of-archive blocks begin
    for cut in (len(data) // 2 + 100, len(data) // 2 + 700, end):
        path.write_bytes(data[:cut])  # in a header, in a member's data, before the end-of-archive blocks
        with pytest.raises(tidal.FormatError, match=r"shard-0000.tar: truncated (or corrupt )?tar at byte \d+"):
            tidal.Dataset(root)


def test_bad_member_names_the_sample_row_or_is_skipped(tmp_path: Path) -> None:
    import tarfile

    path = tmp_path / "a.tar"
    with tarfile.open(path, "w") as tf:
        for key, payload in [("a", b'{"x": 1}'), ("b", b"{not json"), ("c", b"[3]")]:
            info = tarfile.TarInfo(f"{key}.json")
            info.size = len(payload)
            tf.addfile(info, io.BytesIO(payload))
    with pytest.raises(tidal.RecordError, match=r"a.tar, row 1: sample 'b'"):
        list(tidal.Dataset(path))
    assert [r["json"] for r in tidal.Dataset(path, errors="skip")] == [{"x": 1}, [3]]
