"""Detection: endings, the formats that claim a shared ending from sibling files, manifests, ``format=``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import tidal
from tidal.formats import check_options, detect, known_ending


def touch(path: Path, data: bytes = b"") -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return str(path)


@pytest.mark.parametrize("name,fmt,compression", [
    ("a.csv", "csv", None), ("a.tsv.gz", "csv", "gzip"), ("a.arrow", "arrow", None), ("a.feather", "arrow", None),
    ("a.tar", "webdataset", None), ("a.tar.gz", "webdataset", "gzip"), ("shard.00001.mds", "mds", None),
    ("shard.00001.mds.zstd", "mds", "zstd"), ("shard.00001.mds.snappy", "mds", "snappy"), ("a.tokens", "tokens", None),
    ("a.npy", "flat", None), ("a.bin", "flat", None), ("a.jsonl", "jsonl", None),
])  # fmt: skip
def test_endings(tmp_path: Path, name: str, fmt: str, compression: str | None) -> None:
    assert detect(touch(tmp_path / name)) == (fmt, compression)


def test_bin_is_claimed_by_its_siblings(tmp_path: Path) -> None:
    megatron = touch(tmp_path / "m" / "corpus_text_document.bin")
    touch(tmp_path / "m" / "corpus_text_document.idx")
    chunk = touch(tmp_path / "l" / "chunk-0-3.bin")
    touch(tmp_path / "l" / "index.json", b"{}")
    loose = touch(tmp_path / "l" / "train.bin")  # beside an index.json, but not a chunk's name
    assert detect(megatron)[0] == "megatron" and detect(chunk)[0] == "litdata" and detect(loose)[0] == "flat"
    assert detect("/x/chunk-0-0.bin", exists={"/x/index.json"}.__contains__)[0] == "litdata"  # a listing can answer


def test_a_remote_bin_needs_format_rather_than_a_guess() -> None:
    with pytest.raises(tidal.FormatError, match=r"s3://b/train.bin: a remote .bin file .* pass format="):
        detect("s3://b/train.bin")
    assert detect("s3://b/train.bin", "megatron") == ("megatron", None)
    assert not known_ending("s3://b/train.bin")


def test_manifests_are_not_shards_and_format_overrides(tmp_path: Path) -> None:
    path = touch(tmp_path / "index.json", json.dumps({"shards": []}).encode())
    assert not known_ending(path)
    with pytest.raises(tidal.FormatError, match=r"index.json of an MDS, LitData or tidal token directory"):
        tidal.Dataset(path)
    Path(path).write_text('{"id": 1}\n{"id": 2}\n')
    assert [r["id"] for r in tidal.Dataset(path, format="jsonl")] == [1, 2]


def test_unknown_format_and_ending_name_what_is_known(tmp_path: Path) -> None:
    path = touch(tmp_path / "a.xyz", b"1")
    with pytest.raises(
        tidal.FormatError, match=r"a.xyz: no reader for this file ending; pass format= \(one of arrow, csv"
    ):
        tidal.Dataset(path)
    with pytest.raises(tidal.FormatError, match=r"unknown format 'hdf5'; known: arrow, csv, flat, jsonl, litdata, mds"):
        tidal.Dataset(path, format="hdf5")


def test_a_directory_with_every_kind_lists_only_shards(tmp_path: Path) -> None:
    np.arange(10, dtype=np.uint16).tofile(tmp_path / "flat.bin")
    touch(tmp_path / "meg.bin")
    touch(tmp_path / "meg.idx")
    touch(tmp_path / "index.json", b"{}")
    kept = sorted(Path(p).name for p in [str(f) for f in tmp_path.iterdir()] if known_ending(p))
    assert kept == ["flat.bin", "meg.bin"]


def test_unknown_option_is_an_error_not_a_no_op() -> None:
    assert check_options("mds", {"allow_pickle": True}) == {"allow_pickle": True}
    with pytest.raises(tidal.FormatError, match="unknown format option 'allow_pickles'"):
        check_options("mds", {"allow_pickles": True})


def test_bz2_lines_and_a_stream_codec_that_is_not_supported(tmp_path: Path) -> None:
    import bz2

    (tmp_path / "a.jsonl.bz2").write_bytes(bz2.compress(b'{"id": 1}\n'))
    assert list(tidal.Dataset(tmp_path / "a.jsonl.bz2")) == [{"id": 1}]
    (tmp_path / "b.jsonl.br").write_bytes(b"x")
    with pytest.raises(tidal.FormatError, match=r"b.jsonl.br: brotli is read whole"):
        tidal.Dataset(tmp_path / "b.jsonl.br")
