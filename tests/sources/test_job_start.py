"""A job's start costs the store O(1) requests per rank, never a download of the dataset per node.

Every request the job makes goes through a proxy in front of a real S3 server (moto, on
127.0.0.1) that records it, so the tests count LISTs, HEADs and GETs request by request.
Several "nodes" are several cache directories; ranks are real processes.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import procs
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from conftest import read_index
from fault_proxy import FaultProxy, Requests

import tidal
from tidal.sources.index_file import INDEX_NAME
from tidal.storage import Storage

pytestmark = pytest.mark.slow
pytest_plugins = ["s3_fixtures"]

FILES = 200
BLOCKS = {"block_size": 400, "shards_per_block": 4}  # 20 files of the 200 in a block
SCRIPT = Path(__file__).parents[1] / "distributed" / "run_start.py"


def jsonl_corpus(root: Path, files: int = FILES, per_file: int = 20) -> Path:
    root.mkdir(parents=True)
    for k in range(files):
        data = "".join(json.dumps({"id": k * per_file + i, "text": "x" * 200}) + "\n" for i in range(per_file))
        (root / f"part-{k:04d}.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(data.encode()))
    return root


def parquet_corpus(root: Path, files: int = FILES, per_file: int = 20) -> Path:
    root.mkdir(parents=True)
    for k in range(files):
        ids = list(range(k * per_file, (k + 1) * per_file))
        pq.write_table(pa.table({"id": ids, "text": ["y" * 200] * per_file}), root / f"part-{k:04d}.parquet")
    return root


@pytest.fixture
def proxied(s3: Any) -> Any:
    requests = Requests()
    with FaultProxy(("127.0.0.1", s3.port), every=0, only=requests) as proxy:
        yield proxy, requests


def test_an_indexed_dataset_opens_from_one_request_and_reads_only_what_it_needs(
    s3: Any, bucket: str, tmp_path: Path, proxied: Any
) -> None:
    proxy, requests = proxied
    url = s3.upload(jsonl_corpus(tmp_path / "data"), bucket, "web")
    options = s3.options(proxy.endpoint)
    shards = tidal.index(url, storage_options=options, cache_dir=tmp_path / "indexer")
    assert len(shards) == FILES and shards.total == FILES * 20
    published = json.loads(s3.client.get_object(Bucket=bucket, Key="web/.tidal-index.json")["Body"].read())
    assert published["complete"] is True and len(published["files"]) == FILES

    requests.clear()
    ds = tidal.Dataset(url, storage_options=options, cache_dir=tmp_path / "node").shuffle(seed=1, **BLOCKS)
    assert requests.lists() == 0 and requests.heads() == 0
    assert [p for p, _ in requests.gets("")] == [f"/{bucket}/web/.tidal-index.json"]
    assert ds.num_records == FILES * 20
    it = ds.iterator()
    first = next(it)
    got = requests.gets(".jsonl.zst")
    assert 1 <= len({p for p, _ in got}) < FILES // 4  # the first block's shards and the prefetch, not the dataset
    assert first["id"] in range(FILES * 20)
    rest = [r["id"] for r in it]
    assert sorted([first["id"], *rest]) == list(range(FILES * 20))
    assert requests.heads() == FILES  # each download checked the file is the one indexed


def test_a_file_changed_since_it_was_indexed_is_an_error_when_read(s3: Any, bucket: str, tmp_path: Path) -> None:
    url = s3.upload(jsonl_corpus(tmp_path / "data", files=4), bucket, "web")
    tidal.index(url, storage_options=s3.options(), cache_dir=tmp_path / "indexer")
    s3.put(bucket, "web/part-0002.jsonl.zst", zstandard.ZstdCompressor().compress(b'{"id": 7, "text": "new"}\n'))
    ds = tidal.Dataset(url, storage_options=s3.options(), cache_dir=tmp_path / "node")
    with pytest.raises(
        tidal.StorageError, match=r"part-0002.jsonl.zst changed since the dataset's index was published"
    ):
        list(ds)


def test_an_index_with_keys_outside_the_root_is_not_used(s3: Any, bucket: str, tmp_path: Path) -> None:
    url = s3.upload(jsonl_corpus(tmp_path / "data", files=3), bucket, "web")
    s3.put(bucket, "secret/x.jsonl", b'{"id": -1, "text": "not yours"}\n')
    tidal.index(url, storage_options=s3.options(), cache_dir=tmp_path / "indexer")
    index = read_index(s3.client.get_object(Bucket=bucket, Key="web/.tidal-index.json")["Body"].read())
    index["../secret/x.jsonl"] = {**index.pop("part-0000.jsonl.zst"), "format": "jsonl", "compression": None}
    from tidal.sources.index_file import Entries

    entries = Entries()
    for key, entry in index.items():
        entries.put(key, entry)
    s3.put(bucket, "web/.tidal-index.json", entries.to_json(complete=True))
    ds = tidal.Dataset(url, storage_options=s3.options(), cache_dir=tmp_path / "node")
    assert sorted(r["id"] for r in ds) == list(range(60))  # listed afresh: the index led outside the root


def test_index_runs_in_processes_goes_on_after_a_stop_and_publishes_elsewhere(
    s3: Any, bucket: str, tmp_path: Path, proxied: Any
) -> None:
    proxy, requests = proxied
    url = s3.upload(parquet_corpus(tmp_path / "data", files=70), bucket, "pq")
    options = s3.options(proxy.endpoint)
    other = s3.bucket(bucket + "-idx")
    to = f"s3://{other}/corpus-index.json"
    shards = tidal.index(url, to=to, storage_options=options, cache_dir=tmp_path / "c", workers=2)
    assert shards.total == 70 * 20
    footers = requests.gets(".parquet")
    assert footers and all(r is not None for _, r in footers)  # ranged GETs of footers, never whole files
    assert not list((tmp_path / "c").glob("shards/*.shard"))
    requests.clear()
    tidal.index(url, to=to, storage_options=options, cache_dir=tmp_path / "c")  # again: nothing left to count
    assert requests.gets(".parquet") == [] and requests.lists() >= 1
    requests.clear()
    ds = tidal.Dataset(url, storage_options=options, cache_dir=tmp_path / "node", index_url=to)
    assert requests.lists() == 0 and requests.heads() == 0 and ds.num_records == 70 * 20
    assert sorted(r["id"] for r in ds) == list(range(70 * 20))
    downloaded = {p for p, r in requests.gets(".parquet")}
    assert (
        requests.heads() == len(downloaded) == 70
    )  # no hash (counted from footers): each download checks the size and ETag


def test_index_command_prints_what_it_published(
    s3: Any, bucket: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tidal.cli import main

    url = s3.upload(jsonl_corpus(tmp_path / "data", files=5), bucket, "web")
    argv = ["index", url, "--cache-dir", str(tmp_path / "c"), "--no-progress"]
    for k, v in s3.options().items():
        argv += ["--storage-option", f"{k}={v if isinstance(v, str) else json.dumps(v)}"]
    assert main(argv) == 0
    assert "5 files, 100 records" in capsys.readouterr().out
    published = json.loads(s3.client.get_object(Bucket=bucket, Key="web/.tidal-index.json")["Body"].read())
    assert published["complete"] is True and sorted(published["files"]) == [f"part-{k:04d}.jsonl.zst" for k in range(5)]


def run_ranks(
    tmp_path: Path, name: str, url: str, options: dict, nodes: int, per_node: int, publish: bool = False
) -> list[dict]:
    out = tmp_path / name
    out.mkdir()
    commands = []
    for rank in range(nodes * per_node):
        node = rank // per_node
        config = tmp_path / f"{name}-{rank}.json"
        config.write_text(
            json.dumps(
                {
                    "url": url,
                    "storage_options": options,
                    "cache_dir": str(tmp_path / f"{name}-node{node}"),
                    "out": str(out),
                    "shuffle": BLOCKS,
                    "publish_index": publish,
                }
            )
        )
        env = {**procs.child_env(), "RANK": str(rank), "WORLD_SIZE": str(nodes * per_node)}
        commands.append(procs.Command(f"rank {rank}", [procs.sys.executable, str(SCRIPT), str(config)], env))
    procs.run(commands, timeout=180)
    return [json.loads((out / f"rank-{r}.json").read_text()) for r in range(nodes * per_node)]


@pytest.mark.parametrize(
    ("corpus", "publish"),
    [("jsonl", False), ("jsonl", True), ("parquet", False)],
    ids=["jsonl", "published", "parquet"],
)
def test_without_an_index_each_node_counts_once_writing_nothing_unless_asked_to_publish(
    s3: Any, bucket: str, tmp_path: Path, proxied: Any, corpus: str, publish: bool
) -> None:
    proxy, requests = proxied
    write = jsonl_corpus if corpus == "jsonl" else parquet_corpus
    data = write(tmp_path / "data")
    total = sum(p.stat().st_size for p in data.iterdir())
    url = s3.upload(data, bucket, "web")
    ranks = run_ranks(tmp_path, "job", url, s3.options(proxy.endpoint), nodes=2, per_node=4, publish=publish)
    assert {r["records"] for r in ranks} == {FILES * 20}
    assert len({r["id"] for r in ranks}) == 8  # each rank its own first record
    held = sorted(max(r["cache_bytes"] for r in ranks if r["rank"] // 4 == n) for n in range(2))
    first_reads = 0.6 * total  # four ranks' first blocks (20 files each) and what each fetched ahead (8)
    whole = [p for p, r in requests.gets(".jsonl.zst") if r is None or r.startswith("bytes=0-")]
    written = {p.rsplit("/", 1)[-1] for _, p in requests.writes()}
    if not publish:  # a read writes nothing beside the data; the machine's cache keeps what it counted
        assert written == set(), written
        keys = [o["Key"] for o in s3.client.list_objects_v2(Bucket=bucket)["Contents"]]
        assert all(k.endswith(f".{corpus}" if corpus == "parquet" else ".jsonl.zst") for k in keys), keys
    if corpus == "parquet":
        assert held[1] < first_reads  # counted from footers: no node downloads the dataset to count it
        return
    if not publish:  # each node (not each rank) counts once: the processes of a machine count through its cache
        assert held == [total, total] and len(whole) == 2 * FILES, (held, total, len(whole))
        return
    assert written == {".tidal-index.json", ".tidal-index.json.claim"}, written
    assert held[0] < first_reads and held[1] == total  # one node counted (and published) for both
    assert len(whole) < 1.6 * FILES  # the dataset downloaded once for the job, and the first reads: not per node


def test_under_torch_distributed_rank_0_opens_the_dataset_for_every_rank(
    s3: Any, bucket: str, tmp_path: Path, proxied: Any
) -> None:
    pytest.importorskip("torch")
    proxy, requests = proxied
    url = s3.upload(parquet_corpus(tmp_path / "data", files=40), bucket, "web")
    out = tmp_path / "out"
    out.mkdir()
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "url": url,
                "storage_options": s3.options(proxy.endpoint),
                "cache_dir": str(tmp_path / "node"),
                "out": str(out),
                "shuffle": BLOCKS,
                "dist": True,
            }
        )
    )
    procs.torchrun(SCRIPT, str(config), nproc=3, env=procs.child_env(), timeout=180)
    ranks = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(3)]
    assert {r["records"] for r in ranks} == {40 * 20} and len({r["id"] for r in ranks}) == 3
    index_gets = [p for p, _ in requests.gets(".tidal-index.json")]
    assert requests.lists() == 1 and len(index_gets) <= 2, [
        x[:3] for x in requests.seen if "part-" not in x[1]
    ]  # one listing for the job (and a look for a published index)
    footers = {p for p, r in requests.gets(".parquet") if r is not None and not r.startswith("bytes=0-")}
    assert len(footers) <= 40  # counted once, by rank 0
    assert requests.writes() == []  # nothing written beside the data: the ranks share rank 0's count


def test_a_job_without_an_index_warns_once_naming_tidal_index_and_the_bytes(
    s3: Any, bucket: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = jsonl_corpus(tmp_path / "data", files=6)
    size = sum(p.stat().st_size for p in data.iterdir())
    caplog.set_level(logging.WARNING, logger="tidal")
    url = s3.upload(data, bucket, "web")
    storage = Storage(options=s3.options(), cache_dir=str(tmp_path / "c"))
    assert tidal.Dataset(url, storage=storage).num_records == 120
    warned = [r.getMessage() for r in caplog.records if "tidal index" in r.getMessage()]
    assert len(warned) == 1 and "no index is published beside the data, so this node downloaded 6 files" in warned[0]
    assert f"{size:,} bytes" in warned[0] and f"run `tidal index {url}` once" in warned[0], warned
    assert tidal.Dataset(url, storage=storage).num_records == 120  # counted: from the machine's cache
    assert len([r for r in caplog.records if "tidal index" in r.getMessage()]) == 1


def test_a_named_index_that_cannot_be_read_is_an_error_before_anything_is_listed_or_written(
    s3: Any, bucket: str, tmp_path: Path, proxied: Any
) -> None:
    proxy, requests = proxied
    url = s3.upload(jsonl_corpus(tmp_path / "data", files=3), bucket, "web")
    options = s3.options(proxy.endpoint)
    for index_url, why in [
        (f"s3://{bucket}/indexes/TYPO.json", "is not there"),
        (f"s3://{bucket}-no-such-bucket/index.json", "is not there"),
        (str(tmp_path / "my-index.json"), "is not there"),
    ]:
        requests.clear()
        storage = Storage(options=options, cache_dir=str(tmp_path / "c"), index_url=index_url, publish_index=True)
        with pytest.raises(tidal.StorageError, match=rf"{index_url}: the index named by index_url {why}"):
            tidal.Dataset(url, storage=storage)
        assert requests.lists() == requests.heads() == 0 and requests.writes() == [], requests.seen
    local = tmp_path / "indexes"
    tidal.index(url, to=f"{local}/", storage_options=options, cache_dir=tmp_path / "indexer")  # a local file
    requests.clear()
    ds = tidal.Dataset(url, storage_options=options, cache_dir=tmp_path / "node", index_url=str(local / INDEX_NAME))
    assert ds.num_records == 60 and requests.seen == []  # S3 data opened from a local index: no request at all
