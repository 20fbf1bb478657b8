"""A slice that starts deep in a Parquet row group is decoded from the page it starts in, not
from the group's first row (tidal.formats.parquet_pages): the rows must be exactly those Arrow
reads, for every way writers lay out pages, and skipping must never hide a damaged page from
the slice that holds it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tidal
from tidal.formats import parquet, parquet_pages, parquet_skipping
from tidal.formats.parquet_pages import Pages

ROWS = 3000


def _table(n: int = ROWS, text: int = 40) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(range(n), pa.int64()),
            "text": pa.array([None if i % 13 == 0 else f"{i}:" + "é" * (i % text) for i in range(n)]),
            "toks": pa.array([list(range(i % 5)) for i in range(n)], pa.list_(pa.int32())),  # repeated: never skipped
            "pair": pa.array([{"x": float(i)} for i in range(n)], pa.struct([("x", pa.float64())])),
            "flag": pa.array([None if i % 7 == 0 else i % 2 == 0 for i in range(n)]),
        }
    )


def _starts(path: Path, group: int, row: int) -> dict[str, int]:
    pf = pq.ParquetFile(path)
    repeated = [pf.schema.column(i).max_repetition_level > 0 for i in range(len(pf.schema))]
    pages = Pages(str(path), pf.metadata, repeated, str(path))
    try:
        return pages.skips(group, row)[0]
    finally:
        pages.close()


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"data_page_version": "2.0"},
        {"use_dictionary": False, "compression": "zstd"},
        {"compression": "none", "write_page_checksum": True},
        {"write_statistics": False, "data_page_version": "2.0", "compression": "lz4"},
        {"dictionary_pagesize_limit": 1024, "write_page_checksum": True},
    ],
    ids=["v1-dictionary-snappy", "v2", "plain-zstd", "uncompressed-crc", "v2-no-statistics-lz4", "dictionary-full"],
)
def test_slices_deep_in_a_row_group_read_the_rows_arrow_reads(tmp_path: Path, options: dict) -> None:
    path = tmp_path / "a.parquet"
    pq.write_table(_table(), path, row_group_size=1500, data_page_size=512, write_batch_size=50, **options)
    table = pq.read_table(path)
    deep = _starts(path, 1, 1400)
    assert deep["text"] > 0 and deep["id"] > 0  # pages before the slice are skipped ...
    assert deep["toks"] == 0  # ... but a repeated column is decoded from the group's start
    info = parquet.scan(str(path), None)
    for columns in (None, ["text", "id"], ["toks", "flag", "pair"]):
        for a, z in [(0, 10), (1, 2), (417, 1499), (1499, 1500), (1900, 2100), (2901, 3000), (1500, 3000)]:
            reader = parquet.open(str(path), None, info, columns, "raise")
            got = reader.read(a, z).table
            more = reader.read(z, min(z + 300, ROWS)).table  # the next slice continues where this one ended
            reader.close()
            want = table.select(columns or table.column_names)
            assert got.equals(want.slice(a, z - a), check_metadata=True), (columns, a, z)
            assert more.equals(want.slice(z, min(300, ROWS - z))), (columns, a, z)


def test_a_dictionary_no_page_from_the_slice_on_needs_is_passed_over(tmp_path: Path) -> None:
    """A writer fills a column's dictionary with its first values and writes the rest plain: a slice
    in the plain pages does not decode the dictionary (patched as the pages before it are); a slice
    with dictionary-encoded pages after its start does."""
    path = tmp_path / "a.parquet"
    table = pa.table({"id": range(ROWS), "text": [f"{i}:" + "z" * (i % 30) for i in range(ROWS)]})
    pq.write_table(
        table, path, row_group_size=ROWS, data_page_size=512, write_batch_size=50, dictionary_pagesize_limit=2048
    )
    pf = pq.ParquetFile(path)
    pages = Pages(str(path), pf.metadata, [False, False], str(path))
    try:
        text = next(leaf for leaf in pages.leaves(0) or [] if leaf.column == "text").pages
        assert text is not None and text[0].kind == parquet_pages.DICTIONARY_PAGE
        data = [p for p in text if p.kind != parquet_pages.DICTIONARY_PAGE]
        plain_from = next(k for k, p in enumerate(data) if p.plain)
        assert plain_from > 0 and all(p.plain for p in data[plain_from:])  # the dictionary filled, then plain
        first_plain = sum(p.held for p in data[:plain_from])
        deep, early = pages.skips(0, first_plain + 500), pages.skips(0, first_plain - 1)
    finally:
        pages.close()
    assert text[0].at in deep[1] and text[0].at not in early[1]
    assert 0 < early[0]["text"] < first_plain  # pages skipped, the dictionary kept for those after
    info = parquet.scan(str(path), None)
    for a in (first_plain - 1, first_plain, first_plain + 500, ROWS - 1):
        reader = parquet.open(str(path), None, info, None, "raise")
        assert reader.read(a, a + 1).table.equals(table.slice(a, 1)), a
        assert reader.read(a + 1, ROWS).table.equals(table.slice(a + 1)), a  # the stream goes on past it
        reader.close()


def test_page_headers_longer_than_one_read_are_read_whole(tmp_path: Path) -> None:
    """Page statistics hold a page's min and max: with 20 KB documents a header outgrows the
    first read of its bytes."""
    path = tmp_path / "long.parquet"
    table = pa.table({"id": range(60), "text": [f"{i:03d}" + "x" * 20_000 for i in range(60)]})
    pq.write_table(table, path, row_group_size=60, data_page_size=30_000, write_batch_size=2, use_dictionary=False)
    assert _starts(path, 0, 50)["text"] > 0
    info = parquet.scan(str(path), None)
    reader = parquet.open(str(path), None, info, None, "raise")
    assert reader.read(50, 60).table.equals(table.slice(50, 10))
    reader.close()


def test_a_damaged_page_before_the_slice_is_skipped_and_still_reported_by_its_own(tmp_path: Path) -> None:
    path = tmp_path / "a.parquet"
    table = pa.table({"id": range(ROWS), "text": [f"record {i} " + "y" * (i % 30) for i in range(ROWS)]})
    pq.write_table(table, path, row_group_size=ROWS, data_page_size=1024, write_batch_size=50, use_dictionary=False,
                   compression="none", write_page_checksum=True)  # fmt: skip
    column = pq.ParquetFile(path).metadata.row_group(0).column(1)
    data = bytearray(path.read_bytes())
    spot = column.data_page_offset + 200  # inside the first data page of "text", past its header
    data[spot : spot + 8] = b"\xff" * 8
    path.write_bytes(bytes(data))

    info = parquet.scan(str(path), None)
    reader = parquet.open(str(path), None, info, None, "raise")
    assert reader.read(2000, 2100).table.equals(table.slice(2000, 100))  # the damaged page: not decoded
    reader.close()
    with pytest.raises(tidal.RecordError, match=r"a.parquet, row 0: unreadable row group 0"):
        list(tidal.Dataset(path))


def test_skipping_leaves_no_file_open(tmp_path: Path) -> None:
    path = tmp_path / "a.parquet"
    pq.write_table(_table(), path, row_group_size=1500, data_page_size=512, write_batch_size=50)
    info = parquet.scan(str(path), None)
    before = len(os.listdir("/proc/self/fd"))
    for a in range(100, ROWS, 250):
        reader = parquet.open(str(path), None, info, None, "raise")
        reader.read(a, a + 50)
        reader.close()
    assert len(os.listdir("/proc/self/fd")) == before


def test_a_shuffled_dataset_resumed_deep_in_row_groups_gives_the_rest_exactly(tmp_path: Path) -> None:
    """Blocks that cut row groups of small pages, resumed at several points: the rest of the
    epoch is the uninterrupted run's."""
    for k in range(3):
        t = _table(ROWS).select(["id", "text", "flag"])
        t = t.set_column(0, "id", pa.array(range(k * ROWS, (k + 1) * ROWS), pa.int64()))
        pq.write_table(t, tmp_path / f"{k}.parquet", row_group_size=1500, data_page_size=512, write_batch_size=50)

    def chain() -> tidal.Dataset:
        return tidal.Dataset(tmp_path).shuffle(seed=5, block_size=900, shards_per_block=3).batch(16, drop_last=False)

    whole = [b["id"].tolist() for b in chain()]
    assert sorted(i for b in whole for i in b) == list(range(3 * ROWS))
    for at in (7, 170, 480):
        ds = chain()
        it = iter(ds)
        for _ in range(at):
            next(it)
        rest = chain()
        rest.load_state_dict(ds.state_dict())
        assert [b["id"].tolist() for b in rest] == whole[at:]


@pytest.mark.parametrize("rows", [600, 2500])  # a group of one batch, checked as decoded; one of more, by its headers
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_damaged_pages_and_headers_give_the_rows_or_a_named_error(
    tmp_path: Path, rows: int, data: st.DataObject
) -> None:
    """Bytes flipped anywhere in a column chunk of small pages (headers included), then a slice
    read: the original rows, the rows pyarrow reads of the damaged file, or a RecordError naming
    the file; never other rows (a page passed over shifts every later row), never another
    exception."""
    path = tmp_path / "a.parquet"
    table = pa.table({"id": range(rows), "text": [f"r{i}-" + "z" * (i % 40) for i in range(rows)]})
    pq.write_table(table, path, row_group_size=rows, data_page_size=256, write_batch_size=20, write_page_checksum=True)
    column = pq.ParquetFile(path).metadata.row_group(0).column(1)
    begin = column.dictionary_page_offset or column.data_page_offset
    raw = bytearray(path.read_bytes())
    for _ in range(data.draw(st.integers(1, 4))):
        spot = data.draw(st.integers(begin, begin + column.total_compressed_size - 1))
        raw[spot] ^= data.draw(st.integers(1, 255))
    path.write_bytes(bytes(raw))
    a = data.draw(st.integers(0, rows - 10))
    z = data.draw(st.integers(a + 1, rows))
    columns = data.draw(st.sampled_from([None, ["text"]]))
    info = parquet.scan(str(path), None)
    reader = parquet.open(str(path), None, info, columns, "raise")
    try:
        got = reader.read(a, z).table
    except tidal.RecordError as exc:
        assert "a.parquet" in str(exc)
        return
    finally:
        reader.close()
    want = table.select(columns or table.column_names)
    if got.equals(want.slice(a, z - a)):
        return
    damaged = pq.read_table(path, columns=columns)  # what the file now holds, where pyarrow can read it whole
    assert got.equals(damaged.slice(a, z - a))


@pytest.mark.parametrize("rows", [600, 2500])
@pytest.mark.parametrize("kind", [1, 7])  # INDEX_PAGE, and a type no writer uses: pyarrow passes over both
def test_a_page_whose_type_byte_is_damaged_is_an_error_not_shifted_rows(tmp_path: Path, rows: int, kind: int) -> None:
    path = tmp_path / "a.parquet"
    table = pa.table({"id": range(rows), "text": [f"r{i}-" + "z" * (i % 40) for i in range(rows)]})
    pq.write_table(table, path, row_group_size=rows, data_page_size=256, write_batch_size=20)
    pf = pq.ParquetFile(path)
    headers = Pages(str(path), pf.metadata, [False, False], str(path))
    pages = headers.leaves(0)[1].pages
    headers.close()
    middle = next(p for p in pages if p.kind == 0 and p.at > pages[len(pages) // 2].at)
    raw = bytearray(path.read_bytes())
    assert raw[middle.at] == 0x15 and raw[middle.at + 1] == 0
    raw[middle.at + 1] = kind * 2  # the type, as a zigzag varint
    path.write_bytes(bytes(raw))
    info = parquet.scan(str(path), None)
    for columns in (None, ["text"]):
        reader = parquet.open(str(path), None, info, columns, "raise")
        a, z = rows // 2 + 60, rows // 2 + 160  # past the page, before the group's last batch
        with pytest.raises(tidal.RecordError, match=rf"a.parquet, row {a}: unreadable row group 0 \(rows {a}..{z}\)"):
            reader.read(a, z)
        reader.close()


def test_the_pages_of_a_late_row_group_of_many_are_found(tmp_path: Path) -> None:
    """The footer is read only as far as the row group asked for: the 28th of 30 (with key-value
    metadata, statistics and a schema before them) is found, checked and skipped into."""
    path = tmp_path / "many.parquet"
    n = 30 * 1030
    table = pa.table({"id": range(n), "text": [f"{i}" * (i % 9) for i in range(n)]}).replace_schema_metadata(
        {"k": "v" * 500}
    )
    pq.write_table(table, path, row_group_size=1030, data_page_size=256, write_batch_size=20)
    assert _starts(path, 27, 900)["text"] > 0
    info = parquet.scan(str(path), None)
    reader = parquet.open(str(path), None, info, None, "raise")
    a = 27 * 1030 + 900
    assert reader.read(a, a + 300).table.equals(pq.read_table(path).slice(a, 300))
    reader.close()


def test_a_gap_of_pages_between_two_slices_is_skipped_not_decoded(tmp_path: Path) -> None:
    """Slices of one row group with rows between them that this reader does not read (another
    reader's, before an elastic restore): the pages in the gap are passed over, so a damaged one
    there is never decoded, and the rows are Arrow's."""
    path = tmp_path / "a.parquet"
    table = pa.table({"id": range(ROWS), "text": [f"record {i} " + "y" * (i % 30) for i in range(ROWS)]})
    pq.write_table(table, path, row_group_size=ROWS, data_page_size=1024, write_batch_size=50, use_dictionary=False,
                   compression="none", write_page_checksum=True)  # fmt: skip
    headers = Pages(str(path), pq.ParquetFile(path).metadata, [False, False], str(path))
    text = [p for p in headers.leaves(0)[1].pages if p.kind == 0]
    headers.close()
    gap = next(p for p in text if p.at > text[len(text) // 2].at)  # a page in the middle of the group
    data = bytearray(path.read_bytes())
    data[gap.at + 400 : gap.at + 408] = b"\xff" * 8  # its data, past its header: its CRC fails
    path.write_bytes(bytes(data))
    info = parquet.scan(str(path), None)
    reader = parquet.open(str(path), None, info, None, "raise")
    assert reader.read(0, 100).table.equals(table.slice(0, 100))
    assert reader.read(ROWS - 200, ROWS - 100).table.equals(table.slice(ROWS - 200, 100))
    reader.close()


def test_batches_cut_short_where_strings_would_pass_2_gib_are_not_damage(tmp_path: Path) -> None:
    """pyarrow ends a batch early where its strings would pass 2 GiB (1,000 documents of 2.2 MB):
    a group's batches then come short of ``STREAM_ROWS`` before its end. The rows are the group's
    all the same, and only a group whose rows do not add up is damaged."""
    path = tmp_path / "a.parquet"
    rows = 2100
    table = pa.table({"id": range(rows), "text": [f"t{i}" for i in range(rows)]})
    pq.write_table(table, path, row_group_size=rows)
    file = pq.ParquetFile(path)

    def cut(sizes: list[int]) -> Iterator[pa.RecordBatch]:
        at = 0
        for n in sizes:
            yield table.slice(at, n).to_batches()[0]
            at += n

    stream = parquet._Stream(file, 0, rows, None)
    stream._batches = cut([976, 48, 1024, 52])  # what pyarrow gives for multi-MB strings
    got = [stream.take(a, z) for a, z in [(0, 700), (700, 1500), (1500, 2100)]]
    assert pa.concat_tables(got).equals(table)
    stream = parquet._Stream(file, 0, rows, None)
    stream._batches = cut([976, 48, 1024, 30])  # 22 rows short: a page passed over
    stream.take(0, 1500)
    with pytest.raises(ValueError, match="2078 rows decoded, the footer says 2100"):
        stream.take(1500, 2100)


def test_a_thrift_map_keyed_by_structs_is_a_format_error_not_a_type_error() -> None:
    """Bytes that say "a map from structs" (parquet.thrift has none; a damaged page header can)
    are a FormatError naming the file, not Python's "unhashable type" from deep inside."""
    from tidal.formats.parquet_footer import Reader

    damaged = bytes([0x1B, 0x01, 0xC5, 0x00, 0x02, 0x00])  # field 1: a map of one entry, {} -> 1; the end
    with pytest.raises(tidal.FormatError, match=r"a.parquet: corrupt Parquet footer: a map whose keys"):
        Reader(damaged, "a.parquet").struct()


@pytest.fixture
def guard() -> Iterator[None]:
    """:func:`parquet_skipping.skipping` asked afresh (its answer is kept per process)."""
    parquet_skipping.skipping.cache_clear()
    yield
    parquet_skipping.skipping.cache_clear()


def test_the_guard_finds_that_the_installed_pyarrow_passes_over_retyped_pages(guard: None) -> None:
    assert parquet_skipping._retyped_reads_wrong() is None
    assert parquet_skipping.skipping()


def test_where_pyarrow_decoded_retyped_pages_the_guard_turns_skipping_off_and_the_rows_stay_right(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, guard: None
) -> None:
    """A pyarrow that decoded the pages tidal retypes (here: retyped to DATA_PAGE, which it does
    decode) would shift every later row of their columns: the guard sees it in its own file, says
    so once, and every slice is decoded from its group's first row."""
    monkeypatch.setitem(parquet_pages.ZIGZAG, parquet_pages.INDEX_PAGE, parquet_pages.ZIGZAG[parquet_pages.DATA_PAGE])
    retyped: list[object] = []
    monkeypatch.setattr(parquet, "Retyped", lambda *args: retyped.append(args) or parquet_skipping.Retyped(*args))
    path = tmp_path / "a.parquet"
    pq.write_table(_table(), path, row_group_size=1500, data_page_size=512, write_batch_size=50)
    table = pq.read_table(path)
    assert _starts(path, 1, 1400)["text"] > 0  # pages that could be skipped
    info = parquet.scan(str(path), None)
    with caplog.at_level("WARNING", logger="tidal"):
        for columns in (None, ["text", "id"]):
            for a, z in [(417, 1499), (1900, 2100), (2901, 3000)]:
                reader = parquet.open(str(path), None, info, columns, "raise")
                got = reader.read(a, z).table
                reader.close()
                assert got.equals(table.select(columns or table.column_names).slice(a, z - a)), (columns, a, z)
    assert not retyped  # no slice read through Retyped
    warned = [r.getMessage() for r in caplog.records if "not skipped" in r.getMessage()]
    assert len(warned) == 1 and "column 'id' read 600 rows, not rows" in warned[0], warned
