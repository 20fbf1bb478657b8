from __future__ import annotations

import gzip
from pathlib import Path

import pytest
import zstandard

import tidal
from tidal.formats import csv as tcsv
from tidal.testing import assert_resumes_exactly

ROWS = [{"id": i, "name": f"name {i}", "score": i / 4} for i in range(50)]


def csv_bytes(rows: list[dict], sep: str = ",") -> bytes:
    lines = [sep.join(rows[0])] + [sep.join(str(v) for v in r.values()) for r in rows]
    return ("\n".join(lines) + "\n").encode()


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
