"""A bad record anywhere in the data, through every way of reading it.

Under ``errors="raise"`` a bad record is a RecordError naming its file and line or row, in the
training process, whatever reads it: a plain iterator, ``tidal.DataLoader`` with 0 workers or 2
(fork, spawn), ``tidal.jax.Loader``; first in the data, in the middle, last of a reader's share
(read after its last batch, which drop_last drops), or last of the dataset (the remainder of a
finite epoch, which no reader yields: the last reader reads it to check it). Under ``"skip"``, or
a function that returns, each is counted once in ``metrics()["skipped"]`` and the rest yielded.

The data: three files of 20, 20 and 1 records, 41 in all; two readers take 20 each and leave
the last record, a file of its own, as the remainder.
"""

from __future__ import annotations

import functools
import io
import json
import random
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tidal

SIZES = (20, 20, 1)
GROUP = 4  # Parquet rows per row group: a damaged group is the bad "record" there
PLACES = {"first": (0, 0), "middle": (0, 10), "last_of_a_share": (0, 19), "last_of_the_dataset": (2, 0)}


def ident(f: int, i: int) -> int:
    return 100 * f + i


def write_jsonl(root: Path, f: int, n: int, bad: set[int]) -> Path:
    lines = [json.dumps({"id": ident(f, i), "text": f"t {i}"}) if i not in bad else '{"id": 1, "te' for i in range(n)]
    path = root / f"f{f}.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def write_csv(root: Path, f: int, n: int, bad: set[int]) -> Path:
    rows = ["id,text"] + [f"{ident(f, i)},t{i}" + (",extra" if i in bad else "") for i in range(n)]
    path = root / f"f{f}.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


def write_text(root: Path, f: int, n: int, bad: set[int]) -> Path:
    path = root / f"f{f}.txt"
    path.write_bytes(b"".join(b"bad \xff\xfe\n" if i in bad else f"doc {ident(f, i)}\n".encode() for i in range(n)))
    return path


def write_parquet(root: Path, f: int, n: int, bad: set[int]) -> Path:
    path = root / f"f{f}.parquet"
    table = pa.table({"id": [ident(f, i) for i in range(n)], "text": ["x" * 40 + str(i) for i in range(n)]})
    pq.write_table(table, path, row_group_size=GROUP, compression="NONE")
    data = bytearray(path.read_bytes())
    meta = pq.ParquetFile(path).metadata
    for group in {i // GROUP for i in bad}:  # the text column's pages zeroed
        col = meta.row_group(group).column(1)
        start = col.dictionary_page_offset or col.data_page_offset
        data[start : start + col.total_compressed_size] = bytes(col.total_compressed_size)
    path.write_bytes(bytes(data))
    return path


def write_tar(root: Path, f: int, n: int, bad: set[int]) -> Path:
    path = root / f"f{f}.tar"
    with tarfile.open(path, "w") as tar:
        for i in range(n):
            payload = b"{not json" if i in bad else json.dumps({"id": ident(f, i)}).encode()
            info = tarfile.TarInfo(f"k{ident(f, i):04d}.json")
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return path


def write_mds(root: Path, f: int, n: int, bad: set[int]) -> Path:
    from conftest import mds_writer

    out = root / f"f{f}"
    with mds_writer()(out=str(out), columns={"id": "int", "text": "str"}) as w:
        for i in range(n):
            w.write({"id": ident(f, i), "text": f"good{i:03d}"})
    shard = out / "shard.00000.mds"
    data = shard.read_bytes()
    for i in bad:  # not UTF-8, the sample's length kept
        data = data.replace(f"good{i:03d}".encode(), b"\xff\xfe\xfd\xfc" + f"{i:03d}".encode())
    shard.write_bytes(data)
    return out


WRITERS: dict[str, Callable[[Path, int, int, set[int]], Path]] = {
    "jsonl": write_jsonl,
    "csv": write_csv,
    "text": write_text,
    "parquet": write_parquet,
    "webdataset": write_tar,
    "mds": write_mds,
}


def where(fmt: str, f: int, i: int) -> str:
    """How the RecordError names bad record ``i`` of file ``f``."""
    if fmt == "parquet":
        return rf"f{f}\.parquet, row {i // GROUP * GROUP}: unreadable row group"
    if fmt == "csv":
        return rf"f{f}\.csv, line {i + 2}: "
    if fmt in ("jsonl", "text"):
        return rf"f{f}\.{'jsonl' if fmt == 'jsonl' else 'txt'}, line {i + 1}: "
    if fmt == "webdataset":
        return rf"f{f}\.tar, row {i}: sample 'k{ident(f, i):04d}'"
    return rf"f{f}/shard\.00000\.mds, row {i}: undecodable MDS sample"


def dataset(root: Path, fmt: str, bad: dict[int, set[int]], errors: Any) -> tuple[tidal.Dataset, set[int], int]:
    """The three files with ``bad`` rows per file; the dataset, the ids of its good records, and
    how many records are bad (a damaged Parquet group: all of its rows)."""
    root.mkdir()
    paths = [WRITERS[fmt](root, f, n, bad.get(f, set())) for f, n in enumerate(SIZES)]
    good, count = set(), 0
    for f, n in enumerate(SIZES):
        lost = bad.get(f, set())
        if fmt == "parquet":
            lost = {i for i in range(n) if i // GROUP in {b // GROUP for b in lost}}
        good |= {ident(f, i) for i in range(n) if i not in lost}
        count += len(lost)
    return tidal.Dataset([str(p) for p in paths], errors=errors).map(keyed), good, count


def keyed(rec: dict) -> dict:
    """Every format's record as its id (a numeric column every loader carries)."""
    if "json" in rec:
        return {"id": rec["json"]["id"]}
    if "id" in rec:
        return {"id": int(rec["id"])}
    return {"id": int(rec["text"].split()[-1])}


def skip_records(error: tidal.TidalError) -> None:
    """An ``errors=`` function: skips bad records, stops at anything else."""
    if not isinstance(error, tidal.RecordError):
        raise error


def read(ds: tidal.Dataset, how: str) -> tuple[list[int], int]:
    """The ids ``ds`` yields read ``how``, and what it counted as skipped."""
    if how == "iterator":
        it = iter(ds)
        ids = [i for batch in it for i in batch["id"].tolist()]
        return ids, it.stats()["skipped"]
    if how == "jax":
        jax_loader = pytest.importorskip("tidal.jax")
        loader: Any = jax_loader.Loader(ds, num_workers=2)
        ids = [i for batch in loader for i in np.asarray(batch["id"]).tolist()]
        return ids, loader.metrics()["skipped"]
    workers, context = {"workers0": (0, None), "fork": (2, "fork"), "spawn": (2, "spawn")}[how]
    loader = tidal.DataLoader(ds, num_workers=workers, multiprocessing_context=context)
    ids = [i for batch in loader for i in batch["id"].tolist()]
    return ids, loader.metrics()["skipped"]


HOW = ["iterator", "workers0", "fork", "jax"]


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("place", sorted(PLACES))
@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_a_bad_record_anywhere_is_raised_naming_its_file_and_place(
    tmp_path: Path, fmt: str, place: str, how: str
) -> None:
    f, i = PLACES[place]
    ds, _, _ = dataset(tmp_path / "d", fmt, {f: {i}}, "raise")
    # batches of 3: a reader's last 2 records are read after its last batch, and dropped
    with pytest.raises(tidal.RecordError, match=where(fmt, f, i)) as raised:
        read(ds.batch(3), how)
    assert Path(raised.value.path).relative_to(tmp_path / "d").parts[0].startswith(f"f{f}")  # (kept across processes)


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("errors", ["skip", "function"])
@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_every_bad_record_is_counted_once_and_the_rest_yielded(tmp_path: Path, fmt: str, errors: str, how: str) -> None:
    ds, good, count = dataset(tmp_path / "d", fmt, everywhere(), skip_records if errors == "function" else "skip")
    ids, skipped = read(ds.batch(1), how)
    assert sorted(ids) == sorted(good)  # two readers leave the last record, a bad one: every good one is read
    assert skipped == count


def everywhere() -> dict[int, set[int]]:
    """A bad record at every place."""
    bad: dict[int, set[int]] = {}
    for f, i in PLACES.values():
        bad.setdefault(f, set()).add(i)
    return bad


@pytest.mark.slow
def test_workers_started_with_spawn_raise_and_count_as_forked_ones_do(tmp_path: Path) -> None:
    """Spawned workers receive the dataset pickled; their errors and counts reach the loop alike
    (one format: a spawned worker costs seconds)."""
    f, i = PLACES["last_of_the_dataset"]
    ds, _, _ = dataset(tmp_path / "raise", "jsonl", {f: {i}}, "raise")
    with pytest.raises(tidal.RecordError, match=where("jsonl", f, i)):
        read(ds.batch(3), "spawn")
    ds, good, count = dataset(tmp_path / "skip", "jsonl", everywhere(), "skip")
    ids, skipped = read(ds.batch(1), "spawn")
    assert (sorted(ids), skipped) == (sorted(good), count)


# -- the remainder of a finite epoch, shuffled, over any number of readers ---------------------------


def collect(errors: list[tidal.TidalError], error: tidal.TidalError) -> None:
    errors.append(error)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    sizes=st.lists(st.integers(1, 12), min_size=1, max_size=4),
    seed=st.integers(0, 3),
    block=st.sampled_from([3, 8, 1000]),
    readers=st.integers(2, 5),
    fmt=st.sampled_from(["jsonl", "csv"]),
    bad_seed=st.integers(0, 1000),
)
def test_bad_records_of_any_reader_or_of_the_remainder_are_each_reported_once(
    tmp_path_factory: pytest.TempPathFactory,
    sizes: list[int],
    seed: int,
    block: int,
    readers: int,
    fmt: str,
    bad_seed: int,
) -> None:
    pick = random.Random(bad_seed)
    root = tmp_path_factory.mktemp("remainder")
    bad = {f: {i for i in range(n) if pick.random() < 0.3} for f, n in enumerate(sizes)}
    paths = [WRITERS[fmt](root, f, n, bad[f]) for f, n in enumerate(sizes)]
    errors: list[tidal.TidalError] = []
    ds = tidal.Dataset([str(p) for p in paths], errors=functools.partial(collect, errors))
    ds = ds.shuffle(seed=seed, block_size=block)
    seen: list[int] = []
    skipped = 0
    for w in range(readers):
        it = ds.iterator(tidal.World(0, 1, w, readers))
        seen += [int(r["id"]) for r in it]
        skipped += it.stats()["skipped"]
    reported = sorted((Path(e.path).name, e.line) for e in errors if isinstance(e, tidal.RecordError))
    line = 2 if fmt == "csv" else 1  # the line of row 0
    assert reported == sorted((paths[f].name, i + line) for f in bad for i in bad[f])  # each bad record once
    assert skipped == len(errors)
    good = {ident(f, i) for f, n in enumerate(sizes) for i in range(n) if i not in bad[f]}
    assert len(seen) == len(set(seen)) and set(seen) <= good
    assert len(good) - len(seen) <= sum(sizes) % readers  # only the remainder is not yielded
