from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.feather as feather
import pytest

import tidal
from tidal.formats import arrow as tarrow
from tidal.testing import assert_resumes_exactly

ROWS = [{"id": i, "text": f"t{i}", "x": float(i)} for i in range(40)]


def write_ipc(path: Path, rows: list[dict], stream: bool = False, batch: int = 6) -> Path:
    table = pa.Table.from_pylist(rows)
    with pa.OSFile(str(path), "wb") as sink:
        opener = pa.ipc.new_stream if stream else pa.ipc.new_file
        with opener(sink, table.schema) as w:
            for b in table.to_batches(max_chunksize=batch):
                w.write_batch(b)
    return path


@pytest.mark.parametrize("name,stream", [("a.arrow", False), ("a.arrows", True), ("a.ipc", True)])
def test_rows_in_order_with_projection(tmp_path: Path, name: str, stream: bool) -> None:
    write_ipc(tmp_path / name, ROWS, stream)
    assert list(tidal.Dataset(tmp_path / name)) == ROWS
    assert list(tidal.Dataset(tmp_path / name, columns=["text"])) == [{"text": r["text"]} for r in ROWS]


def test_stream_reader_seeks_to_the_batch_it_needs(tmp_path: Path) -> None:
    path = write_ipc(tmp_path / "a.arrows", ROWS, stream=True)
    info = tarrow.scan(str(path), None)
    assert info["kind"] == "stream" and len(info["offsets"]) == 7 and info["batches"][:2] == [6, 6]
    reader = tarrow.open(str(path), None, info, None, "raise")
    assert reader.read(31, 38).table.to_pylist() == ROWS[31:38]
    assert reader.read(2, 3).table.to_pylist() == ROWS[2:3]
    reader.close()


def test_feather_v2_and_dictionary_stream(tmp_path: Path) -> None:
    feather.write_feather(pa.Table.from_pylist(ROWS), tmp_path / "a.feather", chunksize=9)
    assert list(tidal.Dataset(tmp_path / "a.feather")) == ROWS
    table = pa.table({"c": pa.array(["x", "y", "x", "z"]).dictionary_encode()})
    with pa.OSFile(str(tmp_path / "d.arrows"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table, max_chunksize=2)
    assert [r["c"] for r in tidal.Dataset(tmp_path / "d.arrows")] == ["x", "y", "x", "z"]


def test_shuffle_and_resume(tmp_path: Path) -> None:
    write_ipc(tmp_path / "a.arrow", ROWS[:25])
    write_ipc(tmp_path / "b.arrows", ROWS[25:], stream=True)
    assert sorted(r["id"] for r in tidal.Dataset(tmp_path).shuffle(seed=0)) == list(range(40))
    assert assert_resumes_exactly(tidal.Dataset(tmp_path).shuffle(seed=1, block_size=8).batch(3)) == 13


def test_not_arrow_is_a_format_error(tmp_path: Path) -> None:
    (tmp_path / "a.arrow").write_bytes(b"ARROW1 but then nothing")
    with pytest.raises(tidal.FormatError, match=r"a.arrow: not a readable Arrow"):
        tidal.Dataset(tmp_path / "a.arrow")
    for i, data in enumerate([b"\x00" * 3, b"", b"\xff\xff\xff\xff\x10\x00\x00\x00garbage!"]):
        (tmp_path / f"b{i}.arrows").write_bytes(data)
        with pytest.raises(tidal.FormatError, match=rf"b{i}.arrows: "):
            tidal.Dataset(tmp_path / f"b{i}.arrows")
