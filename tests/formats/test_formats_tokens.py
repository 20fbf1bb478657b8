from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

import tidal
from tidal.formats.tokens import HEADER, TokenShard, TokenWriter
from tidal.testing import assert_resumes_exactly, same


def documents(n: int, vocab: int = 50_000, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, size=int(rng.integers(0, 40))) for _ in range(n)]


def write(root: Path, docs: list[np.ndarray], dtype: str = "uint16", shard_size: int = 200) -> Path:
    with TokenWriter(root, dtype=dtype, shard_size=shard_size) as w:
        for d in docs:
            w.write(d)
    return root


def test_documents_read_back_in_order_with_the_shard_dtype(tmp_path: Path) -> None:
    docs = documents(60)
    root = write(tmp_path / "tok", docs)
    assert len(list(root.glob("*.tokens"))) > 2
    got = list(tidal.Dataset(root))
    assert len(got) == 60
    for rec, want in zip(got, docs, strict=True):
        assert list(rec) == ["input_ids"] and rec["input_ids"].dtype == np.uint16
        assert np.array_equal(rec["input_ids"], want)


def test_uint32_shards_keep_large_ids(tmp_path: Path) -> None:
    docs = documents(10, vocab=200_000)
    root = write(tmp_path / "tok", docs, dtype="uint32")
    got = [r["input_ids"] for r in tidal.Dataset(root)]
    assert all(g.dtype == np.uint32 for g in got) and all(np.array_equal(g, d) for g, d in zip(got, docs, strict=True))


def test_writer_refuses_ids_that_do_not_fit(tmp_path: Path) -> None:
    with TokenWriter(tmp_path, dtype="uint16") as w, pytest.raises(ValueError, match=r"0\.\.65535"):
        w.write([1, 70_000])


def test_shuffle_yields_the_same_documents_and_resumes_exactly(tmp_path: Path) -> None:
    docs = documents(50)
    root = write(tmp_path / "tok", docs)
    key = lambda r: tuple(r["input_ids"].tolist())  # noqa: E731
    shuffled = [key(r) for r in tidal.Dataset(root).shuffle(seed=0)]
    assert sorted(shuffled) == sorted(tuple(d.tolist()) for d in docs)
    assert assert_resumes_exactly(tidal.Dataset(root).shuffle(seed=1, block_size=8).batch(3)) == 16


def test_window_of_documents_is_a_zero_copy_view(tmp_path: Path) -> None:
    docs = documents(20)
    root = write(tmp_path / "tok", docs, shard_size=10**6)
    shard = TokenShard(str(root / "shard-00000.tokens"))
    ids, offsets = shard.tokens(3, 9)
    assert not ids.flags.owndata and not ids.flags.writeable
    assert np.array_equal(ids, np.concatenate(docs[3:9]))
    assert offsets[0] == 0 and np.array_equal(np.diff(offsets), [len(d) for d in docs[3:9]])


def test_index_carries_a_hash_and_an_altered_shard_is_an_error(tmp_path: Path) -> None:
    root = write(tmp_path / "tok", documents(30), shard_size=10**6)
    index = json.loads((root / "index.json").read_text())
    assert index["format"] == "tidal-tokens" and index["shards"][0]["hash"].startswith(("xxh3_128:", "sha256:"))
    shard = root / "shard-00000.tokens"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF  # same size, one token changed
    shard.write_bytes(bytes(data))
    with pytest.raises(tidal.FormatError, match=r"shard-00000.tokens: hash .* differs"):
        tidal.Dataset(root)


@pytest.mark.parametrize(
    "damage,message",
    [
        (lambda b: b[:-3], "truncated or corrupt"),
        (lambda b: b[:40], "shorter than its header"),
        (lambda b: b"NOTTOKEN" + b[8:], "not a tidal token shard"),
        (lambda b: b[:12] + struct.pack("<I", 3) + b[16:], "3 bytes per token"),
    ],
)
def test_damaged_shard_is_a_format_error_naming_it(tmp_path: Path, damage, message: str) -> None:
    root = write(tmp_path / "tok", documents(10), shard_size=10**6)
    (root / "index.json").unlink()
    shard = root / "shard-00000.tokens"
    shard.write_bytes(damage(shard.read_bytes()))
    with pytest.raises(tidal.FormatError, match=rf"shard-00000.tokens: .*{message}"):
        tidal.Dataset(root)


def test_hostile_offsets_are_refused_before_any_read(tmp_path: Path) -> None:
    root = write(tmp_path / "tok", documents(10), shard_size=10**6)
    (root / "index.json").unlink()
    shard = root / "shard-00000.tokens"
    data = bytearray(shard.read_bytes())
    struct.pack_into("<q", data, HEADER.size + 8 * 3, 1 << 40)  # offset 3 far past the tokens
    shard.write_bytes(bytes(data))
    with pytest.raises(tidal.FormatError, match=r"shard-00000.tokens: corrupt document offsets"):
        tidal.Dataset(root)
    with pytest.raises(tidal.FormatError, match="corrupt document offsets"):
        TokenShard(str(shard))


def test_records_equal_a_tokenized_dataset_shape(tmp_path: Path) -> None:
    root = write(tmp_path / "tok", [np.array([5, 6, 7])], shard_size=10**6)
    (rec,) = list(tidal.Dataset(root / "shard-00000.tokens"))
    assert same(rec, {"input_ids": np.array([5, 6, 7], dtype=np.uint16)})
