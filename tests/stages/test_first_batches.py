"""A reader's first batch comes from point reads of just its records, and every batch, state and
bad record is the one reading whole blocks gives (tidal.stages.points, tidal.stages.blocks).

Each run is compared with the same run with point reads turned off: the order is a pure function
of the arguments, so the two must agree batch for batch, state for state, error for error.
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tidal
from tidal.stages.blocks import BlockReader

pytest_plugins = ["s3_fixtures"]

SIZES = (23, 5, 41, 17, 60, 9)
GROUP = 7  # Parquet rows per row group


def ident(f: int, i: int) -> int:
    return 1000 * f + i


def corpus(root: Path, fmt: str, bad: dict[int, set[int]]) -> Path:
    """Files of ``SIZES`` records of ``fmt`` (``mixed``: JSON lines, zstd and Parquet in turn); ``bad``:
    per file, rows written bad (a line that is not JSON, text that is not UTF-8, a Parquet group zeroed)."""
    root.mkdir()
    for f, n in enumerate(SIZES):
        kind = ("jsonl", "jsonl.zst", "parquet")[f % 3] if fmt == "mixed" else fmt
        rows = [{"id": ident(f, i), "text": f"doc {ident(f, i)} " + "x" * (i % 5)} for i in range(n)]
        lost = bad.get(f, set())
        if kind in ("jsonl", "jsonl.zst"):
            data = b"".join(
                b'{"id": 1, "te\n' if i in lost else json.dumps(r).encode() + b"\n" for i, r in enumerate(rows)
            )
            (root / f"f{f}.{kind}").write_bytes(
                zstandard.ZstdCompressor().compress(data) if kind == "jsonl.zst" else data
            )
        elif kind == "txt":
            data = b"".join(b"bad \xff\xfe\n" if i in lost else f"{r['id']}\n".encode() for i, r in enumerate(rows))
            (root / f"f{f}.txt").write_bytes(data)
        else:
            path = root / f"f{f}.parquet"
            pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=GROUP, compression="NONE")
            data = bytearray(path.read_bytes())
            meta = pq.ParquetFile(path).metadata
            for group in {i // GROUP for i in lost}:  # the text column's pages zeroed: the group unreadable
                col = meta.row_group(group).column(1)
                start = col.dictionary_page_offset or col.data_page_offset
                data[start : start + col.total_compressed_size] = bytes(col.total_compressed_size)
            path.write_bytes(bytes(data))
    return root


BAD = {0: {0, 11}, 2: {20}, 4: {59}}  # first of the dataset, mid-file, last of a file


@pytest.fixture(scope="module")
def corpora(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("first-batches")
    out = {fmt: corpus(root / fmt, fmt, {}) for fmt in ("jsonl", "txt", "parquet", "mixed")}
    out.update({f"bad-{fmt}": corpus(root / f"bad-{fmt}", fmt, BAD) for fmt in ("jsonl", "txt", "parquet")})
    return out


@contextlib.contextmanager
def whole_blocks() -> Iterator[None]:
    """Point reads turned off: every block read whole before any of it is yielded."""
    with mock.patch.object(BlockReader, "_points", lambda self, *args: None):
        yield


def value(item: Any) -> Any:
    if isinstance(item, dict):
        return {k: value(v) for k, v in item.items()}
    return item.tolist() if hasattr(item, "tolist") else item


def run(ds: tidal.Dataset, world: tidal.World, state: dict | None = None) -> tuple[list, list, Any, dict]:
    """Every item a reader yields and its state after each, what it raised, and its counts."""
    items, states, raised = [], [], None
    it = ds.iterator(world, state=state)
    try:
        for item in it:
            items.append(value(item))
            states.append(json.dumps(it.state(), sort_keys=True))
    except tidal.TidalError as exc:
        raised = f"{type(exc).__name__}: {exc}"
    stats = {k: it.stats()[k] for k in ("items", "skipped", "passed")}
    it.close()
    return items, states, raised, stats


class Reported(list):
    """An ``errors=`` function that keeps what it is given: each error once, in words."""

    def __call__(self, error: tidal.TidalError) -> None:
        self.append(str(error))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    fmt=st.sampled_from(["jsonl", "txt", "parquet", "mixed", "bad-jsonl", "bad-txt", "bad-parquet"]),
    seed=st.sampled_from([None, 0, 1, 2]),
    block=st.sampled_from([4, 16, 50, 1000]),
    per_block=st.integers(1, 6),
    batch=st.sampled_from([None, 1, 3, 8]),
    topology=st.sampled_from([(0, 1, 0, 1), (1, 2, 0, 1), (0, 1, 1, 2), (2, 3, 1, 2)]),
    errors=st.sampled_from(["skip", "function", "raise"]),
    cut=st.integers(0, 30),
    epochs=st.sampled_from([1, 2]),
)
def test_point_reads_give_what_whole_blocks_give_batch_for_batch_state_for_state_error_for_error(
    corpora: dict[str, Path],
    fmt: str,
    seed: int | None,
    block: int,
    per_block: int,
    batch: int | None,
    topology: tuple[int, int, int, int],
    errors: str,
    cut: int,
    epochs: int,
) -> None:
    outcomes = []
    for points in (True, False):
        reported = Reported()
        policy: Any = reported if errors == "function" else errors
        ds = tidal.Dataset(corpora[fmt], errors=policy)
        if seed is not None:
            ds = ds.shuffle(seed=seed, block_size=block, shards_per_block=per_block)
        ds = ds.repeat(epochs) if epochs > 1 else ds
        ds = ds.batch(batch, drop_last=False) if batch else ds
        rank, ranks, worker, workers = topology
        world = tidal.World(rank=rank, world_size=ranks, worker=worker, num_workers=workers)
        with contextlib.nullcontext() if points else whole_blocks():
            items, states, raised, stats = run(ds, world)
            resumed = None
            if cut < len(states):  # a reader restored from a state starts with point reads too
                resumed = run(ds, world, json.loads(states[cut]))
        outcomes.append((items, states, raised, stats, Counter(reported), resumed))
    mine, theirs = outcomes
    assert mine[2] == theirs[2]  # the same error, if any
    if errors == "raise" and mine[2] is not None:
        # raised when the block read whole meets the bad record: before its first batch, or after the
        # first batch its point reads gave (the block loads behind them), never on another record
        n = len(theirs[0])
        assert mine[0][:n] == theirs[0] and mine[1][:n] == theirs[1] and len(mine[0]) - n <= (batch or 256)
        return
    assert mine[0] == theirs[0]  # the same items, in the same order
    assert mine[1] == theirs[1]  # the same state after each
    if mine[2] is None:
        assert mine[3] == theirs[3] and mine[4] == theirs[4]  # each bad record reported and counted once
    assert mine[5] == theirs[5]
    if mine[5] is not None and mine[2] is None:
        assert mine[0][: cut + 1] + mine[5][0] == mine[0]  # the restored reader continues exactly


def opened(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The shards whose readers are opened from now on, in order."""
    seen: list[int] = []
    real = BlockReader._open_reader

    def spy(self: BlockReader, index: int) -> Any:
        seen.append(index)
        return real(self, index)

    monkeypatch.setattr(BlockReader, "_open_reader", spy)
    return seen


def test_a_first_batch_reads_its_records_not_its_block(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "many"
    root.mkdir()
    for f in range(20):
        (root / f"f{f:02d}.jsonl").write_text("".join(json.dumps({"id": ident(f, i)}) + "\n" for i in range(50)))
    ds = tidal.Dataset(root).shuffle(seed=4, block_size=1000, shards_per_block=20).batch(4)  # a block: 20 files
    whole = [value(b)["id"] for b in ds]
    behind: list[int] = []
    monkeypatch.setattr(BlockReader, "_load_behind", lambda self, order, b: behind.append(b))  # held back
    files = opened(monkeypatch)
    it = ds.iterator()
    first = value(next(it))["id"]
    assert first == whole[0]
    assert it.stats()["rows_read"] == 4  # 4 records, not the block's 1,000
    assert sorted(files) == sorted({i // 1000 for i in first})  # only the files that hold them opened
    assert behind == [0]  # and the block asked to load behind them
    assert [value(b)["id"] for b in it] == whole[1:]  # then the block: the same order
    assert it.stats()["rows_read"] == 4 + 1000


def test_a_first_batch_of_most_of_a_block_reads_the_block(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = corpus(tmp_path / "d", "jsonl", {})
    ds = tidal.Dataset(root).shuffle(seed=1, block_size=1000).batch(100)  # 155 records: one block
    it = ds.iterator()
    assert len(value(next(it))["id"]) == 100
    assert it.stats()["rows_read"] == sum(SIZES)  # points would read 100 of 155: the block is read instead


def test_a_reader_closed_while_its_block_loads_behind_waits_for_it(tmp_path: Path) -> None:
    root = corpus(tmp_path / "d", "parquet", {})
    ds = tidal.Dataset(root).shuffle(seed=2, block_size=1000, shards_per_block=6).batch(2)
    it = ds.iterator()
    next(it)
    it.close()  # joins the thread loading the block before its files close
    assert not [t for t in __import__("threading").enumerate() if t.name == "tidal-behind"]


def test_what_loading_behind_raises_comes_with_the_next_batch(tmp_path: Path) -> None:
    root = corpus(tmp_path / "d", "txt", {3: {16}})  # the last record of the 4th file: not in a first batch of 2
    ds = tidal.Dataset(root).shuffle(seed=0, block_size=1000, shards_per_block=6).batch(2)
    with whole_blocks(), pytest.raises(tidal.RecordError, match=r"f3\.txt, line 17") as whole:
        next(iter(ds))  # read whole: the block's bad record raised before its first batch
    it = ds.iterator()
    first = next(it)  # the first batch by point reads, the bad record in the rest of the block
    assert len(first["text"]) == 2
    with pytest.raises(tidal.RecordError) as behind:
        next(it)
    assert str(behind.value) == str(whole.value)


@pytest.mark.parametrize("errors", ["skip", "function"])
@pytest.mark.parametrize("fmt", ["bad-jsonl", "bad-txt", "bad-parquet"])
def test_a_bad_record_in_a_first_batch_is_reported_once_by_the_block_read_whole(
    corpora: dict[str, Path], fmt: str, errors: str
) -> None:
    """In order, a reader's first batch is the first rows of the first file, the first of them bad."""
    outcomes = []
    for points in (True, False):
        reported = Reported()
        ds = tidal.Dataset(corpora[fmt], errors=reported if errors == "function" else errors).batch(3)
        with contextlib.nullcontext() if points else whole_blocks():
            items, states, raised, stats = run(ds, tidal.World())
        outcomes.append((items, states, raised, stats, list(reported)))
    assert outcomes[0] == outcomes[1]
    lost = {(f, i if fmt != "bad-parquet" else i // GROUP) for f, rows in BAD.items() for i in rows}
    groups = [min(GROUP, SIZES[f] - g * GROUP) for f, g in lost]  # a damaged Parquet group: all its rows
    assert outcomes[0][3]["skipped"] == (len(lost) if fmt != "bad-parquet" else sum(groups))


LONG = 1100  # rows per row group: past a batch of a stream, so read from its pages, in strips


def long_id(f: int, i: int) -> int:
    return 10_000 * f + i


def long_groups(root: Path) -> tuple[set[int], set[int]]:
    """Two Parquet files of 2 row groups of ``LONG`` rows, small pages, a text column whose
    dictionary fills early (the rest plain), page checksums; one plain page of the second file's
    first group damaged. The ids of its rows, and of the strips of ``STRIP_ROWS`` rows it is in."""
    from tidal.formats.parquet import STRIP_ROWS
    from tidal.formats.parquet_pages import DICTIONARY_PAGE, Pages, _header

    root.mkdir()
    page: set[int] = set()
    lost: set[int] = set()
    for f in range(2):
        rows = [{"id": long_id(f, i), "text": f"doc {long_id(f, i)} " + "x" * (i % 23)} for i in range(2 * LONG)]
        path = root / f"f{f}.parquet"
        pq.write_table(
            pa.Table.from_pylist(rows),
            path,
            row_group_size=LONG,
            data_page_size=512,
            write_batch_size=20,
            dictionary_pagesize_limit=4096,
            write_page_checksum=True,
        )
        if f == 1:
            pf = pq.ParquetFile(path)
            pages = Pages(str(path), pf.metadata, [False, False], str(path))
            text = [p for p in (pages.leaves(0) or [])[1].pages or [] if p.kind != DICTIONARY_PAGE]
            k = next(k for k, p in enumerate(text) if p.plain and sum(q.held for q in text[:k]) > 600)
            first = sum(p.held for p in text[:k])
            header = _header(pages.fd, text[k].at, str(path))
            pages.close()
            assert header is not None
            data = bytearray(path.read_bytes())
            data[text[k].at + header[1] + 5] ^= 0xFF  # a byte of its values: its checksum no longer holds
            path.write_bytes(bytes(data))
            page = {long_id(f, i) for i in range(first, first + text[k].held)}
            for s in range(first // STRIP_ROWS, (first + text[k].held - 1) // STRIP_ROWS + 1):
                lost |= {long_id(f, i) for i in range(s * STRIP_ROWS, min(LONG, (s + 1) * STRIP_ROWS))}
    return page, lost


@pytest.mark.parametrize(
    ("seed", "topology", "cut"),
    [(0, (0, 1, 0, 1), 40), (5, (1, 2, 0, 1), 3), (None, (0, 1, 1, 2), 45), (9, (2, 3, 1, 2), 0)],
)
def test_a_damaged_page_of_a_long_row_group_costs_its_strip_and_point_reads_give_what_whole_blocks_give(
    tmp_path: Path, seed: int | None, topology: tuple[int, int, int, int], cut: int
) -> None:
    """A point read decodes the strip of rows its record is in, not the row group's part of the
    slice; a block read that meets a damaged page skips only the part of that strip it reads.
    Every batch, state, count and report is the one reading whole blocks gives, resumed or not."""
    page, lost = long_groups(tmp_path / "d")
    assert page and page <= lost and len(lost) <= 2 * 256
    outcomes = []
    for points in (True, False):
        reported = Reported()
        ds = tidal.Dataset(tmp_path / "d", errors=reported)
        if seed is not None:
            ds = ds.shuffle(seed=seed, block_size=1500, shards_per_block=2)
        ds = ds.batch(16, drop_last=False)
        rank, ranks, worker, workers = topology
        world = tidal.World(rank=rank, world_size=ranks, worker=worker, num_workers=workers)
        with contextlib.nullcontext() if points else whole_blocks():
            items, states, raised, stats = run(ds, world)
            resumed = run(ds, world, json.loads(states[cut]))
        outcomes.append((items, states, raised, stats, sorted(reported), resumed))
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][2] is None  # the damage reported (by the reader whose share holds it), never raised
    alone = tidal.Dataset(tmp_path / "d", errors="skip")
    if seed is not None:
        alone = alone.shuffle(seed=seed, block_size=1500, shards_per_block=2)
    it = alone.batch(64, drop_last=False).iterator()
    read = [int(i) for b in it for i in b["id"].tolist()]
    skipped = {long_id(f, i) for f in range(2) for i in range(2 * LONG)} - set(read)
    assert len(read) == len(set(read)) and page <= skipped <= lost  # its page's rows, at most its strip's
    assert it.stats()["skipped"] == len(skipped)
    if topology == (0, 1, 0, 1):
        assert outcomes[0][3]["skipped"] == len(skipped) and outcomes[0][4]


def test_a_damaged_page_of_a_long_remote_row_group_read_by_ranges_gives_what_whole_blocks_give(
    tmp_path: Path, s3: Any, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read in place by ranges, a point read decodes its row group from the first row, fetched
    only as far as its strip (no page headers read): its verdict must still be the block read's."""
    from tidal.storage import Storage
    from tidal.storage import prefetch as prefetch_module

    monkeypatch.setattr(prefetch_module, "RANGE_MIN_BYTES", 0)  # these small files count as large
    page, lost = long_groups(tmp_path / "d")
    url = s3.upload(tmp_path / "d", bucket, "long")
    outcomes = []
    for points in (True, False):
        reported = Reported()
        storage = Storage(options=s3.options(), cache_dir=str(tmp_path / f"cache-{points}"))
        ds = tidal.Dataset(url, errors=reported, storage=storage).shuffle(seed=3, block_size=1500)
        ds = ds.batch(16, drop_last=False)
        with contextlib.nullcontext() if points else whole_blocks():
            items, states, raised, stats = run(ds, tidal.World())
            resumed = run(ds, tidal.World(), json.loads(states[20]))
        outcomes.append((items, states, raised, stats, sorted(reported), resumed))
    assert outcomes[0] == outcomes[1]
    skipped = {long_id(f, i) for f in range(2) for i in range(2 * LONG)} - {i for b in outcomes[0][0] for i in b["id"]}
    # a strip decoded from its group's first row fails from the damaged page on: those of the group after it too
    rest = {long_id(1, i) for i in range(min(lost) - long_id(1, 0), LONG)}
    assert outcomes[0][2] is None and page <= skipped <= rest and outcomes[0][3]["skipped"] == len(skipped)
