from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tidal
from tidal.formats import flat
from tidal.testing import assert_resumes_exactly


def test_nanogpt_bin_reads_as_8k_slices_of_the_stream(tmp_path: Path) -> None:
    ids = np.arange(10_000, dtype=np.uint16)
    ids.tofile(tmp_path / "train.bin")
    rows = [r["input_ids"] for r in tidal.Dataset(tmp_path / "train.bin")]
    assert [len(r) for r in rows] == [4096, 4096, 1808]
    assert rows[0].dtype == np.uint16 and np.array_equal(np.concatenate(rows), ids)


def test_npy_keeps_its_dtype(tmp_path: Path) -> None:
    ids = np.arange(5000, dtype=np.int32) * 7
    np.save(tmp_path / "val.npy", ids)
    rows = [r["input_ids"] for r in tidal.Dataset(tmp_path / "val.npy")]
    assert [len(r) for r in rows] == [2048, 2048, 904] and rows[0].dtype == np.int32
    assert np.array_equal(np.concatenate(rows), ids)


def test_uint32_bin_through_the_dtype_option(tmp_path: Path) -> None:
    ids = np.arange(3000, dtype=np.uint32) + 70_000
    ids.tofile(tmp_path / "a.bin")
    info = flat.scan(str(tmp_path / "a.bin"), None)
    reader = flat.open(str(tmp_path / "a.bin"), None, info, None, "raise", options={"dtype": "uint32"})
    rows = reader.read(0, info["rows"]).table
    assert np.array_equal(np.concatenate([r["input_ids"] for r in rows]), ids)
    with pytest.raises(tidal.FormatError, match="unknown format option 'dtyp'"):
        flat.open(str(tmp_path / "a.bin"), None, info, None, "raise", options={"dtyp": "uint32"})
    through = tidal.Dataset(tmp_path / "a.bin", format_options={"dtype": "uint32"})  # the same, as users write it
    assert np.array_equal(np.concatenate([r["input_ids"] for r in through]), ids)
    with pytest.raises(tidal.FormatError, match="unknown format option 'dtyp'"):
        tidal.Dataset(tmp_path / "a.bin", format_options={"dtyp": "uint32"})


def test_shuffled_slices_cover_the_stream_and_resume(tmp_path: Path) -> None:
    np.arange(30_000, dtype=np.uint16).tofile(tmp_path / "a.bin")
    rows = [r["input_ids"] for r in tidal.Dataset(tmp_path / "a.bin").shuffle(seed=0)]
    assert np.array_equal(np.sort(np.concatenate(rows)), np.arange(30_000))
    np.save(tmp_path / "b.npy", np.arange(40_000, dtype=np.int64))
    assert assert_resumes_exactly(tidal.Dataset(tmp_path).shuffle(seed=1, block_size=8).batch(3)) == 16  # 8 + 40 slices


def test_odd_sized_bin_and_2d_npy_are_format_errors(tmp_path: Path) -> None:
    (tmp_path / "a.bin").write_bytes(b"\x00" * 7)
    with pytest.raises(tidal.FormatError, match=r"a.bin: 7 bytes is not a whole number of uint16"):
        list(tidal.Dataset(tmp_path / "a.bin"))
    np.save(tmp_path / "b.npy", np.zeros((3, 4), dtype=np.int32))
    with pytest.raises(tidal.FormatError, match=r"b.npy: a token file is a 1-D integer array"):
        tidal.Dataset(tmp_path / "b.npy")
    (tmp_path / "c.npy").write_bytes(b"garbage")
    with pytest.raises(tidal.FormatError, match=r"c.npy: not a readable .npy"):
        tidal.Dataset(tmp_path / "c.npy")
