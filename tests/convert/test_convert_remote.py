"""`tidal convert` into object storage (moto's S3, gcp-storage-emulator, Azurite on 127.0.0.1): what a Ray
cluster writes to."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from conftest import make_shards

import tidal
from tidal.convert import convert

pytest_plugins = ["s3_fixtures", "emulator_fixtures"]


@pytest.fixture(params=["s3", "gcs", "azure"])
def store(request: pytest.FixtureRequest) -> Any:
    return request.getfixturevalue(request.param)


def test_a_conversion_into_a_store_publishes_its_index_and_restarts(tmp_path: Path, store: Any) -> None:
    src = make_shards(tmp_path / "src", [5, 23, 1, 17, 30, 2, 11, 29, 12])
    scheme = getattr(store, "scheme", "s3")
    dst = f"{scheme}://{store.bucket(f'convert-{os.getpid()}-{scheme}')}/out"
    options = store.options()
    report = convert(str(src), dst, shard_size="1KB", dst_options=options)
    assert report.shards > 1
    ds = tidal.Dataset(dst, storage_options=options, cache_dir=tmp_path / "cache")
    cached = [p for p in (tmp_path / "cache").rglob("*") if p.is_file() and "index" not in p.parts]
    assert sum(p.stat().st_size for p in cached) < min(e["bytes"] for e in report.entries)  # indexed without a download
    assert list(ds) == list(tidal.Dataset(str(src)))
    by_name = {e["name"]: e["hash"] for e in report.entries}
    assert {s.path.rsplit("/", 1)[1]: s.hash for s in ds.shards} == by_name  # the published index, hashes checked
    again = convert(str(src), dst, shard_size="1KB", dst_options=options)
    assert again.resumed == report.shards


def test_tidal_convert_takes_the_source_options_every_command_takes(
    tmp_path: Path, s3: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from tidal.cli import main

    src = s3.upload(make_shards(tmp_path / "src", [5, 7], kinds=("jsonl",)), s3.bucket(f"src-{os.getpid()}"), "web")
    argv = ["convert", src, str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache"), "--no-progress"]
    for k, v in s3.options().items():
        argv += ["--storage-option", f"{k}={v if isinstance(v, str) else json.dumps(v)}"]
    assert main(argv) == 0
    assert len(list((tmp_path / "cache").rglob("*.shard"))) == 2  # the source's shards, cached where asked
    assert sorted(r["id"] for r in tidal.Dataset(tmp_path / "out")) == list(range(12))
    outside = make_shards(tmp_path / "elsewhere", [3], kinds=("jsonl",))
    (tmp_path / "linked").mkdir()
    (tmp_path / "linked" / "part.jsonl").symlink_to(outside / "part-000.jsonl")
    linked = ["convert", str(tmp_path / "linked"), str(tmp_path / "out2"), "--no-progress"]
    assert main(linked) == 2 and "follow_links=True (--follow-links" in capsys.readouterr().err
    assert main([*linked, "--follow-links"]) == 0
    assert sorted(r["id"] for r in tidal.Dataset(tmp_path / "out2")) == [0, 1, 2]
