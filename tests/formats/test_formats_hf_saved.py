"""Directories written by ``datasets``' own ``save_to_disk``, passed to ``tidal.Dataset`` as they are."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest

import tidal
from tidal.testing import assert_partition_exact, assert_resumes_exactly, same

datasets = pytest.importorskip("datasets")
pytest_plugins = ["s3_fixtures"]


@pytest.fixture(autouse=True)
def _caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIDAL_CACHE_DIR", str(tmp_path / "tidal-cache"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    datasets.disable_progress_bars()


def record(i: int) -> dict:
    """Nulls everywhere a column allows one: a missing title, an optional struct, lists with gaps."""
    return {
        "id": i,
        "text": f"document {i} " * (i % 7),
        "title": None if i % 3 == 0 else f"t{i}",
        "meta": None if i % 4 == 1 else {"score": i / 8, "tag": None if i % 5 == 0 else f"g{i % 5}"},
        "ids": None if i % 6 == 5 else list(range(i % 9)),
    }


N = 120


def saved(tmp_path: Path, name: str = "saved", **kw: object) -> Path:
    out = tmp_path / name
    datasets.Dataset.from_list([record(i) for i in range(N)]).save_to_disk(str(out), **kw)
    return out


def test_a_saved_dataset_reads_back_every_record_with_its_nulls(tmp_path: Path) -> None:
    out = saved(tmp_path, num_shards=4)
    ds = tidal.Dataset(out)
    assert [Path(s.path).name for s in ds.shards] == [f"data-0000{i}-of-00004.arrow" for i in range(4)]
    assert {s.format for s in ds.shards} == {"arrow"} and ds.num_records == N
    assert list(ds) == [record(i) for i in range(N)]
    assert list(ds) == list(datasets.load_from_disk(str(out)))  # as datasets itself reads it back
    assert [r["title"] for r in tidal.Dataset(out, columns=["title"])][:4] == [None, "t1", "t2", None]


def test_files_are_read_in_the_order_state_json_lists_them(tmp_path: Path) -> None:
    out = saved(tmp_path, max_shard_size="2KB")
    state = json.loads((out / "state.json").read_text())
    assert len(state["_data_files"]) > 3
    state["_data_files"].reverse()  # not the sorted order: state.json decides, as for load_from_disk
    (out / "state.json").write_text(json.dumps(state))
    theirs = list(datasets.load_from_disk(str(out)))
    assert [r["id"] for r in theirs] != list(range(N))
    assert list(tidal.Dataset(out)) == theirs


def test_a_saved_dataset_shuffles_resumes_and_splits_over_ranks_and_workers(tmp_path: Path) -> None:
    ds = tidal.Dataset(saved(tmp_path, num_shards=5))
    shuffled = list(ds.shuffle(seed=7, block_size=32))
    assert [r["id"] for r in shuffled] != list(range(N)) and sorted(r["id"] for r in shuffled) == list(range(N))
    assert all(r == record(r["id"]) for r in shuffled)
    chain = ds.shuffle(seed=1, block_size=32).repeat(2).batch(8)
    assert assert_resumes_exactly(chain, every=3, horizon=None) == 2 * N // 8  # mid-epoch and across epochs
    assert_partition_exact(ds.shuffle(seed=2, block_size=32), world_size=2, num_workers=2, key=lambda r: r["id"])
    copy = pickle.loads(pickle.dumps(chain))
    assert all(same(a, b) for a, b in zip(copy, chain, strict=True))


def test_the_columns_its_format_shows_are_the_default_columns(tmp_path: Path) -> None:
    hf = datasets.Dataset.from_list([record(i) for i in range(10)])
    hf.set_format("numpy", columns=["id", "title"])
    hf.save_to_disk(str(tmp_path / "fmt"))
    assert list(tidal.Dataset(tmp_path / "fmt"))[:2] == [{"id": 0, "title": None}, {"id": 1, "title": "t1"}]
    assert list(tidal.Dataset(tmp_path / "fmt", columns=["text"]))[1] == {"text": "document 1 "}


def test_a_saved_dataset_dict_asks_for_a_split_by_name(tmp_path: Path) -> None:
    hf = datasets.Dataset.from_list([record(i) for i in range(N)])
    datasets.DatasetDict({"train": hf, "test": hf.select(range(10))}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(tidal.SourceError, match=r"DatasetDict .* splits train, test.*dd/train"):
        tidal.Dataset(tmp_path / "dd")
    assert [r["id"] for r in tidal.Dataset(tmp_path / "dd" / "test")] == list(range(10))
    both = tidal.Dataset([tmp_path / "dd" / "train", tmp_path / "dd" / "test"])
    assert both.num_records == N + 10


def test_a_state_json_that_names_files_outside_or_missing_is_refused(tmp_path: Path) -> None:
    out = saved(tmp_path)
    state = json.loads((out / "state.json").read_text())
    for name, why in [("../x.arrow", "not a file name in its directory"), ("gone.arrow", "lists gone.arrow")]:
        (out / "state.json").write_text(json.dumps({**state, "_data_files": [{"filename": name}]}))
        with pytest.raises(tidal.SourceError, match=rf"state.json: .*{why}"):
            tidal.Dataset(out)
    (out / "state.json").write_text("{")
    with pytest.raises(tidal.SourceError, match=r"state.json: not the state.json of a datasets.save_to_disk"):
        tidal.Dataset(out)


def test_a_directory_with_other_json_is_not_taken_for_a_saved_dataset(tmp_path: Path) -> None:
    out = tmp_path / "plain"
    out.mkdir()
    (out / "state.json").write_text('{"id": 1}\n')  # JSON lines that happen to be called state.json
    assert list(tidal.Dataset(out)) == [{"id": 1}]


def test_a_saved_dataset_on_s3_reads_in_the_order_state_json_lists_them(s3: Any, bucket: str, tmp_path: Path) -> None:
    # before: its dataset_info.json was read as JSON lines ("malformed JSON record")
    out = saved(tmp_path, max_shard_size="2KB")
    state = json.loads((out / "state.json").read_text())
    state["_data_files"].reverse()  # not the names' order: state.json decides
    (out / "state.json").write_text(json.dumps(state))
    url = s3.upload(out, bucket, "saved")
    remote = tidal.Dataset(url, storage_options=s3.options())
    assert [Path(s.path).name for s in remote.shards] == [f["filename"] for f in state["_data_files"]]
    assert list(remote) == list(tidal.Dataset(out)) == list(datasets.load_from_disk(str(out)))
    assert assert_resumes_exactly(remote.shuffle(seed=3, block_size=16).batch(4)) == N // 4
    # a DatasetDict asks for a split, as a local one does; a state.json naming a missing file is refused
    hf = datasets.Dataset.from_list([record(i) for i in range(N)])
    datasets.DatasetDict({"train": hf, "test": hf.select(range(10))}).save_to_disk(str(tmp_path / "dd"))
    url = s3.upload(tmp_path / "dd", bucket, "dd")
    with pytest.raises(tidal.SourceError, match=r"DatasetDict .* splits train, test.*dd/train"):
        tidal.Dataset(url, storage_options=s3.options())
    assert [r["id"] for r in tidal.Dataset(f"{url}/test", storage_options=s3.options())] == list(range(10))
    (out / "state.json").write_text(json.dumps({**state, "_data_files": [{"filename": "gone.arrow"}]}))
    url = s3.upload(out, bucket, "broken")
    with pytest.raises(
        tidal.SourceError, match=r"saved/state.json: lists gone.arrow|broken/state.json: lists gone.arrow"
    ):
        tidal.Dataset(url, storage_options=s3.options())
