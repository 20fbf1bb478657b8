from __future__ import annotations

import json
import struct
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest
from conftest import mds_writer

import tidal
from tidal.formats import mds
from tidal.testing import assert_resumes_exactly

COLUMNS = {
    "text": "str", "raw": "bytes", "n": "int", "i8": "int8", "u16": "uint16", "i32": "int32", "u64": "uint64",
    "f16": "float16", "f32": "float32", "f64": "float64", "si": "str_int", "sf": "str_float", "sd": "str_decimal",
    "j": "json", "arr": "ndarray", "arr_t": "ndarray:int16", "arr_ts": "ndarray:float32:2,3",
}  # fmt: skip


def sample(i: int) -> dict:
    return {
        "text": f"doc {i}", "raw": bytes([i, i + 1]), "n": i - 5, "i8": np.int8(-i), "u16": np.uint16(i * 100),
        "i32": np.int32(i), "u64": np.uint64(2**63 + i), "f16": np.float16(i / 2), "f32": np.float32(i / 3),
        "f64": np.float64(i / 7), "si": 10**20 + i, "sf": i + 0.25, "sd": Decimal(f"{i}.10"), "j": {"i": i, "l": [i]},
        "arr": np.arange(i + 1, dtype=np.uint32).reshape(1, -1), "arr_t": np.arange(i % 4 + 1, dtype=np.int16),
        "arr_ts": np.full((2, 3), i, dtype=np.float32),
    }  # fmt: skip


def write(
    root: Path, n: int, compression: str | None = None, columns: dict | None = None, make=sample, limit: int = 1 << 10
) -> Path:
    with mds_writer()(out=str(root), columns=columns or COLUMNS, size_limit=limit, compression=compression) as w:
        for i in range(n):
            w.write(make(i))
    return root


def check(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for k, v in want.items():
        g = got[k]
        if isinstance(v, np.ndarray):
            assert g.dtype == v.dtype and np.array_equal(g, v), k
        elif isinstance(v, np.generic):
            assert type(g) is type(v) and g == v, k
        else:
            assert type(g) is type(v) and g == v, k


@pytest.mark.parametrize("compression", [None, "zstd", "gz"])
def test_every_non_pickle_encoding_reads_back(tmp_path: Path, compression: str | None) -> None:
    root = write(tmp_path / "mds", 12, compression)
    assert len(list(root.glob("shard.*"))) > 2 and (root / "index.json").exists()
    got = list(tidal.Dataset(root))  # a directory: index.json is the manifest, not JSON lines
    assert len(got) == 12
    for i, g in enumerate(got):
        check(g, sample(i))


def test_shuffle_projection_and_resume(tmp_path: Path) -> None:
    root = write(tmp_path / "mds", 30)
    assert sorted(r["n"] for r in tidal.Dataset(root, columns=["n"]).shuffle(seed=0)) == [i - 5 for i in range(30)]
    ds = tidal.Dataset(root, columns=["text", "arr_ts"]).shuffle(seed=1, block_size=8).batch(3)
    assert assert_resumes_exactly(ds) == 10


def test_tree_of_datasets_and_index_json_alone(tmp_path: Path) -> None:
    write(tmp_path / "a" / "train", 5)
    write(tmp_path / "b", 4)
    assert len(list(tidal.Dataset(tmp_path, columns=["n"]))) == 9
    with pytest.raises(tidal.FormatError, match=r"index.json of an MDS, LitData .* pass the directory"):
        tidal.Dataset(tmp_path / "b" / "index.json")


def test_images_stay_bytes_unless_decoding_is_opted_in(tmp_path: Path) -> None:
    from PIL import Image

    img = Image.new("RGB", (4, 3), (10, 20, 30))
    cols = {"jpeg": "jpeg", "png": "png", "pil": "pil", "pngs": "list[png]"}
    root = write(
        tmp_path / "img",
        2,
        columns=cols,
        make=lambda i: {"jpeg": img, "png": img, "pil": img, "pngs": [img, img]},
        limit=1 << 20,
    )
    (rec, _) = list(tidal.Dataset(root))
    assert rec["jpeg"][:2] == b"\xff\xd8" and rec["png"][:4] == b"\x89PNG"
    assert isinstance(rec["pil"], bytes) and len(rec["pngs"]) == 2 and rec["pngs"][0][:4] == b"\x89PNG"
    shard = str(next(root.glob("shard.*.mds")))
    reader = mds.open(shard, None, mds.scan(shard, None), None, "raise", options={"decode_images": True})
    rec = reader.read(0, 1).table[0]
    assert rec["pil"].size == (4, 3) and rec["pil"].getpixel((0, 0)) == (10, 20, 30)
    assert rec["png"].getpixel((1, 1)) == (10, 20, 30) and rec["pngs"][1].size == (4, 3)


def test_pickle_is_refused_unless_opted_in(tmp_path: Path) -> None:
    root = write(
        tmp_path / "p", 3, columns={"n": "int", "obj": "pkl"}, make=lambda i: {"n": i, "obj": {"i": i}}, limit=1 << 20
    )
    with pytest.raises(tidal.FormatError, match=r"column 'obj' is pickled.*allow_pickle=True"):
        list(tidal.Dataset(root))
    assert [r["n"] for r in tidal.Dataset(root, columns=["n"])] == [0, 1, 2]
    shard = str(next(root.glob("shard.*.mds")))
    reader = mds.open(shard, None, mds.scan(shard, None), None, "raise", options={"allow_pickle": True})
    assert reader.read(0, 3).table[2] == {"n": 2, "obj": {"i": 2}}


def test_bad_offsets_are_a_format_error_naming_the_shard(tmp_path: Path) -> None:
    root = write(tmp_path / "mds", 6)
    shard = sorted(root.glob("shard.*.mds"))[1]
    data = bytearray(shard.read_bytes())
    (n,) = struct.unpack_from("<I", data, 0)
    struct.pack_into("<I", data, 4 + 4 * n, len(data) + 50)  # the last offset past the end
    shard.write_bytes(bytes(data))
    with pytest.raises(tidal.FormatError, match=rf"{shard.name}: corrupt sample offsets"):
        tidal.Dataset(root)
    struct.pack_into("<I", data, 4 + 4 * n, len(data))
    struct.pack_into("<I", data, 4, 2)  # the first offset inside the header
    shard.write_bytes(bytes(data))
    with pytest.raises(tidal.FormatError, match=rf"{shard.name}: corrupt MDS shard: samples start at byte 2"):
        tidal.Dataset(root)


def test_a_column_of_two_encodings_is_an_error_naming_it_and_a_column_some_shards_lack_is_none(tmp_path: Path) -> None:
    # before: "b/shard.00000.mds: columns {...} differ from {...}" for both
    write(tmp_path / "a", 3, columns={"n": "int"}, make=lambda i: {"n": i})
    write(tmp_path / "b", 3, columns={"n": "str"}, make=lambda i: {"n": str(i)})
    with pytest.raises(
        tidal.SchemaError, match=r"column 'n' is int in .*a/shard.00000.mds but str in .*b/shard.00000.mds"
    ):
        tidal.Dataset(tmp_path)
    write(tmp_path / "c", 2, columns={"m": "str", "n": "int"}, make=lambda i: {"n": 10 + i, "m": f"m{i}"})
    ds = tidal.Dataset([tmp_path / "a", tmp_path / "c"])
    want = [{"n": 0, "m": None}, {"n": 1, "m": None}, {"n": 2, "m": None}, {"n": 10, "m": "m0"}, {"n": 11, "m": "m1"}]
    assert list(ds) == want and [list(r) for r in ds] == [["n", "m"]] * 5
    assert [b["m"] for b in ds.batch(5)] == [[None, None, None, "m0", "m1"]]
    assert [r["m"] for r in tidal.Dataset([tmp_path / "a", tmp_path / "c"], columns=["m"])] == [None] * 3 + ["m0", "m1"]
    with pytest.raises(tidal.SchemaError, match=r"no column 'mm' \(columns: .*\), nor has any other file"):
        tidal.Dataset([tmp_path / "a", tmp_path / "c"], columns=["mm"])


def test_index_json_is_not_needed(tmp_path: Path) -> None:
    root = write(tmp_path / "mds", 5)
    index = json.loads((root / "index.json").read_text())
    (root / "index.json").unlink()
    assert len(list(tidal.Dataset(root))) == sum(s["samples"] for s in index["shards"]) == 5
