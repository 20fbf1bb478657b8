"""Hugging Face sources: ``datasets.Dataset`` (Arrow cache files or in memory), ``datasets.IterableDataset``
(its data files), and Hub repos through ``hf://`` URLs, served by a local fake of the Hub's HTTP API."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hf_hub_fake import FakeHub

import tidal
from tidal.convert import convert

datasets = pytest.importorskip("datasets")
pytest.importorskip("huggingface_hub")


@pytest.fixture(autouse=True)
def _caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIDAL_CACHE_DIR", str(tmp_path / "tidal-cache"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    datasets.disable_progress_bars()


def rows(start: int, n: int) -> list[dict]:
    return [{"id": i, "text": f"document {i}"} for i in range(start, start + n)]


@pytest.fixture
def files(tmp_path: Path) -> Path:
    root = tmp_path / "files"
    root.mkdir()
    with open(root / "a.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows(0, 40))
    pq.write_table(pa.Table.from_pylist(rows(40, 30)), root / "b.parquet")
    pq.write_table(pa.Table.from_pylist(rows(70, 30)), root / "c.parquet")
    return root


def load(files: Path, kind: str, **kw: object) -> object:
    data = str(files / "a.jsonl") if kind == "json" else [str(files / "b.parquet"), str(files / "c.parquet")]
    return datasets.load_dataset(kind, data_files=data, split="train", **kw)


# -- datasets.Dataset -------------------------------------------------------------------------------


def test_an_arrow_backed_dataset_is_read_from_its_cache_files(files: Path) -> None:
    hf = load(files, "json")
    ds = tidal.Dataset(hf)
    assert {s.format for s in ds.shards} == {"arrow"}
    assert [s.path for s in ds.shards] == [f["filename"] for f in hf.cache_files]
    assert list(ds) == list(hf) == rows(0, 40)
    assert list(tidal.Dataset(hf.select_columns(["text"]))) == [{"text": r["text"]} for r in rows(0, 40)]
    assert list(tidal.Dataset(hf, columns=["id"])) == [{"id": i} for i in range(40)]
    shuffled = list(tidal.Dataset(hf).shuffle(seed=3))
    assert sorted(r["id"] for r in shuffled) == list(range(40)) and shuffled != rows(0, 40)


def test_a_dataset_whose_rows_are_not_its_files_rows_is_refused_with_what_to_do(files: Path) -> None:
    hf = load(files, "json")
    with pytest.raises(tidal.SourceError, match=r"indices mapping.*flatten_indices\(\)"):
        tidal.Dataset(hf.shuffle(seed=0))
    assert list(tidal.Dataset(hf.select(range(5, 10)).flatten_indices())) == rows(5, 5)
    with pytest.raises(tidal.SourceError, match=r"column 'body'.*save_to_disk"):
        tidal.Dataset(hf.rename_column("text", "body"))
    with pytest.raises(tidal.SourceError, match=r"several splits.*ds\['train'\]"):
        tidal.Dataset(datasets.DatasetDict({"train": hf}))
    with pytest.raises(tidal.SourceError, match="no column 'nope'"):
        tidal.Dataset(hf, columns=["nope"])


def test_an_in_memory_dataset_pickles_with_its_table_and_crosses_into_spawn_workers(tmp_path: Path) -> None:
    hf = datasets.Dataset.from_dict({"id": list(range(300)), "text": [f"t{i}" for i in range(300)]})
    assert hf.cache_files == []
    ds = tidal.Dataset(hf)
    assert {s.format for s in ds.shards} == {"memory"}
    assert list(ds) == hf.to_list()
    again = pickle.loads(pickle.dumps(ds.shuffle(seed=1)))
    assert sorted(r["id"] for r in again) == list(range(300))
    # a conversion with two spawn processes sends the chain, table included, to each
    report = convert(ds, tmp_path / "out", workers=2, shard_size="1KB")
    assert report.shards >= 2 and list(tidal.Dataset(str(tmp_path / "out"))) == hf.to_list()


# -- datasets.IterableDataset ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["json", "parquet"])
def test_a_streaming_dataset_is_read_from_its_data_files(files: Path, kind: str) -> None:
    it = load(files, kind, streaming=True)
    ds = tidal.Dataset(it)
    assert {s.format for s in ds.shards} == {"jsonl" if kind == "json" else "parquet"}
    assert list(ds) == list(it)
    assert list(tidal.Dataset(it.select_columns(["id"]))) == [{"id": r["id"]} for r in it]


def gen() -> Iterator[dict]:
    yield from rows(0, 3)


def test_a_streaming_dataset_not_backed_by_readable_files_is_refused(files: Path) -> None:
    it = load(files, "json", streaming=True)
    with pytest.raises(tidal.SourceError, match=r"applies Mapped.*tidal's \.map\(\)"):
        tidal.Dataset(it.map(lambda r: r))
    with pytest.raises(tidal.SourceError, match="applies BufferShuffled"):
        tidal.Dataset(it.shuffle(seed=0))
    with pytest.raises(tidal.SourceError, match=r"generator.*to_parquet"):
        tidal.Dataset(datasets.IterableDataset.from_generator(gen))
    from datasets.distributed import split_dataset_by_node

    with pytest.raises(tidal.SourceError, match="split_dataset_by_node"):
        tidal.Dataset(split_dataset_by_node(it, rank=0, world_size=2))


def test_import_tidal_does_not_import_datasets() -> None:
    code = "import sys, tidal; assert 'datasets' not in sys.modules and 'huggingface_hub' not in sys.modules"
    subprocess.run(
        [sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    )


# -- the Hub, through hf:// --------------------------------------------------------------------------------


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[FakeHub]:
    main, converted = tmp_path / "hub" / "main", tmp_path / "hub" / "parquet"
    (main / "data").mkdir(parents=True)
    (converted / "default" / "train").mkdir(parents=True)
    (converted / "default" / "test").mkdir(parents=True)
    (main / "README.md").write_text("---\nlicense: mit\n---\n# web\n")
    for k in range(3):
        pq.write_table(pa.Table.from_pylist(rows(10 * k, 10)), main / "data" / f"train-{k:05d}-of-00003.parquet")
        pq.write_table(
            pa.Table.from_pylist(rows(100 + 10 * k, 10)), converted / "default" / "train" / f"{k:04d}.parquet"
        )
    pq.write_table(pa.Table.from_pylist(rows(500, 5)), converted / "default" / "test" / "0000.parquet")
    with FakeHub({"org/web": {"main": main, "refs/convert/parquet": converted}}) as server:
        yield server


def test_a_hub_repo_is_read_through_hf_urls(hub: FakeHub) -> None:
    ds = tidal.Dataset("hf://datasets/org/web", storage_options=hub.options())
    assert [s.path.rsplit("/", 1)[1] for s in ds.shards] == [f"train-{k:05d}-of-00003.parquet" for k in range(3)]
    assert list(ds) == rows(0, 30)
    glob = tidal.Dataset(
        "hf://datasets/org/web/data/train-0000[12]-*.parquet", columns=["id"], storage_options=hub.options()
    )
    assert [r["id"] for r in glob] == list(range(10, 30))


def test_the_parquet_conversion_branch_is_named_with_at_parquet(hub: FakeHub, tmp_path: Path) -> None:
    url = "hf://datasets/org/web@~parquet/default/train"
    ds = tidal.Dataset(url, storage_options=hub.options())
    assert list(ds) == rows(100, 30)
    assert all("@refs%2Fconvert%2Fparquet/" in s.path for s in ds.shards)
    report = convert(url, tmp_path / "out", storage_options=hub.options())  # straight from the Hub to local shards
    assert report.records == 30 and list(tidal.Dataset(str(tmp_path / "out"))) == rows(100, 30)


def test_a_missing_repo_or_file_is_named(hub: FakeHub) -> None:
    with pytest.raises(tidal.SourceError, match="org/nothing"):
        tidal.Dataset("hf://datasets/org/nothing", storage_options=hub.options())
    with pytest.raises(tidal.SourceError, match=r"absent\.parquet"):
        tidal.Dataset("hf://datasets/org/web/data/absent.parquet", storage_options=hub.options())


def test_a_streaming_dataset_loaded_from_the_hub_is_read_from_its_files(hub: FakeHub, tmp_path: Path) -> None:
    # datasets reads HF_ENDPOINT when it is imported: a process of its own, pointed at the fake Hub
    code = (
        "import datasets, tidal\n"
        "it = datasets.load_dataset('org/web', split='train', streaming=True)\n"
        "ds = tidal.Dataset(it)\n"
        "assert all(s.path.startswith('hf://datasets/org/web@') for s in ds.shards), ds.shards\n"
        "assert list(ds) == list(it), 'different records'\n"
        "print(len(list(ds)))\n"
    )
    env = {
        **os.environ,
        "HF_ENDPOINT": hub.endpoint,
        "HF_HOME": str(tmp_path / "hf-home"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "PYTHONPATH": os.pathsep.join(sys.path),
        "PYTHONWARNINGS": "ignore",
    }
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "30"
