"""pack() on token ids users already have: the same sequences as after tokenize(), and exact resumes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_pack import EOS, word_tokenizer

import tidal
from tidal.formats.tokens import TokenWriter
from tidal.testing import assert_resumes_exactly, same

DOCS = [[(7 * d + i) % EOS for i in range(1 + (13 * d) % 37)] for d in range(120)]


@pytest.fixture
def text(tmp_path: Path) -> Path:
    path = tmp_path / "text" / "docs.jsonl"
    path.parent.mkdir()
    path.write_text("".join(json.dumps({"text": " ".join(map(str, d))}) + "\n" for d in DOCS))
    return path


def tokenized(text: Path) -> tidal.Dataset:
    return tidal.Dataset(text).tokenize(word_tokenizer(), eos="<eos>")


@pytest.mark.parametrize(("strategy", "shard_size"), [("concat", 600), ("best_fit", 1 << 20)])
def test_token_shards_pack_as_the_text_they_were_tokenized_from(
    tmp_path: Path, text: Path, strategy: str, shard_size: int
) -> None:
    # concat packs a stream, whatever the shards; best_fit packs what each upstream read
    # brings, which ends at a shard's end, so it is compared on one shard as the text is
    with TokenWriter(tmp_path / "tokens", dtype="uint16", shard_size=shard_size) as writer:
        for record in tokenized(text):
            writer.write(record["input_ids"])
    from_text = list(tokenized(text).pack(16, strategy, buffer_size=4).batch(3))
    from_tokens = list(tidal.Dataset(tmp_path / "tokens").pack(16, strategy, buffer_size=4, pad_id=EOS).batch(3))
    assert len(from_tokens) == len(from_text) > 5
    assert same(from_tokens, from_text)


def test_a_parquet_list_column_packs_with_eos_appended(tmp_path: Path, text: Path) -> None:
    table = pa.table({"ids": pa.array(DOCS, type=pa.list_(pa.int32())), "n": list(range(len(DOCS)))})
    pq.write_table(table, tmp_path / "ids.parquet", row_group_size=17)
    ours = list(tidal.Dataset(tmp_path / "ids.parquet").pack(16, column="ids", eos=EOS))
    want = list(tokenized(text).pack(16))
    assert len(ours) == len(want)
    for a, b in zip(ours, want, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert np.array_equal(a[key], b[key]), key


def test_pretokenized_packing_resumes_exactly(tmp_path: Path, text: Path) -> None:
    with TokenWriter(tmp_path / "tokens", dtype="uint16", shard_size=400) as writer:
        for record in tokenized(text):
            writer.write(record["input_ids"])
    ds = tidal.Dataset(tmp_path / "tokens").shuffle(seed=2, block_size=16).repeat(2).pack(8).batch(2)
    assert assert_resumes_exactly(ds, every=3) > 20


def test_packing_records_without_the_column_names_what_they_have(text: Path) -> None:
    with pytest.raises(
        tidal.TidalError, match=r"none of the first \d+ records has a column 'input_ids' \(they have \['text'\]\)"
    ):
        next(iter(tidal.Dataset(text).pack(16)))
