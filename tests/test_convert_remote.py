"""`tidal convert` into object storage (moto's S3 on 127.0.0.1): what a Ray cluster writes to."""

from __future__ import annotations

from pathlib import Path

from conftest import make_shards
from s3_server import S3Server

import tidal
from tidal.convert import convert

pytest_plugins = ["s3_fixtures"]


def test_a_conversion_into_s3_publishes_its_index_and_restarts(tmp_path: Path, s3: S3Server, bucket: str) -> None:
    src = make_shards(tmp_path / "src", [5, 23, 1, 17, 30, 2, 11, 29, 12])
    dst = f"s3://{bucket}/out"
    report = convert(str(src), dst, shard_size="1KB", dst_options=s3.options())
    assert report.shards > 1
    ds = tidal.Dataset(dst, storage_options=s3.options(), cache_dir=tmp_path / "cache")
    cached = [p for p in (tmp_path / "cache").rglob("*") if p.is_file() and "index" not in p.parts]
    assert sum(p.stat().st_size for p in cached) < min(e["bytes"] for e in report.entries)  # indexed without a download
    assert list(ds) == list(tidal.Dataset(str(src)))
    by_name = {e["name"]: e["hash"] for e in report.entries}
    assert {s.path.rsplit("/", 1)[1]: s.hash for s in ds.shards} == by_name  # the published index, hashes checked
    again = convert(str(src), dst, shard_size="1KB", dst_options=s3.options())
    assert again.resumed == report.shards
