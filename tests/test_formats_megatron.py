"""Megatron-LM indexed datasets, written here from the documented MMIDIDX layout (no megatron install)."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

import tidal
from tidal.testing import assert_resumes_exactly

CODES = {np.dtype(np.uint16): 8, np.dtype(np.int32): 4}


def write_megatron(prefix: Path, documents: list[list[np.ndarray]], dtype: type = np.uint16) -> Path:
    """``prefix.bin`` and ``prefix.idx``: each document a list of sequences, as Megatron's builder writes them."""
    seqs = [s.astype(dtype) for doc in documents for s in doc]
    lengths = np.array([len(s) for s in seqs], dtype="<i4")
    pointers = np.concatenate([[0], np.cumsum(lengths.astype(np.int64) * np.dtype(dtype).itemsize)[:-1]]).astype("<i8")
    doc_index = np.concatenate([[0], np.cumsum([len(d) for d in documents])]).astype("<i8")
    prefix.with_suffix(".bin").write_bytes(b"".join(s.tobytes() for s in seqs))
    head = b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, CODES[np.dtype(dtype)], len(seqs), len(doc_index))
    prefix.with_suffix(".idx").write_bytes(head + lengths.tobytes() + pointers.tobytes() + doc_index.tobytes())
    return prefix.with_suffix(".bin")


def corpus(n_docs: int, seed: int = 0) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        [rng.integers(0, 50_000, int(rng.integers(1, 30))) for _ in range(int(rng.integers(1, 4)))]
        for _ in range(n_docs)
    ]


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
