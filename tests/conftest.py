"""Small real datasets on disk, made fresh in each test's tmp_path."""

from __future__ import annotations

import functools
import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard


def write_jsonl(path: Path, records: list[dict], compression: str | None = None) -> Path:
    data = "".join(json.dumps(r) + "\n" for r in records).encode()
    if compression == "gzip":
        data = gzip.compress(data)
    elif compression == "zstd":
        data = zstandard.ZstdCompressor().compress(data)
    path.write_bytes(data)
    return path


def write_parquet(path: Path, records: list[dict], row_group_size: int = 7) -> Path:
    pq.write_table(pa.Table.from_pylist(records), path, row_group_size=row_group_size)
    return path


def make_shards(root: Path, sizes: list[int], kinds: tuple[str, ...] = ("jsonl", "jsonl.zst", "parquet")) -> Path:
    """Shards whose records carry consecutive ids: shard k holds ids [sum(sizes[:k]), ...)."""
    root.mkdir(parents=True, exist_ok=True)
    start = 0
    for k, n in enumerate(sizes):
        recs = [{"id": start + i, "text": f"record {start + i} of shard {k}"} for i in range(n)]
        kind = kinds[k % len(kinds)]
        path = root / f"part-{k:03d}.{kind}"
        if kind == "parquet":
            write_parquet(path, recs)
        else:
            write_jsonl(path, recs, {"jsonl": None, "jsonl.gz": "gzip", "jsonl.zst": "zstd"}[kind])
        start += n
    return root


def read_index(data: bytes) -> dict[str, dict]:
    """The entries of an index file (any version tidal reads), by file key."""
    from tidal.sources.index_file import Entries

    table = Entries.parse(json.loads(data))
    return {key: entry for key in table.keys if (entry := table.get(key)) is not None}


@functools.cache
def mds_writer() -> type:
    """Mosaic ``streaming``'s real ``MDSWriter``, or skip the test where it is not installed.

    ``import streaming`` also imports its vision datasets, hence torchvision, which fails to
    import beside the CPU build of torch this project pins; the writer needs none of it, so
    when the package cannot be imported whole its submodules are loaded on their own.
    """
    import importlib.util
    import sys
    import types

    spec = importlib.util.find_spec("streaming")
    if spec is None or spec.submodule_search_locations is None:
        pytest.skip("mosaicml-streaming is not installed")
    try:
        from streaming import MDSWriter

        return MDSWriter
    except (ImportError, RuntimeError):
        for name in [m for m in sys.modules if m == "streaming" or m.startswith("streaming.")]:
            del sys.modules[name]
        package = types.ModuleType("streaming")
        package.__path__ = list(spec.submodule_search_locations)
        package.__spec__ = spec  # find_spec("streaming") keeps working
        sys.modules["streaming"] = package
        from streaming.base.format.mds.writer import MDSWriter

        return MDSWriter


@pytest.fixture
def shards(tmp_path: Path) -> Path:
    """Nine shards of unequal sizes (130 records) in three formats."""
    return make_shards(tmp_path / "data", [5, 23, 1, 17, 30, 2, 11, 29, 12])


_watchdog = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item):  # type: ignore[no-untyped-def]
    """A test about to time out prints the stacks of the processes it started (tests/hang_dump.py)."""
    global _watchdog
    if _watchdog is None:
        from hang_dump import Watchdog

        _watchdog = Watchdog()
    marker = item.get_closest_marker("timeout")
    timeout = marker.args[0] if marker is not None and marker.args else item.config.getini("timeout")
    _watchdog.running(item.nodeid, float(timeout or 0))
    try:
        yield
    finally:
        _watchdog.running(None)
