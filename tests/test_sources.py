"""tidal.sources: resolve_source(), the one way from what a user names to a dataset's shards."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import make_shards

import tidal
from tidal.sources import resolve_source, storage_settings
from tidal.sources.indexing import published_at
from tidal.storage import Storage


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_shards(tmp_path_factory.mktemp("sources") / "web", [12, 7, 30])


def test_the_dataset_reads_the_shards_resolve_source_finds(data: Path) -> None:
    found = resolve_source(data, columns="text")
    assert found.columns == ("text",) and found.format is None and found.indexed is False
    assert [Path(p).name for p in found.shards.paths] == ["part-000.jsonl", "part-001.jsonl.zst", "part-002.parquet"]
    assert found.shards.rows.tolist() == [12, 7, 30]
    ds = tidal.Dataset(data, columns="text")
    assert ds.shards.paths == found.shards.paths and ds.shards.rows.tolist() == found.shards.rows.tolist()
    assert ds.sources()[""].columns == found.columns


def test_a_list_of_files_and_a_glob_resolve_to_those_files(data: Path) -> None:
    files = sorted(str(p) for p in data.glob("*.jsonl*"))
    assert list(resolve_source(files).shards.paths) == files
    assert list(resolve_source(str(data / "*.parquet")).shards.paths) == [str(data / "part-002.parquet")]
    assert resolve_source(str(data / "*.jsonl"), format="jsonl").format == "jsonl"


def test_a_column_no_file_has_is_refused_with_the_columns_it_has(data: Path) -> None:
    with pytest.raises(tidal.SchemaError, match="txet"):
        resolve_source(data, columns=["txet"])


def test_nothing_there_is_a_source_error(tmp_path: Path) -> None:
    with pytest.raises(tidal.SourceError):
        resolve_source(tmp_path / "nowhere")


def test_storage_settings_put_in_only_what_is_given(tmp_path: Path) -> None:
    base = Storage(timeout=5.0, cache_limit="1GB")
    assert storage_settings(base) is base
    assert storage_settings() == Storage()
    changed = storage_settings(base, storage_options={"anon": True}, cache_dir=tmp_path, index_url="s3://b/i.json")
    assert (changed.timeout, changed.cache_limit, changed.options) == (5.0, 10**9, {"anon": True})
    assert (changed.cache_dir, changed.index_url) == (str(tmp_path), "s3://b/i.json")


def test_the_index_is_published_beside_the_data_unless_told_where() -> None:
    assert published_at("s3://bucket/corpus/") == "s3://bucket/corpus/.tidal-index.json"
    assert published_at("s3://bucket/corpus/**/*.parquet") == "s3://bucket/corpus/.tidal-index.json"
    assert published_at("s3://bucket/corpus/", to="s3://mine/i.json") == "s3://mine/i.json"
    at = Storage(index_url="gs://elsewhere/corpus.json")
    assert published_at("s3://bucket/corpus/", storage=at) == "gs://elsewhere/corpus.json"


def test_a_datasets_object_in_memory_resolves_to_shards_of_its_table() -> None:
    datasets = pytest.importorskip("datasets")
    table = datasets.Dataset.from_dict({"id": list(range(5)), "text": [f"t{i}" for i in range(5)]})
    found = resolve_source(table, columns=["text"])
    assert found.src == [] and found.format == "memory" and found.shards.total == 5
    assert found.columns is None  # the table holds just the columns asked for
