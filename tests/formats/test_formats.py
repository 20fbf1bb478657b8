from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import write_jsonl, write_parquet
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tidal
from tidal.tables import columns

RECORDS = [{"id": i, "text": f"line {i}", "score": i / 2} for i in range(25)]


@pytest.mark.parametrize("name,compression", [
    ("a.jsonl", None), ("a.jsonl.gz", "gzip"), ("a.jsonl.zst", "zstd"), ("a.ndjson", None),
])  # fmt: skip
def test_jsonl_reads_every_record_in_order(tmp_path: Path, name: str, compression: str | None) -> None:
    write_jsonl(tmp_path / name, RECORDS, compression)
    assert list(tidal.Dataset(tmp_path / name)) == RECORDS


def test_parquet_reads_projected_columns_across_row_groups(tmp_path: Path) -> None:
    write_parquet(tmp_path / "a.parquet", RECORDS, row_group_size=4)
    ds = tidal.Dataset(tmp_path / "a.parquet", columns=["text", "id"])
    assert list(ds) == [{"text": r["text"], "id": r["id"]} for r in RECORDS]


@pytest.mark.parametrize("suffix,compress", [(".txt", None), (".txt.gz", "gzip"), (".text.zst", "zstd")])
def test_text_yields_non_empty_lines(tmp_path: Path, suffix: str, compress: str | None) -> None:
    import gzip

    import zstandard

    raw = b"first\n\nsecond line\r\n  \nlast without newline"
    data = {None: raw, "gzip": gzip.compress(raw) if compress == "gzip" else b"",
            "zstd": zstandard.ZstdCompressor().compress(raw)}[compress]  # fmt: skip
    (tmp_path / f"a{suffix}").write_bytes(data)
    texts = [r["text"] for r in tidal.Dataset(tmp_path / f"a{suffix}")]
    assert texts == ["first", "second line", "  ", "last without newline"]


def test_format_override_reads_an_unknown_ending(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "records.log", RECORDS[:3])
    assert [r["id"] for r in tidal.Dataset(tmp_path / "records.log", format="jsonl")] == [0, 1, 2]
    with pytest.raises(tidal.FormatError, match=r"records.log: no reader"):
        tidal.Dataset(tmp_path / "records.log")


def test_malformed_json_line_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": 0}\n\n{"id": 1}\n{"id": 2,,}\n{"id": 3}\n')
    with pytest.raises(tidal.RecordError, match=r"bad.jsonl, line 4: malformed JSON") as err:
        list(tidal.Dataset(path))
    assert err.value.path == str(path) and err.value.line == 4


def test_json_line_that_is_not_an_object_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "arr.jsonl"
    path.write_text('{"id": 0}\n[1, 2]\n')
    with pytest.raises(tidal.RecordError, match=r"line 2: .*expected a JSON object"):
        list(tidal.Dataset(path))


def test_a_json_record_without_a_column_asked_for_has_none_there(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_text('{"text": "a"}\n{"body": "b"}\n')
    assert list(tidal.Dataset(path, columns=["text"])) == [{"text": "a"}, {"text": None}]
    with pytest.raises(tidal.SchemaError, match=r"column 'txet' .*a.jsonl, line 1 has the fields text"):
        list(tidal.Dataset(path, columns=["txet"]))


def test_json_records_keep_the_columns_asked_for_in_their_order(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_text('{"id": 0, "text": "a"}\n{"text": "b", "id": 1}\n{"id": 2, "text": "c", "extra": []}\n')
    assert [list(r.items()) for r in tidal.Dataset(path, columns=["id", "text"])] == [
        [("id", 0), ("text", "a")],
        [("id", 1), ("text", "b")],
        [("id", 2), ("text", "c")],
    ]
    assert list(tidal.Dataset(path, columns=["text"])) == [{"text": "a"}, {"text": "b"}, {"text": "c"}]
    assert list(tidal.Dataset(path))[1:] == [{"text": "b", "id": 1}, {"id": 2, "text": "c", "extra": []}]
    assert list(list(r) for r in tidal.Dataset(path))[1] == ["text", "id"]  # as the line has them


def test_skip_drops_bad_records_and_keeps_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": 0}\n{oops\n{"id": 2}\nnot json\n{"id": 4}\n')
    assert [r["id"] for r in tidal.Dataset(path, errors="skip")] == [0, 2, 4]
    shuffled = tidal.Dataset(path, errors="skip").shuffle(seed=3).batch(2, drop_last=False)
    assert sorted(i for b in shuffled for i in b["id"].tolist()) == [0, 2, 4]


# Lines orjson refuses, each with the words its RecordError gives.
BAD_JSON = [
    (b'{"id": 2,,}', "unexpected character, expected a string key: line 1 column 10"),
    (b'{"id": NaN}', "unexpected character, expected a JSON value"),
    (b'{"id": -Infinity}', "no digit after sign"),
    (b'{"id": 1e400}', "number is infinity when parsed as double"),
    (b'{"id": ' + b"7" * 400 + b"}", "number is infinity when parsed as double"),
    (b'{"id": "\\ud800"}', "no low surrogate in string"),
    (b'{"id": "\xff"}', "not UTF-8: invalid start byte at byte 8"),
    (b'{"id": "\xed\xa0\x80"}', "not UTF-8: invalid continuation byte at byte 8"),
    (b"[" * 1025 + b"]" * 1025, "depth limit exceeded"),
    (b"{'id': 3}", "unexpected character, expected a string key"),
]


@pytest.mark.parametrize(("line", "why"), BAD_JSON, ids=range(len(BAD_JSON)))
def test_a_json_line_orjson_refuses_names_file_line_and_why(tmp_path: Path, line: bytes, why: str) -> None:
    path = tmp_path / "bad.jsonl"
    good = [b'{"id": %d, "n": %d}' % (i, 10**i) for i in range(25)]
    path.write_bytes(b"\n".join([*good[:5], line, *good[5:]]) + b"\n")
    with pytest.raises(tidal.RecordError) as err:
        list(tidal.Dataset(path))
    assert str(err.value).startswith(f"{path}, line 6: malformed JSON record: {why}"), str(err.value)
    assert (err.value.path, err.value.line) == (str(path), 6)
    assert [r["id"] for r in tidal.Dataset(path, errors="skip")] == list(range(25))


def test_json_numbers_past_64_bits_are_the_nearest_float_and_deep_nesting_reads(tmp_path: Path) -> None:
    path = tmp_path / "n.jsonl"
    path.write_bytes(
        b'{"big": 18446744073709551615, "low": -9223372036854775808, "over": 18446744073709551616,'
        b' "huge": 123456789012345678901234567890, "deep": ' + b"[" * 1023 + b"]" * 1023 + b"}\n"
    )
    (rec,) = tidal.Dataset(path)
    assert (rec["big"], rec["low"]) == (2**64 - 1, -(2**63)) and isinstance(rec["big"], int)
    assert rec["over"] == 2.0**64 and isinstance(rec["over"], float)
    assert rec["huge"] == float(123456789012345678901234567890)
    deep = rec["deep"]
    for _ in range(1022):
        deep = deep[0]
    assert deep == []


def test_non_utf8_text_line_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "a.txt"
    path.write_bytes(b"good\nbad \xff\xfe byte\nfine\n")
    with pytest.raises(tidal.RecordError, match=r"a.txt, line 2: not UTF-8"):
        list(tidal.Dataset(path))
    assert [r["text"] for r in tidal.Dataset(path, errors="skip")] == ["good", "fine"]


def test_unreadable_parquet_file_names_the_file(tmp_path: Path) -> None:
    write_parquet(tmp_path / "good.parquet", RECORDS[:4])
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(tidal.FormatError, match=r"broken.parquet: not a readable Parquet file"):
        tidal.Dataset(tmp_path)
    assert [r["id"] for r in tidal.Dataset(tmp_path, errors="skip")] == [0, 1, 2, 3]


def test_corrupt_parquet_row_group_names_file_and_row(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "a.parquet", [{"id": i, "text": "x" * 50 + str(i)} for i in range(30)], 10)
    meta = pq.ParquetFile(path).metadata
    col = meta.row_group(1).column(1)
    start = col.dictionary_page_offset or col.data_page_offset
    data = bytearray(path.read_bytes())
    data[start : start + col.total_compressed_size] = b"\x00" * col.total_compressed_size
    path.write_bytes(bytes(data))
    with pytest.raises(tidal.RecordError, match=r"a.parquet, row 10: unreadable row group 1"):
        list(tidal.Dataset(path))
    assert [r["id"] for r in tidal.Dataset(path, errors="skip")] == list(range(10)) + list(range(20, 30))


def test_empty_files_are_datasets_with_no_records(tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "blank.txt").write_text("\n\n")
    pq.write_table(pa.table({"id": pa.array([], pa.int64())}), tmp_path / "empty.parquet")
    ds = tidal.Dataset(tmp_path)
    assert ds.num_records == 0 and list(ds) == [] and list(ds.batch(4, drop_last=False)) == []
    with pytest.raises(tidal.TidalError, match="no records, so it cannot repeat forever"):
        list(ds.repeat())


def test_missing_paths_say_which(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "a.jsonl", RECORDS[:2])
    with pytest.raises(tidal.SourceError, match=r"nope.jsonl: no such file"):
        tidal.Dataset([tmp_path / "a.jsonl", tmp_path / "nope.jsonl"])
    with pytest.raises(tidal.SourceError, match=r"\*.parquet: the pattern matches no file"):
        tidal.Dataset(str(tmp_path / "*.parquet"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(tidal.SourceError, match="holds no file tidal can read"):
        tidal.Dataset(tmp_path / "empty")
    with pytest.raises(FileNotFoundError):  # SourceError is a FileNotFoundError too
        tidal.Dataset(tmp_path / "gone")


def test_recursive_glob_and_lists_keep_a_stable_order(tmp_path: Path) -> None:
    for d, ids in [("b/deep", [3]), ("a", [1]), ("a/x", [2])]:
        (tmp_path / d).mkdir(parents=True, exist_ok=True)
        write_jsonl(tmp_path / d / f"s{ids[0]}.jsonl", [{"id": i} for i in ids])
    glob_ids = [r["id"] for r in tidal.Dataset(str(tmp_path / "**" / "*.jsonl"))]
    assert glob_ids == [1, 2, 3]
    list_ids = [r["id"] for r in tidal.Dataset([tmp_path / "b", tmp_path / "a"])]
    assert list_ids == [3, 1, 2]


def test_parquet_row_groups_streamed_in_slices_read_as_jsonl_does(tmp_path: Path) -> None:
    """Row groups larger than the reader's decoding step, read in shuffled blocks that cut them
    at many places, and resumed mid-group: the same records in the same order as JSON lines."""
    recs = [{"id": i, "text": f"record {i} " + "x" * (i % 50)} for i in range(6000)]
    (tmp_path / "pq").mkdir()
    (tmp_path / "js").mkdir()
    for k in range(3):
        write_parquet(tmp_path / "pq" / f"{k}.parquet", recs[k * 2000 : (k + 1) * 2000], row_group_size=1500)
        write_jsonl(tmp_path / "js" / f"{k}.jsonl", recs[k * 2000 : (k + 1) * 2000])
    chains = [tidal.Dataset(tmp_path / d).shuffle(seed=3, block_size=700, shards_per_block=2) for d in ("pq", "js")]
    whole = [list(ds) for ds in chains]
    assert whole[0] == whole[1] and sorted(r["id"] for r in whole[0]) == list(range(6000))
    ds = chains[0].batch(8)
    it = iter(ds)
    for _ in range(300):
        next(it)
    rest = tidal.Dataset(tmp_path / "pq").shuffle(seed=3, block_size=700, shards_per_block=2).batch(8)
    rest.load_state_dict(ds.state_dict())
    assert [i for b in rest for i in b["id"].tolist()] == [r["id"] for r in whole[0][2400:]]
    batch = next(iter(chains[0].batch(8)))
    assert batch["id"].flags.writeable  # a batch is the user's to change


def test_shuffled_parquet_gives_the_batches_and_records_arrow_would(tmp_path: Path) -> None:
    """A shuffled block of Arrow records is made Python once (tidal.tables.Decoded), not batch
    by batch: each batch must still be the one Arrow would give for its rows, with the column's
    dtype, nulls, bytes, lists, and numbers that have nulls in some blocks and not in others
    (batches of 7 cross blocks of 50)."""
    rows = [
        {
            "id": i,
            "text": None if i % 7 == 0 else f"é{i}",
            "blob": bytes([i % 256]) * (i % 5),
            "x": i / 2,
            "ok": i % 3 == 0,
            "score": None if i >= 170 and i % 11 == 0 else i,
            "toks": list(range(i % 4)),
        }
        for i in range(300)
    ]
    types = [pa.int32(), pa.string(), pa.binary(), pa.float32(), pa.bool_(), pa.int16(), pa.list_(pa.int64())]
    table = pa.Table.from_pylist(rows, pa.schema(list(zip(rows[0], types, strict=True))))
    pq.write_table(table.slice(0, 170), tmp_path / "a.parquet", row_group_size=50)
    pq.write_table(table.slice(170), tmp_path / "b.parquet", row_group_size=50)
    ds = tidal.Dataset(tmp_path).shuffle(seed=3, block_size=50)

    def same(got: object, want: object) -> bool:
        if isinstance(want, np.ndarray):
            return isinstance(got, np.ndarray) and got.dtype == want.dtype and got.tolist() == want.tolist()
        return type(got) is type(want) and got == want

    seen = []
    for batch in ds.batch(7):
        ids = batch["id"].tolist()
        want = columns(table.take(pa.array(ids)))
        assert batch.keys() == want.keys() and all(same(batch[k], want[k]) for k in want), ids
        seen += ids
    assert len(set(seen)) == len(seen) == 294
    shuffled = list(ds)
    assert sorted(shuffled, key=lambda r: r["id"]) == rows
    assert all(type(r["id"]) is int and type(r["x"]) is float for r in shuffled)  # to_pylist's types
    kept = [b["id"].tolist() for b in ds.filter(lambda r: r["id"] % 3 == 0).batch(4)]
    assert sorted(i for b in kept for i in b) == list(range(0, 300, 3))


@pytest.mark.parametrize("piece", [1, 2, 3, 7, 64, 1 << 22])
def test_lines_across_pieces_keep_records_and_line_numbers(tmp_path: Path, monkeypatch, piece: int) -> None:
    """Lines are views of the piece read, joined to what the previous piece left: whatever the
    piece size, every non-empty line (CRLF ends dropped, a lone CR not a record) comes out
    whole, with its line number, from the start and from a checkpoint."""
    import random

    from tidal.formats import lines as lines_module

    rng = random.Random(piece)
    raw = (
        b"".join(
            rng.choice([b"", b"\r", b"x", b"long line " * rng.randint(1, 9), b'{"a": 1}\r', "é€".encode()])
            + rng.choice([b"\n", b"\r\n"])
            for _ in range(500)
        )
        + b"tail\r"
    )
    path = tmp_path / "f.txt"
    path.write_bytes(raw)
    want = [(i + 1, ln[:-1] if ln.endswith(b"\r") else ln) for i, ln in enumerate(raw.split(b"\n"))]
    want = [(n, ln) for n, ln in want if ln]
    monkeypatch.setattr(lines_module, "_PIECE", piece)
    monkeypatch.setattr(lines_module, "CHECKPOINT_ROWS", 50)
    info = lines_module.scan(str(path), None)
    assert info["rows"] == len(want)
    reader = lines_module.LineReader(str(path), None, info)
    got, numbers = reader.read_rows(0, len(want))
    assert [bytes(g) for g in got] == [ln for _, ln in want]
    assert numbers == [n for n, _ in want]
    got, numbers = reader.read_rows(len(want) - 120, len(want) - 3)  # back, then from a checkpoint
    assert [bytes(g) for g in got] == [ln for _, ln in want[-120:-3]]
    assert numbers == [n for n, _ in want[-120:-3]]
    reader.close()


def test_a_row_is_read_from_the_checkpoint_before_it_a_few_bytes_back_whatever_the_row_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Long lines get a checkpoint every CHECKPOINT_BYTES as well as every CHECKPOINT_ROWS: any row
    is read whole, with its line number, from the checkpoint before it, which is at most that many
    bytes of lines back (a point read of one long document does not read thousands before it)."""
    import itertools
    import random

    from tidal.formats import lines as lines_module

    rng = random.Random(3)
    lines = [rng.choice([b"", b"short", b"x" * rng.randint(100, 900), b'{"a": 1}\r']) for _ in range(700)]
    raw = b"\n".join(lines) + b"\n"
    path = tmp_path / "f.txt"
    path.write_bytes(raw)
    want = [(i + 1, ln[:-1] if ln.endswith(b"\r") else ln) for i, ln in enumerate(lines)]
    want = [(n, ln) for n, ln in want if ln]
    monkeypatch.setattr(lines_module, "_PIECE", 64)
    monkeypatch.setattr(lines_module, "CHECKPOINT_BYTES", 2000)
    info = lines_module.scan(str(path), None)
    assert info["rows"] == len(want)
    offsets = [c[1] for c in info["checkpoints"]]
    assert len(offsets) > len(want) // 4096 + 1 and max(b - a for a, b in itertools.pairwise(offsets)) < 2000 + 900
    read = []
    real_read = lines_module.LineReader._refill

    def counted(self: lines_module.LineReader) -> bool:
        read.append(self._file.tell())  # type: ignore[union-attr]
        return real_read(self)

    monkeypatch.setattr(lines_module.LineReader, "_refill", counted)
    reader = lines_module.LineReader(str(path), None, info)
    for row in [*rng.sample(range(len(want)), 60), len(want) - 1, 0]:
        read.clear()
        got, numbers = reader.read_rows(row, row + 1)
        assert ([bytes(g) for g in got], numbers) == ([want[row][1]], [want[row][0]])
        assert len(read) * 64 <= 2000 + 2 * 900 + 64  # from the checkpoint before it, not from row 0
    reader.close()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.lists(st.sampled_from([b"a", b"{}", b"\n", b"\r", b"\r\n"]), max_size=40).map(b"".join))
def test_a_small_file_is_counted_in_one_read_as_line_by_line(tmp_path: Path, raw: bytes) -> None:
    """The index counts a small plain file's rows in one read; whatever its empty lines, CR
    and last line, it finds what the line-by-line scan finds (or leaves the file to it)."""
    from tidal.formats import lines as lines_module

    path = tmp_path / "f.jsonl"
    path.write_bytes(raw)
    fast = lines_module._scan_small(str(path))
    want = sum(1 for line in raw.split(b"\n") if line not in (b"", b"\r"))
    assert lines_module.scan(str(path), None) == {"rows": want}
    assert fast is None or fast == {"rows": want}
    if b"\n\n" not in raw and not raw.startswith((b"\n", b"\r\n")) and b"\n\r\n" not in raw:
        assert fast == {"rows": want}  # the common case takes the one read


def test_a_batch_stacks_plain_numbers_and_says_which_records_do_not_match(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    lines = ['{"i": 1, "f": 0.5, "b": true, "m": 1, "n": 2}', '{"i": 2, "f": 1.5, "b": false, "m": 2.5, "n": false}']
    path.write_text("\n".join(lines) + "\n")
    (batch,) = tidal.Dataset(path).batch(2)
    assert batch["i"].dtype == np.int64 and batch["i"].tolist() == [1, 2]
    assert batch["f"].dtype == np.float64 and batch["b"].dtype == np.bool_ and batch["m"].tolist() == [1.0, 2.5]
    assert batch["n"] == [2, False]  # a bool among ints is not a number of the column: kept as given
    path.write_text('{"id": 0, "text": "a"}\n{"id": 1, "lang": "en"}\n{"id": 2}\n')
    (batch,) = tidal.Dataset(path).batch(3)  # the fields of every record; None where one lacks it
    assert batch["id"].tolist() == [0, 1, 2]
    assert batch["text"] == ["a", None, None] and batch["lang"] == [None, "en", None]
    path.write_text('{"id": 0}\n{"id": 1}\n')
    with pytest.raises(tidal.RecordError, match=r"records that are dicts, got int"):
        list(tidal.Dataset(path).map(lambda r: r["id"]).batch(2))
    with pytest.raises(tidal.RecordError, match=r"records that are dicts, got int"):
        list(tidal.Dataset(path).map(lambda r: r if r["id"] == 0 else 1).batch(2))


def test_a_name_with_brackets_is_a_name_and_globs_below_it_still_work(tmp_path: Path) -> None:
    root = tmp_path / "corpus [v2]"
    (root / "sub").mkdir(parents=True)
    for i in range(3):
        write_jsonl(root / f"a{i}.jsonl", [{"id": i}])
    write_jsonl(root / "sub" / "b.jsonl", [{"id": 9}])

    def ids(src: Path | str) -> list[int]:
        return sorted(r["id"] for r in tidal.Dataset(src))

    assert ids(root) == [0, 1, 2, 9]
    assert ids(root / "a1.jsonl") == [1]
    assert ids(f"{root}/*.jsonl") == [0, 1, 2]
    assert ids(f"{root}/**/*.jsonl") == [0, 1, 2, 9]
    assert ids(f"{root}/a[02].jsonl") == [0, 2]  # below the name, [ ] is a pattern again
    with pytest.raises(tidal.SourceError, match=r"corpus \[v3\]: the pattern .* no file or directory has this name"):
        tidal.Dataset(tmp_path / "corpus [v3]")


@pytest.mark.parametrize("compression", [None, "gzip"])
def test_a_byte_order_mark_at_the_start_of_a_line_file_is_not_part_of_its_first_record(
    tmp_path: Path, compression: str | None
) -> None:
    import gzip

    bom = b"\xef\xbb\xbf"
    for name, body, want in [
        ("a.jsonl", b'{"id": 1}\n{"id": 2}\n', [{"id": 1}, {"id": 2}]),
        ("a.txt", b"hello\nworld\n", [{"text": "hello"}, {"text": "world"}]),
    ]:
        data = bom + body
        path = tmp_path / (name + (".gz" if compression else ""))
        path.write_bytes(gzip.compress(data) if compression else data)
        assert list(tidal.Dataset(path)) == want
    (tmp_path / "mid.jsonl").write_bytes(b'{"id": 1}\n' + bom + b'{"id": 2}\n')  # elsewhere it is still bad data
    with pytest.raises(tidal.RecordError, match=r"mid.jsonl, line 2: .*byte order mark"):
        list(tidal.Dataset(tmp_path / "mid.jsonl"))
