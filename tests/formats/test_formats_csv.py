from __future__ import annotations

import gzip
from pathlib import Path

import pytest
import zstandard
from makers import ROWS, csv_bytes

import tidal
from tidal.formats import csv as tcsv
from tidal.testing import assert_resumes_exactly


@pytest.mark.parametrize("name", ["a.csv", "a.tsv", "a.csv.gz", "a.csv.zst"])
def test_rows_read_back_typed_and_in_order(tmp_path: Path, name: str) -> None:
    data = csv_bytes(ROWS, "\t" if ".tsv" in name else ",")
    if name.endswith(".gz"):
        data = gzip.compress(data)
    elif name.endswith(".zst"):
        data = zstandard.ZstdCompressor().compress(data)
    (tmp_path / name).write_bytes(data)
    assert list(tidal.Dataset(tmp_path / name)) == ROWS


def test_quoted_newlines_empty_lines_and_projection(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_bytes(b'id,text\r\n1,"two\nlines"\r\n\r\n2,"say ""hi"""\r\n3,plain')
    assert list(tidal.Dataset(tmp_path / "a.csv", columns=["text"])) == [
        {"text": "two\nlines"},
        {"text": 'say "hi"'},
        {"text": "plain"},
    ]


def test_reader_opens_at_any_row_from_a_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tcsv, "SEGMENT_ROWS", 7)
    (tmp_path / "a.csv").write_bytes(csv_bytes(ROWS))
    info = tcsv.scan(str(tmp_path / "a.csv"), None)
    assert [c[0] for c in info["checkpoints"]] == list(range(0, 50, 7))
    reader = tcsv.open(str(tmp_path / "a.csv"), None, info, None, "raise")
    assert reader.read(30, 41).table.to_pylist() == ROWS[30:41]
    assert reader.read(3, 4).table.to_pylist() == ROWS[3:4]


def test_shuffle_and_resume(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_bytes(csv_bytes(ROWS[:20]))
    (tmp_path / "b.csv").write_bytes(csv_bytes(ROWS[20:]))
    assert sorted(r["id"] for r in tidal.Dataset(tmp_path).shuffle(seed=0)) == list(range(50))
    assert assert_resumes_exactly(tidal.Dataset(tmp_path).shuffle(seed=1, block_size=8).batch(3)) == 16


def test_bad_row_names_file_and_line_or_is_skipped(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_bytes(b'id,text\n0,a\n1,"b\nc"\n2,x,extra\n3,d\n')
    with pytest.raises(tidal.RecordError, match=r"a.csv, line 5: wrong number of fields"):
        list(tidal.Dataset(tmp_path / "a.csv"))
    ds = tidal.Dataset(tmp_path / "a.csv", errors="skip")
    assert [r["id"] for r in ds] == [0, 1, 3]


def test_a_column_that_does_not_convert_everywhere_is_read_as_strings(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_bytes(b"v\n1\n2\nthree\n")
    assert [r["v"] for r in tidal.Dataset(tmp_path / "a.csv")] == ["1", "2", "three"]


def test_empty_file_is_a_format_error(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_bytes(b"")
    with pytest.raises(tidal.FormatError, match=r"a.csv: empty"):
        tidal.Dataset(tmp_path / "a.csv")


# -- one type per column over a dataset's files ---------------------------------------------------------


def test_leading_zeros_stay_text_and_a_column_takes_one_type_over_the_files(tmp_path: Path) -> None:
    # before: a.csv's 01234 and 00501 came back as ints 1234 and 501, b.csv's 10001 and K1A 0B1 as strings
    (tmp_path / "a.csv").write_bytes(b"zip,city,n,x,note\n01234,A,1,1,\n00501,B,2,2,\n")
    (tmp_path / "b.csv").write_bytes(b"zip,city,n,x,note\n10001,C,3,2.5,\nK1A 0B1,D,4,3,hi\n")
    got = list(tidal.Dataset(tmp_path))
    assert [r["zip"] for r in got] == ["01234", "00501", "10001", "K1A 0B1"]
    assert [r["n"] for r in got] == [1, 2, 3, 4]  # integers in every file: integers
    assert [r["x"] for r in got] == [1.0, 2.0, 2.5, 3.0] and all(type(r["x"]) is float for r in got)
    assert [r["note"] for r in got] == ["", "", "", "hi"]  # empty in a.csv: no say; text in b.csv
    # one file alone: the same leading zeros kept, a phone number's "+" and a hexadecimal too
    (tmp_path / "c.csv").write_bytes(b"zip,city,n,x,note\n00501,E,+15550100,0x1F,\n")
    assert list(tidal.Dataset(tmp_path / "c.csv")) == [
        {"zip": "00501", "city": "E", "n": "+15550100", "x": "0x1F", "note": ""}
    ]  # a column with no value in any file is text


def test_column_types_declares_a_column_type_for_every_file(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_bytes(b"zip,n\n10001,1\n20002,2\n")
    (tmp_path / "b.csv").write_bytes(b"zip,n\n30003,3\n")
    assert [r["zip"] for r in tidal.Dataset(tmp_path)] == [10001, 20002, 30003]
    declared = tidal.Dataset(tmp_path, format_options={"column_types": {"zip": "string", "n": "float32"}})
    assert list(declared) == [{"zip": "10001", "n": 1.0}, {"zip": "20002", "n": 2.0}, {"zip": "30003", "n": 3.0}]
    assert list(tidal.Dataset.from_config(declared.to_config())) == list(declared)  # the option is data
    import pyarrow as pa

    typed = tidal.Dataset(tmp_path, format_options={"column_types": {"zip": pa.string()}})  # pyarrow's own types
    assert [r["zip"] for r in typed] == ["10001", "20002", "30003"]
    with pytest.raises(tidal.ArgumentError, match=r"column_types: 'strnig' \(column 'zip'\) is not a type"):
        tidal.Dataset(tmp_path, format_options={"column_types": {"zip": "strnig"}})
    with pytest.raises(
        tidal.SchemaError, match=r"column_types names 'zipp', which no CSV file has \(columns: zip, n\)"
    ):
        tidal.Dataset(tmp_path, format_options={"column_types": {"zipp": "string"}})
    (tmp_path / "c.csv").write_bytes(b"zip,n\n40004,four\n")  # a value that is not of the declared type
    with pytest.raises(tidal.RecordError, match=r"c.csv.*line 2"):
        list(tidal.Dataset(tmp_path, format_options={"column_types": {"n": "int64"}}))
    skipped = tidal.Dataset(tmp_path, errors="skip", format_options={"column_types": {"n": "int64"}})
    assert [r["n"] for r in skipped] == [1, 2, 3]


def test_an_entry_of_an_older_csv_scan_is_scanned_again(tmp_path: Path) -> None:
    """The index keeps the version of the scan that made an entry: a CSV scanned before leading
    zeros were kept is scanned again, not read as the integers that scan said it held."""
    import base64
    import json

    import pyarrow as pa

    from tidal.sources.index_file import INDEX_NAME

    (tmp_path / "a.csv").write_bytes(b"zip\n01234\n")
    assert [r["zip"] for r in tidal.Dataset(tmp_path)] == ["01234"]
    index = json.loads((tmp_path / INDEX_NAME).read_text())
    assert index["scan"] == [2]
    old = base64.b64encode(pa.schema([("zip", pa.int64())]).serialize().to_pybytes()).decode()
    index["info"][0]["schema"] = old  # what the scan before wrote, with no "scan"
    del index["scan"]
    (tmp_path / INDEX_NAME).write_text(json.dumps(index))
    assert [r["zip"] for r in tidal.Dataset(tmp_path)] == ["01234"]
