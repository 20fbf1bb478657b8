"""The shard index: built once, reused, refreshed when a file changes."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import make_shards, read_index, write_jsonl

import tidal
from tidal.sources.index_file import INDEX_NAME


def test_the_index_is_cached_beside_the_data_and_reused(tmp_path: Path) -> None:
    root = make_shards(tmp_path / "data", [3, 4, 5])
    assert tidal.Dataset(root).num_records == 12
    index = json.loads((root / INDEX_NAME).read_text())
    assert sorted(index["files"]) == ["part-000.jsonl", "part-001.jsonl.zst", "part-002.parquet"]
    # a cached count is trusted while size and mtime are unchanged...
    index["rows"][index["files"].index("part-000.jsonl")] = 2
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
    assert len(json.loads((root / INDEX_NAME).read_text())["files"]) == 4


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


def test_shards_are_columns_that_read_as_shard_objects(tmp_path: Path) -> None:
    root = make_shards(tmp_path / "data", [3, 4, 5])
    shards = tidal.Dataset(root).shards
    assert isinstance(shards, tidal.Shards) and len(shards) == 3 and shards.total == 12
    as_objects = tuple(shards)
    assert all(isinstance(s, tidal.Shard) for s in as_objects)
    assert [s.rows for s in as_objects] == shards.rows.tolist() == [3, 4, 5]
    assert shards[1] == as_objects[1] and shards[-1].path.endswith("part-002.parquet")
    assert shards[1:] == as_objects[1:] and shards == as_objects and shards == tidal.Shards.of(as_objects)
    assert shards[-1].info["names"] == as_objects[-1].info["names"] == ["id", "text"]
    again = pickle.loads(pickle.dumps(shards))
    assert again == shards and [s.info for s in again] == [s.info for s in shards]


def test_a_dataset_of_a_thousand_shards_crosses_a_pickle_whole(tmp_path: Path) -> None:
    root = tmp_path / "data"
    root.mkdir()
    for i in range(1000):
        (root / f"part-{i:04d}.jsonl").write_text(f'{{"id": {i}}}\n')
    ds = tidal.Dataset(root).shuffle(seed=1)
    again = pickle.loads(pickle.dumps(ds))
    assert again.shards == ds.shards and again.fingerprint() == ds.fingerprint()
    assert [r["id"] for r in again] == [r["id"] for r in ds] != list(range(1000))


def test_an_index_of_the_previous_version_is_read(tmp_path: Path) -> None:
    root = make_shards(tmp_path / "data", [3, 4], kinds=("jsonl",))
    tidal.Dataset(root)
    entries = read_index((root / INDEX_NAME).read_bytes())
    entries["part-000.jsonl"]["rows"] = 2  # trusted: proves the old file was read, not rebuilt
    (root / INDEX_NAME).write_text(json.dumps({"version": 1, "shards": entries}))
    assert tidal.Dataset(root).num_records == 6
    assert json.loads((root / INDEX_NAME).read_text())["version"] == 1  # nothing was stale: left as it was


@pytest.mark.parametrize(
    "damage",
    [
        lambda ix: ix.update(rows=ix["rows"][:-1]),  # a column shorter than the list of files
        lambda ix: ix.update(rows=[-5] * len(ix["files"])),  # negative counts
        lambda ix: ix.update(rows=["3"] * len(ix["files"])),  # not integers
        lambda ix: ix.update(rows=[2**70] * len(ix["files"])),  # past int64
        lambda ix: ix.update(format=["../../etc"] * len(ix["files"])),  # no such format
        lambda ix: ix.update(info=["x"] * len(ix["files"])),  # not objects
        lambda ix: ix.update(files=[ix["files"][0]] * len(ix["files"])),  # one file named twice
        lambda ix: ix.update(mtime_ns=[True] * len(ix["files"])),  # not a time
        lambda ix: ix.update(files="part-000.jsonl"),  # not a list
    ],
)
def test_a_damaged_or_hostile_index_is_rebuilt_never_trusted(tmp_path: Path, damage: Callable[[dict], None]) -> None:
    root = make_shards(tmp_path / "data", [3, 4, 5], kinds=("jsonl",))
    expected = [r["id"] for r in tidal.Dataset(root)]
    index = json.loads((root / INDEX_NAME).read_text())
    damage(index)
    (root / INDEX_NAME).write_text(json.dumps(index))
    ds = tidal.Dataset(root)
    assert ds.num_records == 12 and [r["id"] for r in ds] == expected
    assert read_index((root / INDEX_NAME).read_bytes()).keys() == {f"part-00{k}.jsonl" for k in range(3)}


def test_an_error_remembered_by_another_tidal_is_scanned_again(tmp_path: Path) -> None:
    """A file an earlier tidal could not read (a reader since fixed) is scanned again, not skipped
    for ever on the index's word; an error this tidal found is trusted while the file is unchanged."""
    from tidal.sources.index_file import scanner

    root = make_shards(tmp_path / "data", [3, 4], kinds=("jsonl",))
    tidal.Dataset(root)
    index = json.loads((root / INDEX_NAME).read_text())
    assert "scanner" not in index  # a readable file's entry says nothing of who counted it
    index["error"] = [None, f"{root / 'part-001.jsonl'}: not JSON (an older reader)"]
    index.pop("rows")
    (root / INDEX_NAME).write_text(json.dumps(index))  # as a tidal before "scanner" wrote it
    ds = tidal.Dataset(root, errors="skip")
    assert ds.num_records == 7 and ds.shards[1].error is None
    index = json.loads((root / INDEX_NAME).read_text())
    index["error"] = [None, f"{root / 'part-001.jsonl'}: not JSON (another build of this version)"]
    index["scanner"] = [None, f"tidal {tidal.__version__}"]  # as tidal said before: its version alone
    index.pop("rows")
    (root / INDEX_NAME).write_text(json.dumps(index))
    ds = tidal.Dataset(root, errors="skip")  # the same version string, other readers: scanned again
    assert ds.num_records == 7 and ds.shards[1].error is None
    index = json.loads((root / INDEX_NAME).read_text())
    index["error"] = [None, f"{root / 'part-001.jsonl'}: not JSON (this tidal)"]
    index["scanner"] = [None, scanner()]
    index.pop("rows")
    (root / INDEX_NAME).write_text(json.dumps(index))
    ds = tidal.Dataset(root, errors="skip")  # trusted: the file is not read again
    assert ds.num_records == 3 and "this tidal" in (ds.shards[1].error or "")
    assert scanner().startswith(f"tidal {tidal.__version__} (readers ") and "pyarrow" in scanner()
    (root / "part-002.parquet").write_bytes(b"PAR1 not a footer")
    tidal.Dataset(root, errors="skip")
    index = json.loads((root / INDEX_NAME).read_text())
    at = index["files"].index("part-002.parquet")
    assert index["error"][at] and index["scanner"][at] == scanner()  # found by this tidal: stamped


def test_entries_put_many_is_put_of_each(tmp_path: Path) -> None:
    from tidal.sources.index_file import Entries

    first = {"a": {"bytes": 1, "rows": 2, "format": "jsonl"}, "b": {"bytes": 3, "rows": 4, "format": "text"}}
    later = {"c": {"bytes": 5, "rows": 6, "format": "jsonl"}, "a": {"bytes": 7, "error": "x: bad", "format": "jsonl"}}
    one, many = Entries(), Entries()
    for key, entry in [*first.items(), *later.items()]:
        one.put(key, entry)
    many.put_many(list(first), list(first.values()))
    many.put_many(list(later), list(later.values()))  # a new key and one scanned again
    assert many.to_json() == one.to_json() and many.at == one.at and many.get("a") == later["a"]


def test_indexing_a_directory_leaves_nothing_in_it_but_the_index(tmp_path: Path) -> None:
    data = make_shards(tmp_path / "data", [3, 4])
    before = set(os.listdir(data))
    tidal.Dataset(data)
    assert set(os.listdir(data)) - before == {".tidal-index.json"}


def test_fewer_records_than_readers_is_a_warning_with_the_numbers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    from tidal.world import World

    ds = tidal.Dataset(make_shards(tmp_path / "data", [3]))
    caplog.set_level(logging.WARNING, logger="tidal")
    got = [list(ds.iterator(World(rank=r, world_size=2, worker=w, num_workers=2))) for r in (0, 1) for w in (0, 1)]
    assert got == [[], [], [], []]
    said = [r.getMessage() for r in caplog.records if "readers" in r.getMessage()]
    assert len(said) == 1 and "holds 3 records and is read by 4 readers (2 ranks x 2 workers)" in said[0]
