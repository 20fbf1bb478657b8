"""Any fsspec URL, not only S3: plain HTTP from Python's own server on 127.0.0.1."""

from __future__ import annotations

import io
import json
import os
import random
import re
import shutil
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from conftest import make_shards, mds_writer, write_jsonl, write_parquet
from http_servers import Logged, Quiet, serving

import tidal
from tidal.storage import Retry, Storage
from tidal.storage.fs import Remote


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A directory of shards behind ``http://127.0.0.1:<free port>/``."""
    data = make_shards(tmp_path / "data", [10, 20, 5, 17])
    with serving(data, Quiet) as (url, _):
        yield url, data


def test_an_http_dataset_reads_like_the_local_one(served: tuple[str, Path], tmp_path: Path) -> None:
    base, data = served
    settings = Storage(cache_dir=str(tmp_path / "cache"), retry=Retry(backoff=0.01), timeout=5)
    listed = tidal.Dataset(base + "/", storage=settings)  # a directory page: its links
    named = tidal.Dataset(
        [f"{base}/part-{k:03d}.{kind}" for k, kind in enumerate(["jsonl", "jsonl.zst"])], storage=settings
    )
    assert [s.rows for s in listed.shards] == [10, 20, 5, 17] and named.num_records == 30
    shutil.rmtree(tmp_path / "cache" / "shards")
    local = tidal.Dataset(data).shuffle(seed=4, block_size=9, shards_per_block=2)
    remote = listed.shuffle(seed=4, block_size=9, shards_per_block=2)
    it = remote.iterator()
    assert list(it) == list(local)
    assert it.stats()["cache_misses"] == 4 and it.stats()["bytes_downloaded"] > 0


class _Ranged(Logged):
    """A server that answers ``Range`` with ``206`` and those bytes alone, as object stores do."""

    def send_head(self) -> Any:
        wanted = self.headers.get("Range")
        path = self.translate_path(self.path)
        if wanted is None or self.command != "GET" or not os.path.isfile(path):
            return super().send_head()
        self.server.seen.append((self.command, self.path, wanted))  # type: ignore[attr-defined]
        data = Path(path).read_bytes()
        first, last = re.fullmatch(r"bytes=(\d+)-(\d*)", wanted).groups()  # type: ignore[union-attr]
        body = data[int(first) : int(last) + 1 if last else len(data)]
        self.send_response(206)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Range", f"bytes {first}-{int(first) + len(body) - 1}/{len(data)}")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        return io.BytesIO(body)


def big_corpus(root: Path) -> Path:
    """Parquet, JSON lines, and JSON lines of several parts (``PART`` bytes each): ids 0..2999."""
    make_shards(root, [1000], kinds=("parquet",))
    write_jsonl(root / "part-001.jsonl", [{"id": 1000 + i, "text": "y" * 20} for i in range(1000)])
    write_jsonl(root / "part-002.jsonl", [{"id": 2000 + i, "text": "z" * 200} for i in range(1000)])
    assert (root / "part-002.jsonl").stat().st_size > 3 * PART
    return root


PART = 64 << 10  # Storage.part_size of these tests: 16 MiB in use, the same code paths


@pytest.mark.parametrize("handler", [Logged, _Ranged], ids=["ignores-range", "ranged"])
def test_a_server_that_ignores_range_is_read_whole_once_per_file_and_one_that_honours_it_in_parts(
    tmp_path: Path, handler: type
) -> None:
    data = big_corpus(tmp_path / "data")
    local = sorted(r["id"] for r in tidal.Dataset(data))
    with serving(data, handler) as (base, seen):
        settings = Storage(cache_dir=str(tmp_path / "cache"), part_size=PART, retry=Retry(backoff=0.01), timeout=5)
        ds = tidal.Dataset(base + "/", storage=settings)
        assert ds.num_records == 3000
        it = ds.shuffle(seed=1, block_size=500).iterator()
        assert sorted(r["id"] for r in it) == local
        assert it.stats()["retries"] == 0
        gets = {name: [r for m, p, r in seen if m == "GET" and p == f"/{name}"] for name in os.listdir(data)}
    gets = {name: got for name, got in gets.items() if not name.startswith(".")}
    size = (data / "part-002.jsonl").stat().st_size
    if handler is Logged:  # each file whole, in one GET, never retried (counting and reading share the copy)
        assert len(gets["part-001.jsonl"]) == len(gets["part-002.jsonl"]) == 1, gets
        assert 1 <= len(gets["part-000.parquet"]) <= 2, gets  # its footer, whole, if counted before the others
    else:  # the Parquet file's footer, then the file; the large file in parts, each asked once
        assert all(r is not None for got in gets.values() for r in got), gets
        parts = sorted(gets["part-002.jsonl"], key=lambda r: int(r[6:].split("-")[0]))
        assert parts == [f"bytes={a}-{min(a + PART, size) - 1}" for a in range(0, size, PART)]


def test_a_parquet_file_read_in_place_from_a_server_that_ignores_range_is_fetched_once(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    rng = random.Random(0)
    rows = [{"id": i, "text": f"{rng.getrandbits(1600):0400x}"} for i in range(300)]
    write_parquet(data / "wide.parquet", rows, row_group_size=50)  # > 64 KiB: pyarrow reads its tail first
    with serving(data) as (base, seen):
        remote = Remote("http", Storage(timeout=5, retry=Retry(attempts=2, backoff=0.01)))
        size = (data / "wide.parquet").stat().st_size
        import pyarrow.parquet as pq

        from tidal.storage.fetch import RangeFile

        table = pq.ParquetFile(RangeFile(remote, f"{base}/wide.parquet", size, remote.stats)).read(["id"])
        assert table.column("id").to_pylist() == list(range(300))
        assert seen[0][2] is not None and len(seen) == 1  # asked for its tail, sent it all: every read from that
        assert remote.ignores_ranges(base)
        again = RangeFile(remote, f"{base}/wide.parquet", size, remote.stats)
        assert again.read(4) == b"PAR1" and len(seen) == 2 and seen[-1][2] is None  # known now: asked whole


def test_a_file_a_point_read_brought_whole_is_not_fetched_again_for_the_cache(tmp_path: Path) -> None:
    """A point read from a server that ignores ``Range`` brings the whole file; the block behind
    it, which then downloads the file to the cache, takes that copy: a byte comes over once."""
    from tidal.storage.cache import Entry
    from tidal.storage.fetch import Fetcher

    data = tmp_path / "data"
    data.mkdir()
    (data / "a.jsonl").write_bytes(b"".join(b'{"id": %d}\n' % i for i in range(5000)))
    size = (data / "a.jsonl").stat().st_size
    with serving(data) as (base, seen):
        fetcher = Fetcher(Storage(cache_dir=str(tmp_path / "cache"), timeout=5, part_size=PART))
        fetcher.kept.keeping = True  # a reader's point reads (tidal.stages.blocks)
        point = fetcher.range_file(f"{base}/a.jsonl", size)
        point.seek(1000)
        assert point.read(10) == (data / "a.jsonl").read_bytes()[1000:1010]
        assert len(seen) == 1  # a range asked, the whole file sent
        with fetcher.acquire(Entry(f"{base}/a.jsonl", size, None)) as handle:
            assert Path(handle.path).read_bytes() == (data / "a.jsonl").read_bytes()
        assert len(seen) == 1, seen  # the cache's copy is the point read's
        fetcher.close()


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
@pytest.mark.parametrize("handler", [Logged, _Ranged], ids=["ignores-range", "ranged"])
def test_files_read_in_place_give_the_local_epochs_whether_the_server_honours_range_or_not(
    tmp_path: Path, handler: type, fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Large files are read in place by ranges (a shuffle's first batch by point reads, then the
    blocks), but from a server that ignores ``Range`` each range would bring the whole file: there
    a file is fetched whole once or twice (before and after its first answer shows that) and read
    from the cache. The records are the local epoch's either way."""
    monkeypatch.setattr("tidal.storage.prefetch.RANGE_MIN_BYTES", 0)  # these small files count as large
    data = tmp_path / "data"
    data.mkdir()
    for k in range(2):
        # Parquet: "id" chunks 100 KB apart; JSON lines: 4.8 MB a file, more than a window of 4 MiB
        rows = [{"id": k * 400 + i, "text": f"{i:06d}" * (333 if fmt == "parquet" else 2000)} for i in range(400)]
        if fmt == "parquet":
            write_parquet(data / f"part-{k}.parquet", rows, row_group_size=50)
        else:
            write_jsonl(data / f"part-{k}.jsonl", rows)
    columns = ["id"] if fmt == "parquet" else None
    local = tidal.Dataset(str(data), columns=columns).shuffle(seed=2, block_size=300)
    (data / ".tidal-index.json").unlink(missing_ok=True)  # (the local read's index: not served)
    with serving(data, handler) as (base, seen):
        settings = Storage(cache_dir=str(tmp_path / "cache"), retry=Retry(backoff=0.01), timeout=5)
        index = {}
        if fmt == "jsonl":  # the line offsets, published beside the job (tidal writes nothing on a web server)
            tidal.index(
                base + "/", to=str(tmp_path / "index.json"), storage=replace(settings, cache_dir=str(tmp_path / "ix"))
            )
            index = {"index_url": str(tmp_path / "index.json")}
            seen.clear()
        ds = tidal.Dataset(base + "/", columns=columns, storage=replace(settings, **index))
        assert [r["id"] for r in ds.shuffle(seed=2, block_size=300)] == [r["id"] for r in local]
        gets = [(p, r) for m, p, r in seen if m == "GET" and p.startswith("/part-")]
    cached = list((tmp_path / "cache").glob("shards/*.shard"))
    for k in range(2):
        asked = [r for p, r in gets if p == f"/part-{k}.{fmt}"]
        if handler is Logged:  # it came whole: kept in the cache and read there, not fetched again per range
            assert 1 <= len(asked) <= 2, gets
        else:  # read in place: ranges only, nothing cached
            assert asked and all(r is not None for r in asked) and not cached, gets


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_an_mds_directory_is_counted_from_its_index_json_and_each_shard_checked_against_it(
    tmp_path: Path, compression: str | None
) -> None:
    root = tmp_path / "mds"
    columns = {"id": "int", "text": "str"}
    with mds_writer()(out=str(root), columns=columns, size_limit=1 << 10, compression=compression) as w:
        for i in range(200):
            w.write({"id": i, "text": f"doc {i} " * 5})
    shards = sorted(p.name for p in root.glob("shard.*"))
    assert len(shards) > 3
    with serving(root) as (base, seen):
        settings = Storage(cache_dir=str(tmp_path / "cache"), retry=Retry(attempts=2, backoff=0.01), timeout=5)
        ds = tidal.Dataset(base + "/", storage=settings)
        assert ds.num_records == 200
        assert [p for m, p, _ in seen if m == "GET" and p.startswith("/shard.")] == []  # counted, none downloaded
        assert sorted(r["id"] for r in ds) == list(range(200))
        index = json.loads((root / "index.json").read_text())
        index["shards"][1]["samples"] += 1  # an index.json that does not describe its shard
        (root / "index.json").write_text(json.dumps(index))
        lied = tidal.Dataset(base + "/", storage=replace(settings, cache_dir=str(tmp_path / "other")))
        assert lied.num_records == 201
        with pytest.raises(tidal.FormatError, match=r"samples, not the \d+ the index.json beside it says"):
            list(lied)


def test_tidal_index_of_a_web_directory_is_written_where_asked_and_jobs_open_it_from_there(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tidal.cli import main

    make_shards(tmp_path / "site" / "web", [10, 20, 5])
    cache = ["--cache-dir", str(tmp_path / "cache"), "--no-progress"]
    with serving(tmp_path / "site") as (base, seen):
        assert main(["index", f"{base}/web", *cache]) == 2  # no --to: tidal writes nothing to a web server
        assert "--to" in capsys.readouterr().err and seen == []  # said at once: nothing listed, counted or PUT
        to = tmp_path / "indexes"
        assert main(["index", f"{base}/web", "--to", f"{to}/", *cache]) == 0  # a directory URL without its slash
        assert f"35 records, 1.41 kB: index published at {to}/.tidal-index.json" in capsys.readouterr().out
        seen.clear()
        ds = tidal.Dataset(f"{base}/web", index_url=str(to / ".tidal-index.json"), cache_dir=tmp_path / "node")
        assert ds.num_records == 35 and seen == []  # a local index for web data: no listing, no HEAD, no count
        assert sorted(r["id"] for r in ds) == list(range(35))
        for typo in (str(to / "TYPO.json"), f"{base}/web/TYPO.json"):
            seen.clear()
            with pytest.raises(tidal.StorageError, match=r"TYPO.json: the index named by index_url is not there"):
                tidal.Dataset(f"{base}/web/", index_url=typo, cache_dir=tmp_path / "node2")
            assert [m for m, *_ in seen] == ([] if "://" not in typo else ["GET"])  # nothing listed or written
        (to / "bad.json").write_text("not an index")
        with pytest.raises(tidal.StorageError, match=r"bad.json: the index named by index_url is not JSON"):
            tidal.Dataset(f"{base}/web/", index_url=str(to / "bad.json"), cache_dir=tmp_path / "node2")


def test_a_write_the_server_does_not_implement_is_refused_at_once_not_retried(tmp_path: Path) -> None:
    with serving(tmp_path) as (base, _):
        remote = Remote("http", Storage(timeout=5, retry=Retry(backoff=0.5)))
        with pytest.raises(tidal.StorageError, match=r"PUT failed: .*501") as err:
            remote.put(f"{base}/x.json", b"{}")
    assert err.value.attempts == 1 and err.value.permanent
