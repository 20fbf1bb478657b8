"""pack() on token ids users already have: the same sequences as after tokenize(), and exact resumes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from makers import EOS, word_tokenizer

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


def _columns(batches: list[dict]) -> dict[str, np.ndarray]:
    return {key: np.concatenate([np.asarray(b[key]).astype(np.int64) for b in batches]) for key in batches[0]}


@pytest.mark.parametrize("kind", [pa.uint16(), pa.int64()])
@pytest.mark.parametrize("large", [False, True])
@pytest.mark.parametrize("strategy", ["concat", "best_fit"])
def test_an_arrow_list_column_packs_as_its_records_do(
    tmp_path: Path, kind: pa.DataType, large: bool, strategy: str
) -> None:
    # the column's values and offsets are read whole (no Python list per document): the sequences
    # are those of the same documents as JSON lines, read record by record, shuffled or not
    docs = [d if i % 11 else [] for i, d in enumerate(DOCS)]  # some documents of no tokens
    lists = pa.large_list(kind) if large else pa.list_(kind)
    pq.write_table(pa.table({"ids": pa.array(docs, type=lists)}), tmp_path / "ids.parquet", row_group_size=13)
    (tmp_path / "ids.jsonl").write_text("".join(json.dumps({"ids": d}) + "\n" for d in docs))
    for shuffled in (False, True):
        runs = []
        for name in ("ids.parquet", "ids.jsonl"):
            ds = tidal.Dataset(tmp_path / name)
            if shuffled:
                ds = ds.shuffle(seed=3, block_size=40)
            ds = ds.pack(16, strategy, column="ids", eos=EOS, mask_boundaries=True, buffer_size=3).batch(5)
            runs.append(_columns(list(ds)))
        arrow, records = runs
        assert arrow.keys() == records.keys() == {"input_ids", "labels", "position_ids", "segment_ids"}
        for key in arrow:
            assert np.array_equal(arrow[key], records[key]), (shuffled, key)
        assert len(arrow["input_ids"]) * 16 >= sum(map(len, docs)) // 2


def test_nulls_in_an_arrow_list_column_go_to_the_errors_policy(tmp_path: Path) -> None:
    # a null document is named by file and row, or skipped and counted: never packed as nothing
    docs: list[list[int] | None] = [list(d) for d in DOCS]
    docs[30] = None
    pq.write_table(
        pa.table({"ids": pa.array(docs, type=pa.list_(pa.uint16()))}), tmp_path / "n.parquet", row_group_size=25
    )
    with pytest.raises(tidal.RecordError, match=r"n\.parquet.*row 30.*found null"):
        list(tidal.Dataset(tmp_path / "n.parquet").pack(16, column="ids", eos=EOS))
    skipping = tidal.Dataset(tmp_path / "n.parquet", errors="skip").pack(16, column="ids", eos=EOS)
    it = skipping.iterator()
    got = _columns(list(it))
    kept = [d for d in docs if d is not None]
    pq.write_table(pa.table({"ids": pa.array(kept, type=pa.list_(pa.uint16()))}), tmp_path / "k.parquet")
    want = _columns(list(tidal.Dataset(tmp_path / "k.parquet").pack(16, column="ids", eos=EOS)))
    assert np.array_equal(got["input_ids"], want["input_ids"])
    assert it.stats()["skipped"] == 1


@pytest.mark.parametrize("strategy", ["concat", "best_fit"])
def test_outputs_makes_only_the_arrays_asked_for(tmp_path: Path, strategy: str) -> None:
    with TokenWriter(tmp_path / "tokens", dtype="uint16", shard_size=400) as writer:
        for d in DOCS:
            writer.write(np.asarray([*d, EOS], dtype=np.uint16))
    ds = tidal.Dataset(tmp_path / "tokens").shuffle(seed=1, block_size=30)
    full = list(ds.pack(16, strategy, buffer_size=3).batch(4))
    lean = ds.pack(16, strategy, buffer_size=3, outputs=["input_ids"]).batch(4)
    two = list(ds.pack(16, strategy, buffer_size=3, outputs=("segment_ids", "input_ids")).batch(4))
    assert [list(b) for b in lean] == [["input_ids"]] * len(full)
    assert [list(b) for b in two] == [["input_ids", "segment_ids"]] * len(full)  # in the usual order
    assert np.array_equal(_columns(list(lean))["input_ids"], _columns(full)["input_ids"])
    assert np.array_equal(_columns(two)["segment_ids"], _columns(full)["segment_ids"])
    # the same positions: a state of one resumes the other, and the config says what is made
    assert lean.fingerprint() == ds.pack(16, strategy, buffer_size=3).batch(4).fingerprint()
    again = tidal.Dataset.from_config(lean.to_config())
    assert [list(b) for b in again] == [["input_ids"]] * len(full)
    with_workers = [b["input_ids"] for b in tidal.DataLoader(lean, num_workers=2)]
    want = [b["input_ids"] for b in tidal.DataLoader(ds.pack(16, strategy, buffer_size=3).batch(4), num_workers=2)]
    assert len(with_workers) == len(want) > 3
    assert all(a.equal(b) for a, b in zip(with_workers, want, strict=True))


@pytest.mark.parametrize("outputs", [(), ("tokens",), ("input_ids", "input_ids"), "input_ids"])
def test_outputs_names_only_what_pack_makes(tmp_path: Path, outputs: object) -> None:
    with pytest.raises(tidal.ArgumentError, match="outputs must name some of input_ids, labels, position_ids"):
        (tmp_path / "d.jsonl").write_text('{"input_ids": [1, 2]}\n')
        tidal.Dataset(tmp_path / "d.jsonl").pack(4, outputs=outputs)  # type: ignore[arg-type]
