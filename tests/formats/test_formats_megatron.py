"""Megatron-LM indexed datasets, written here from the documented MMIDIDX layout (no megatron install)."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from makers import corpus, write_megatron

import tidal
from tidal.testing import assert_resumes_exactly

pytest_plugins = ["s3_fixtures"]


def test_sequences_read_back_in_order(tmp_path: Path) -> None:
    docs = corpus(20)
    write_megatron(tmp_path / "web_text_document", docs)
    got = [r["input_ids"] for r in tidal.Dataset(tmp_path)]  # the directory: the .bin is found, the .idx is not a shard
    want = [s for d in docs for s in d]
    assert len(got) == len(want)
    assert all(g.dtype == np.uint16 and np.array_equal(g, w) for g, w in zip(got, want, strict=True))


def test_int32_tokens_and_resume(tmp_path: Path) -> None:
    docs = corpus(15, seed=1)
    path = write_megatron(tmp_path / "a", docs, dtype=np.int32)
    got = [r["input_ids"] for r in tidal.Dataset(path)]
    assert got[0].dtype == np.int32
    shuffled = sorted(tuple(r["input_ids"].tolist()) for r in tidal.Dataset(path).shuffle(seed=0))
    assert shuffled == sorted(tuple(s.tolist()) for d in docs for s in d)
    assert assert_resumes_exactly(tidal.Dataset(path).shuffle(seed=1, block_size=8).batch(3)) > 5


def test_a_bin_without_its_idx_is_a_flat_token_file(tmp_path: Path) -> None:
    path = write_megatron(tmp_path / "a", corpus(3))
    (tmp_path / "a.idx").unlink()
    assert tidal.Dataset(path).shards[0].format == "flat"


def test_pointer_past_the_bin_is_a_format_error(tmp_path: Path) -> None:
    path = write_megatron(tmp_path / "a", corpus(5))
    idx = bytearray((tmp_path / "a.idx").read_bytes())
    seqs = struct.unpack_from("<Q", idx, 18)[0]
    struct.pack_into("<q", idx, 34 + 4 * seqs + 8, 1 << 30)  # the second pointer
    (tmp_path / "a.idx").write_bytes(bytes(idx))
    with pytest.raises(tidal.FormatError, match=r"a.idx: corrupt: sequence 1 .* outside a.bin"):
        tidal.Dataset(path)


def test_truncated_index_is_a_format_error(tmp_path: Path) -> None:
    path = write_megatron(tmp_path / "a", corpus(5))
    (tmp_path / "a.idx").write_bytes((tmp_path / "a.idx").read_bytes()[:-5])
    with pytest.raises(tidal.FormatError, match=r"a.idx: truncated or corrupt"):
        tidal.Dataset(path)


def test_megatron_pairs_on_s3_read_as_the_local_ones(s3: Any, bucket: str, tmp_path: Path) -> None:
    # before: "a Megatron .bin is read beside its .idx, from a local file" at tidal.Dataset(url)
    local_dir = tmp_path / "local"
    local_dir.mkdir()
    write_megatron(local_dir / "a_text_document", corpus(40, seed=1))
    write_megatron(local_dir / "b_text_document", corpus(25, seed=2), np.int32)
    url = s3.upload(local_dir, bucket, "megatron")
    local = tidal.Dataset(local_dir)
    remote = tidal.Dataset(url, storage_options=s3.options(), cache_dir=tmp_path / "cache")
    assert remote.num_records == local.num_records > 65
    assert [s.info["beside"]["bytes"] for s in remote.shards] == [
        (local_dir / n).stat().st_size for n in ("a_text_document.idx", "b_text_document.idx")
    ]  # what a reader fetches the .idx by; the index keeps no URL of it

    def same(xs: list, ys: list) -> bool:
        return len(xs) == len(ys) and all(
            x.dtype == y.dtype and np.array_equal(x, y) for x, y in zip(xs, ys, strict=False)
        )

    assert same([r["input_ids"] for r in remote], [r["input_ids"] for r in local])
    assert assert_resumes_exactly(remote.shuffle(seed=3, block_size=8).batch(4)) == remote.num_records // 4
    # packed in DataLoader workers, each fetching the pair into the shared cache
    torch = pytest.importorskip("torch")
    packed = lambda ds: ds.shuffle(seed=5, block_size=16).pack(32).batch(2)  # noqa: E731
    got = [b["input_ids"] for b in tidal.DataLoader(packed(remote), num_workers=2)]
    want = [b["input_ids"] for b in tidal.DataLoader(packed(local), num_workers=2)]
    assert got and all(torch.equal(g, w) for g, w in zip(got, want, strict=True)) and len(got) == len(want)


def test_a_corrupt_remote_idx_is_a_format_error_naming_it(s3: Any, bucket: str, tmp_path: Path) -> None:
    local_dir = tmp_path / "local"
    local_dir.mkdir()
    write_megatron(local_dir / "docs", corpus(10))
    write_megatron(local_dir / "good", corpus(7))
    idx = local_dir / "docs.idx"
    idx.write_bytes(idx.read_bytes()[:-8])
    url = s3.upload(local_dir, bucket, "bad")
    ds = tidal.Dataset(url, storage_options=s3.options(), cache_dir=tmp_path / "cache", errors="skip")
    assert len(list(ds)) == ds.num_records == tidal.Dataset(local_dir / "good.bin").num_records
    with pytest.raises(tidal.FormatError, match=rf"{url}/docs.idx: truncated or corrupt"):
        tidal.Dataset(url, storage_options=s3.options(), cache_dir=tmp_path / "cache2")
