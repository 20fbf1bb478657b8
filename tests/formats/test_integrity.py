"""Bad input, named and counted: truncated and corrupt files, dependency errors, the errors= policy, schema checks.

The fuzz suite (test_fuzz_readers.py) holds these for every reader on random damage; here
each behaviour is pinned once, on the cases users reported.
"""

from __future__ import annotations

import bz2
import gzip
import itertools
import json
import logging
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

import tidal
from tidal.tables import records

LINES = "".join(json.dumps({"id": i, "text": "x" * 40 + str(i)}) + "\n" for i in range(300)).encode()


def zstd(data: bytes, checksum: bool = True) -> bytes:
    return zstandard.ZstdCompressor(write_checksum=checksum).compress(data)


def ids(ds: tidal.Dataset) -> list[int]:
    return [r["id"] for r in ds]


def test_a_zstd_file_cut_in_half_is_an_error_naming_it(tmp_path: Path) -> None:
    data = zstd(LINES)
    (tmp_path / "half.jsonl.zst").write_bytes(data[: len(data) // 2])
    with pytest.raises(tidal.FormatError, match=r"half.jsonl.zst: truncated zstd data: the frame at byte 0 is cut off"):
        tidal.Dataset(tmp_path / "half.jsonl.zst")
    with pytest.raises(tidal.FormatError, match=r"no file of the dataset can be read: .*half.jsonl.zst"):
        tidal.Dataset(tmp_path / "half.jsonl.zst", errors="skip")  # nothing left to read is no dataset


def test_a_second_zstd_frame_cut_short_is_an_error(tmp_path: Path) -> None:
    first, second = zstd(LINES[:5000], checksum=False), zstd(LINES[5000:], checksum=False)
    (tmp_path / "two.jsonl.zst").write_bytes(first + second[: len(second) // 2])
    with pytest.raises(tidal.FormatError, match=rf"two.jsonl.zst: truncated zstd data: the frame at byte {len(first)}"):
        list(tidal.Dataset(tmp_path / "two.jsonl.zst"))


def test_a_truncated_text_zst_is_an_error_not_a_short_last_line(tmp_path: Path) -> None:
    data = zstd(b"".join(b"line %d\n" % i for i in range(20_000)))
    (tmp_path / "a.txt.zst").write_bytes(data[: len(data) // 2])
    with pytest.raises(tidal.FormatError, match=r"a.txt.zst: truncated zstd data"):
        tidal.Dataset(tmp_path / "a.txt.zst")


@pytest.mark.parametrize(
    ("name", "data", "message"),
    [
        ("junk.jsonl.zst", b"\x28\xb5\x2f\xfd" + b"\xff" * 64, "corrupt zstd data in the frame at byte 0"),
        ("junk2.jsonl.zst", zstd(LINES) + b"trailing junk", r"corrupt zstd data in the frame at byte \d+"),
        ("flip.jsonl.gz", bytes(b ^ (i == 200) * 0x55 for i, b in enumerate(gzip.compress(LINES))), "gzip data"),
        ("cut.jsonl.gz", gzip.compress(LINES)[:-4], "truncated or corrupt gzip data"),
        ("junk.jsonl.bz2", bz2.compress(LINES) + b"junk", r"corrupt bz2 data in the stream at byte \d+"),
        ("empty.jsonl.gz", b"", "empty: a gzip file holds at least a header"),
    ],
)
def test_corrupt_compressed_files_are_named_errors_and_skipped_whole(
    tmp_path: Path, name: str, data: bytes, message: str
) -> None:
    (tmp_path / name).write_bytes(data)
    (tmp_path / "good.jsonl").write_text('{"id": 7}\n')
    with pytest.raises(tidal.FormatError, match=f"{name}: .*{message}"):
        tidal.Dataset(tmp_path)
    ds = tidal.Dataset(tmp_path, errors="skip")
    bad = [s for s in ds.shards if s.error is not None]
    assert [s.path for s in bad] == [str(tmp_path / name)] and bad[0].rows == 0
    it = ds.iterator()
    assert [r["id"] for r in it] == [7] and it.stats()["bad_files"] == 1


def test_a_skipped_file_is_logged_once_with_its_location(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "a.jsonl.zst").write_bytes(zstd(LINES)[:100])
    (tmp_path / "b.jsonl").write_text('{"id": 0}\n{oops\n{oops\n{"id": 3}\n')
    with caplog.at_level(logging.WARNING, logger="tidal"):
        assert ids(tidal.Dataset(tmp_path, errors="skip")) == [0, 3]
    messages = [r.getMessage() for r in caplog.records if r.name == "tidal"]
    assert len(messages) == 2
    assert "a.jsonl.zst: truncated zstd data" in messages[0]
    assert "b.jsonl, line 2: malformed JSON" in messages[1]


def test_a_file_damaged_after_indexing_is_caught_when_read(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl.gz"
    path.write_bytes(gzip.compress(LINES))
    (tmp_path / "b.jsonl").write_text('{"id": 1000}\n')
    assert tidal.Dataset(tmp_path).num_records == 301
    stat = path.stat()
    data = bytearray(path.read_bytes())
    data[-6] ^= 0xFF  # the CRC: same size, and the old mtime put back (bit rot the index cannot see)
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with pytest.raises(tidal.FormatError, match=r"a.jsonl.gz: truncated or corrupt gzip data"):
        list(tidal.Dataset(tmp_path))
    it = tidal.Dataset(tmp_path, errors="skip").iterator()
    assert [r["id"] for r in it] == [1000]
    assert it.stats()["skipped"] == 300 and it.stats()["bad_files"] == 1


def test_parquet_string_that_is_not_utf8_names_its_row(tmp_path: Path) -> None:
    text = pa.array([b"ok", b"bad \xff", b"fine"], pa.binary()).view(pa.string())
    pq.write_table(pa.table({"id": [0, 1, 2], "text": text}), tmp_path / "u.parquet")
    with pytest.raises(tidal.RecordError, match=r"u.parquet, row 1: a string that is not UTF-8"):
        list(tidal.Dataset(tmp_path / "u.parquet"))
    it = tidal.Dataset(tmp_path / "u.parquet", errors="skip").iterator()
    assert [r["id"] for r in it] == [0, 2] and it.stats()["skipped"] == 1


def test_parquet_page_checksums_catch_a_flipped_byte(tmp_path: Path) -> None:
    path = tmp_path / "a.parquet"
    table = pa.table({"id": list(range(40)), "text": [f"row {i}" for i in range(40)]})
    pq.write_table(table, path, row_group_size=10, write_page_checksum=True, compression="none")
    col = pq.ParquetFile(path).metadata.row_group(2).column(0)
    data = bytearray(path.read_bytes())
    data[col.data_page_offset + col.total_compressed_size - 3] ^= 0x01  # inside the values: decodes, but wrong
    path.write_bytes(bytes(data))
    with pytest.raises(tidal.RecordError, match=r"a.parquet, row 20: unreadable row group 2.*CRC"):
        list(tidal.Dataset(path))
    assert ids(tidal.Dataset(path, errors="skip")) == list(range(20)) + list(range(30, 40))


DAMAGED_FOOTERS = r"""
import json, random, sys
from pathlib import Path
import pyarrow as pa, pyarrow.parquet as pq
import tidal
root, tries = Path(sys.argv[1]), int(sys.argv[2])
good = root / "good.parquet"
table = pa.table({
    "id": pa.array([1, None, 3] * 20, pa.int64()),
    "text": ["x", None, "yz"] * 20,
    "tokens": [[1, 2], None, []] * 20,
})
pq.write_table(table, good, row_group_size=25)
raw = good.read_bytes()
start = len(raw) - 8 - int.from_bytes(raw[-8:-4], "little")
rng = random.Random(7)
seen = {}
for t in range(tries):
    damaged = bytearray(raw)
    for _ in range(rng.randint(1, 3)):
        damaged[rng.randrange(start, len(raw) - 8)] = rng.randrange(256)
    path = root / f"damaged-{t}.parquet"
    path.write_bytes(bytes(damaged))
    try:
        sum(1 for _ in tidal.Dataset(path, cache_dir=root / "cache"))
        seen["read"] = seen.get("read", 0) + 1
    except tidal.TidalError as exc:
        assert str(path) in str(exc), exc
        seen[type(exc).__name__] = seen.get(type(exc).__name__, 0) + 1
    path.unlink()
print(json.dumps(seen))
"""


def test_a_damaged_parquet_footer_is_a_named_error_never_an_abort(tmp_path: Path) -> None:
    # pyarrow's RowGroupMetaData.column() throws a C++ exception that nothing catches on a level
    # histogram of the wrong length: the process aborted (tidal.formats.parquet_footer)
    run = subprocess.run(
        [sys.executable, "-c", DAMAGED_FOOTERS, str(tmp_path), "2000"], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-2000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen.get("FormatError", 0) > 100 and sum(seen.values()) == 2000


def test_a_string_column_that_is_not_utf8_never_leaks_a_unicode_error() -> None:
    table = pa.table({"text": pa.array([b"\xff"], pa.binary()).view(pa.string())})
    with pytest.raises(tidal.RecordError, match="not UTF-8"):
        records(table)


@pytest.mark.parametrize("kind", ["parquet", "csv", "arrow", "txt", "tokens"])
def test_a_column_the_files_do_not_have_fails_at_once_under_every_policy(tmp_path: Path, kind: str) -> None:
    table = pa.table({"id": [1, 2], "text": ["a", "b"]})
    if kind == "parquet":
        pq.write_table(table, tmp_path / "a.parquet")
    elif kind == "csv":
        (tmp_path / "a.csv").write_text("id,text\n1,a\n2,b\n")
    elif kind == "arrow":
        with pa.OSFile(str(tmp_path / "a.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
            w.write_table(table)
    elif kind == "txt":
        (tmp_path / "a.txt").write_text("a\nb\n")
    else:
        from tidal.formats.tokens import TokenWriter

        with TokenWriter(tmp_path) as w:
            w.write([1, 2, 3])
    for errors in ("raise", "skip"):
        with pytest.raises(tidal.SchemaError, match=r"no column 'txt' \(columns: .*(text|input_ids)"):
            tidal.Dataset(tmp_path, columns=["txt"], errors=errors)


def test_a_json_field_in_no_record_is_a_schema_error_not_an_endless_skip(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_bytes(LINES)
    ds = tidal.Dataset(tmp_path, columns=["txt"], errors="skip").shuffle(seed=0).repeat()
    with pytest.raises(tidal.SchemaError, match=r"no record of a block of 300 has the column 'txt'.*fields id, text"):
        next(iter(ds))


def test_a_json_field_some_records_lack_is_none_in_those(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"id": 0, "t": 1}\n{"id": 1}\n{"id": 2, "t": 3, "x": 0}\n')
    for errors in ("raise", "skip"):
        it = iter(tidal.Dataset(tmp_path, columns=["t"], errors=errors))
        assert list(it) == [{"t": 1}, {"t": None}, {"t": 3}]
        assert it.stats()["skipped"] == 0


def test_a_stream_that_skips_everything_says_so_instead_of_spinning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "a.jsonl").write_text("not json\n" * 50)
    with pytest.raises(
        tidal.TidalError, match=r"every one of the 50 records .* skipped .* forever. The first: .*a.jsonl, line 1"
    ):
        list(itertools.islice(tidal.Dataset(tmp_path, errors="skip").repeat(), 10))
    with caplog.at_level(logging.WARNING, logger="tidal"):  # a finite pass ends: said, not raised
        assert list(tidal.Dataset(tmp_path, errors="skip")) == []
    assert "every one of the 50 records this reader read in epoch 0 was skipped" in caplog.text


def test_a_wrong_format_fails_at_once(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_bytes(LINES)
    with pytest.raises(tidal.FormatError, match=r"a.jsonl: not a readable Parquet file.*is format='parquet' right"):
        tidal.Dataset(tmp_path, format="parquet", errors="skip")


def _collect(error: tidal.TidalError) -> None:
    SEEN.append(str(error))


def _stop_on_files(error: tidal.TidalError) -> None:
    if isinstance(error, tidal.FormatError):
        raise error


SEEN: list[str] = []


def test_an_errors_function_sees_each_error_and_skips_or_stops(tmp_path: Path) -> None:
    SEEN.clear()
    (tmp_path / "a.jsonl").write_text('{"id": 0}\n{oops\n{"id": 2}\n')
    (tmp_path / "b.jsonl.zst").write_bytes(zstd(LINES)[:50])
    ds = tidal.Dataset(tmp_path, errors=_collect)
    it = ds.iterator()
    assert [r["id"] for r in it] == [0, 2]
    assert it.stats()["skipped"] == 1 and it.stats()["bad_files"] == 1
    assert any("b.jsonl.zst: truncated zstd" in s for s in SEEN) and any("a.jsonl, line 2" in s for s in SEEN)
    assert pickle.loads(pickle.dumps(ds)).sources()[""].errors is _collect  # a module-level function pickles
    with pytest.raises(tidal.FormatError, match=r"b.jsonl.zst"):
        tidal.Dataset(tmp_path, errors=_stop_on_files)
    (tmp_path / "b.jsonl.zst").unlink()
    assert ids(tidal.Dataset(tmp_path, errors=_stop_on_files)) == [0, 2]  # a bad record: skipped


def test_an_errors_function_that_raises_stops_with_its_own_exception(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"id": 0}\n{oops\n')
    with pytest.raises(KeyError, match="mine"):
        list(tidal.Dataset(tmp_path, errors=_raise_key_error))


def _raise_key_error(error: tidal.TidalError) -> None:
    raise KeyError("mine")


def test_errors_must_be_a_policy(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"id": 0}\n')
    with pytest.raises(ValueError, match="errors must be 'raise', 'skip' or a function"):
        tidal.Dataset(tmp_path, errors="ignore")  # type: ignore[arg-type]


def test_a_corrupt_npy_member_is_a_record_error_not_a_huge_allocation(tmp_path: Path) -> None:
    import io
    import tarfile

    buf = io.BytesIO()
    np.save(buf, np.arange(4))
    big = b"(4000000000000,)"  # the header claims 32 TB: the same length, padding given up for it
    header = buf.getvalue().replace(b"(4,)", big).replace(b" " * (len(big) - 4) + b"\n", b"\n", 1)
    assert len(header) == len(buf.getvalue())
    with tarfile.open(tmp_path / "a.tar", "w") as tf:
        for name, data in [("k0.npy", buf.getvalue()), ("k1.npy", header)]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    with pytest.raises(tidal.RecordError, match=r"a.tar, row 1: sample 'k1'"):
        list(tidal.Dataset(tmp_path / "a.tar"))


def test_inspect_shows_unreadable_files(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl.zst").write_bytes(zstd(LINES)[:100])
    (tmp_path / "b.jsonl").write_text('{"id": 0}\n')
    out = subprocess.run(
        [sys.executable, "-m", "tidal.cli", "inspect", str(tmp_path)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert out.returncode == 1
    assert "2 shards, 1 records" in out.stdout and "1 unreadable" in out.stdout
    assert "unreadable: " in out.stdout and "a.jsonl.zst: truncated zstd data" in out.stdout


def test_an_errors_function_is_written_to_a_config_by_import_path(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"id": 0}\n{oops\n')
    config = tidal.Dataset(tmp_path, errors=_collect).to_config()
    assert config["source"]["errors"] == f"{__name__}:_collect"
    again = tidal.Dataset.from_config(config)
    assert again.sources()[""].errors is _collect and ids(again) == [0]
    assert tidal.Dataset.from_config(tidal.Dataset(tmp_path, errors="skip").to_config()).sources()[""].errors == "skip"
    with pytest.raises(tidal.ConfigError, match=r"\['errors'\]: 'raise', 'skip' or expected an import path"):
        tidal.Dataset.from_config({**config, "source": {**config["source"], "errors": "ignore"}})
