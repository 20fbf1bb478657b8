"""The shard index: built once, reused, refreshed when a file changes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import make_shards, write_jsonl

import tidal
from tidal.shards import INDEX_NAME


def test_the_index_is_cached_beside_the_data_and_reused(tmp_path: Path) -> None:
    root = make_shards(tmp_path / "data", [3, 4, 5])
    assert tidal.Dataset(root).num_records == 12
    index = json.loads((root / INDEX_NAME).read_text())
    assert sorted(index["shards"]) == ["part-000.jsonl", "part-001.jsonl.zst", "part-002.parquet"]
    # a cached count is trusted while size and mtime are unchanged...
    entry = index["shards"]["part-000.jsonl"]
    entry["rows"] = 2
    (root / INDEX_NAME).write_text(json.dumps(index))
    assert tidal.Dataset(root).num_records == 11
    # ...and recounted when the file changes
    write_jsonl(root / "part-000.jsonl", [{"id": i, "text": "x"} for i in range(9)])
    st = os.stat(root / "part-000.jsonl")
    os.utime(root / "part-000.jsonl", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert tidal.Dataset(root).num_records == 18


def test_a_glob_over_part_of_a_directory_shares_its_index(tmp_path: Path) -> None:
    root = make_shards(tmp_path / "data", [3, 4, 5, 6])
    assert tidal.Dataset(str(root / "*.jsonl")).num_records == 3 + 6
    assert tidal.Dataset(root).num_records == 18
    assert len(json.loads((root / INDEX_NAME).read_text())["shards"]) == 4


def test_the_index_file_is_not_taken_for_data(tmp_path: Path) -> None:
    root = make_shards(tmp_path / "data", [3], kinds=("jsonl",))
    tidal.Dataset(root)
    assert [s.path for s in tidal.Dataset(root).shards] == [str(root / "part-000.jsonl")]
    assert [s.path for s in tidal.Dataset(str(root / "*")).shards] == [str(root / "part-000.jsonl")]


def test_inspect_lists_shards_and_counts(tmp_path: Path) -> None:
    root = make_shards(tmp_path / "data", [3, 4])
    out = subprocess.run(
        [sys.executable, "-m", "tidal.cli", "inspect", str(root)], capture_output=True, text=True, check=True
    ).stdout
    assert out.startswith("2 shards, 7 records")
    assert "jsonl.zstd" in out and "part-000.jsonl" in out
