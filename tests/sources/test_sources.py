"""tidal.sources: resolve_source(), the one way from what a user names to a dataset's shards."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import make_shards, write_parquet

import tidal
from tidal.sources import resolve_source, storage_settings
from tidal.sources.indexing import published_at
from tidal.storage import Storage

pytest_plugins = ["s3_fixtures"]


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


# -- what a directory holds that is not data ---------------------------------------------------------


def documented(root: Path) -> Path:
    """Parquet files, and what people keep beside them: a README, a license, the metadata of a
    datasets Hub repo, checksums, a macOS .DS_Store, git's attributes."""
    (root / "data").mkdir(parents=True)
    write_parquet(root / "data" / "train-00000.parquet", [{"text": f"doc {i}"} for i in range(5)])
    write_parquet(root / "data" / "train-00001.parquet", [{"text": f"doc {i}"} for i in range(5, 9)])
    (root / "README.txt").write_text("This dataset holds parquet files.\nColumns: text.\n")
    (root / "LICENSE-CC-BY.txt").write_text("Creative Commons Attribution 4.0\n")
    (root / "dataset_infos.json").write_text('{"default": {"features": {"text": {"dtype": "string"}}}}\n')
    (root / "SHA256SUMS").write_text("0123  data/train-00000.parquet\n")
    (root / "data" / "train-00000.parquet.sha256").write_text("0123\n")
    (root / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    (root / ".gitattributes").write_text("*.parquet filter=lfs\n")
    (root / "README.md").write_text("# stray\n")
    return root


def test_documents_beside_data_are_left_out_with_one_warning_naming_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # before: README.txt's lines came first ('This dataset holds parquet files.'), and a typo'd
    # column was blamed on README.txt
    root = documented(tmp_path / "stray")
    with caplog.at_level("WARNING", logger="tidal"):
        ds = tidal.Dataset(root)
    assert [Path(p).name for p in ds.shards.paths] == ["train-00000.parquet", "train-00001.parquet"]
    assert [r["text"] for r in ds] == [f"doc {i}" for i in range(9)]
    warned = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert len(warned) == 1 and all(n in warned[0] for n in ("README.txt", "LICENSE-CC-BY.txt", "dataset_infos.json"))
    with pytest.raises(tidal.SchemaError, match=r"train-00000.parquet: no column 'txet'"):
        tidal.Dataset(root, columns=["txet"])
    # named on its own, or by a glob, a document is read as asked
    assert [r["text"] for r in tidal.Dataset(root / "README.txt")] == [
        "This dataset holds parquet files.",
        "Columns: text.",
    ]
    assert tidal.Dataset(str(root / "*.txt")).num_records == 3


def test_a_directory_of_text_files_reads_every_one(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name, lines in [("a.txt", "one\ntwo\n"), ("b.txt", "three\n"), ("README.txt", "a corpus of words\n")]:
        (corpus / name).write_text(lines)
    ds = tidal.Dataset(corpus)
    assert sorted(r["text"] for r in ds) == ["a corpus of words", "one", "three", "two"]
    (corpus / "dataset_info.json").write_text('{"description": "words"}\n')  # metadata: never records
    assert tidal.Dataset(corpus).num_records == 4


def test_documents_beside_data_on_s3_are_left_out_as_locally(s3: Any, bucket: str, tmp_path: Path) -> None:
    root = documented(tmp_path / "stray")
    url = s3.upload(root, bucket, "stray")
    remote = tidal.Dataset(url, storage_options=s3.options(), cache_dir=tmp_path / "cache")
    assert [p.rsplit("/", 1)[1] for p in remote.shards.paths] == ["train-00000.parquet", "train-00001.parquet"]
    assert list(remote.shuffle(seed=2)) == list(tidal.Dataset(root).shuffle(seed=2))
    tidal.index(url, storage_options=s3.options(), cache_dir=tmp_path / "cache2")  # the published index too
    indexed = tidal.Dataset(url, storage_options=s3.options(), cache_dir=tmp_path / "cache3")
    assert indexed.shards.paths == remote.shards.paths
