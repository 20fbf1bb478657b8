"""Paths never leave the dataset's root unless the user says so, whichever way the files are listed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import write_jsonl, write_parquet

import tidal
from tidal.sources.index_file import INDEX_NAME


def ids(ds: tidal.Dataset) -> list[int]:
    return sorted(r["id"] for r in ds)


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path]:
    root, outside = tmp_path / "data", tmp_path / "outside"
    (root / "a").mkdir(parents=True)
    outside.mkdir()
    write_jsonl(root / "a" / "x.jsonl", [{"id": i} for i in range(5)])
    write_jsonl(outside / "secret.jsonl", [{"id": 100 + i} for i in range(3)])
    return root, outside


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_an_index_cannot_redirect_a_read(tmp_path: Path, kind: str) -> None:
    root = tmp_path / "data"
    root.mkdir()
    mine, other = root / f"mine.{kind}", tmp_path / f"other.{kind}"
    writer = write_parquet if kind == "parquet" else write_jsonl
    writer(mine, [{"id": i} for i in range(5)])
    writer(other, [{"id": 100 + i} for i in range(5)])
    assert ids(tidal.Dataset(root)) == list(range(5))  # builds the index beside the data
    index = json.loads((root / INDEX_NAME).read_text())
    index["info"] = [{**(info or {}), "file": str(other)} for info in index.get("info", [None] * len(index["files"]))]
    (root / INDEX_NAME).write_text(json.dumps(index))  # a hostile index
    assert ids(tidal.Dataset(root)) == list(range(5))


@pytest.mark.parametrize("source", ["dir", "glob"])
def test_a_link_out_of_the_root_is_refused_by_every_listing(tree: tuple[Path, Path], source: str) -> None:
    root, outside = tree
    os.symlink(outside / "secret.jsonl", root / "a" / "leak.jsonl")
    src = str(root) if source == "dir" else str(root / "**" / "*.jsonl")
    with pytest.raises(tidal.SourceError, match=r"leak.jsonl: a symbolic link to .*secret.jsonl, outside"):
        tidal.Dataset(src)
    assert ids(tidal.Dataset(src, follow_links=True)) == [*range(5), 100, 101, 102]


@pytest.mark.parametrize("source", ["dir", "glob"])
def test_a_linked_directory_out_of_the_root_is_refused_by_every_listing(tree: tuple[Path, Path], source: str) -> None:
    root, outside = tree
    os.symlink(outside, root / "elsewhere")
    src = str(root) if source == "dir" else str(root / "**" / "*.jsonl")
    with pytest.raises(tidal.SourceError, match=r"elsewhere.*outside the dataset's root"):
        tidal.Dataset(src)
    assert ids(tidal.Dataset(src, follow_links=True)) == [*range(5), 100, 101, 102]


@pytest.mark.parametrize("source", ["dir", "glob"])
def test_links_inside_the_root_are_read_once_and_cycles_end(tree: tuple[Path, Path], source: str) -> None:
    root, _ = tree
    os.symlink(root / "a", root / "alias")  # the same directory under a second name
    os.symlink(root, root / "a" / "up")  # a cycle
    os.symlink(root / "a" / "x.jsonl", root / "x-again.jsonl")
    src = str(root) if source == "dir" else str(root / "**" / "*.jsonl")
    assert ids(tidal.Dataset(src)) == list(range(5))


def test_a_file_named_on_its_own_is_read_wherever_it_points(tree: tuple[Path, Path]) -> None:
    root, outside = tree
    os.symlink(outside / "secret.jsonl", root / "named.jsonl")
    assert ids(tidal.Dataset(root / "named.jsonl")) == [100, 101, 102]
