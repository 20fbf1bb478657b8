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
