"""`tidal convert` on this machine: the same records or tokens, hashes in the index, restarts that
skip finished shards, progress, and errors that name the file."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import make_shards, read_index, write_jsonl

import tidal
from tidal.cli import main
from tidal.convert import Report, convert, cut
from tidal.storage.digests import file_digest

SIZES = [5, 23, 1, 17, 30, 2, 11, 29, 12]  # 130 records in jsonl, jsonl.zst and parquet files


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([f"record {i} of shard {i % 9}" for i in range(300)], trainer)
    tok.save(str(path))
    return path


@pytest.fixture
def src(tmp_path: Path) -> Path:
    return make_shards(tmp_path / "src", SIZES)


@pytest.fixture
def big(tmp_path: Path) -> Path:
    """1,500 records: more than the conversion's sample of the first 1,000, so a failure can come after it."""
    return make_shards(tmp_path / "big", [100] * 15, kinds=("jsonl",))


def records(path: Path | str, **kw: object) -> list[dict]:
    return list(tidal.Dataset(str(path), **kw))  # type: ignore[arg-type]


def test_parquet_output_holds_the_same_records_in_order(src: Path, tmp_path: Path) -> None:
    report = convert(str(src), tmp_path / "out", shard_size="1KB")
    assert isinstance(report, Report) and report.shards > 1 and report.records == 130 and report.resumed == 0
    assert records(tmp_path / "out") == records(src)
    assert sorted(p.name for p in (tmp_path / "out").glob("*.parquet")) == [
        f"part-{k:05d}.parquet" for k in range(report.shards)
    ]
    schemas = {str(pq.read_schema(p)) for p in (tmp_path / "out").glob("*.parquet")}
    assert len(schemas) == 1  # one schema for every shard


def test_parquet_index_has_rows_and_hashes_and_is_read_without_a_scan(src: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    convert(str(src), out, shard_size="1KB")
    index_file = out / ".tidal-index.json"
    index = read_index(index_file.read_bytes())
    for name, entry in index.items():
        assert entry["hash"] == file_digest(out / name, entry["hash"].split(":")[0])
        assert entry["rows"] == pq.ParquetFile(out / name).metadata.num_rows
        assert entry["bytes"] == (out / name).stat().st_size
    assert sum(e["rows"] for e in index.values()) == 130
    before = index_file.stat().st_mtime_ns
    ds = tidal.Dataset(str(out))
    assert ds.num_records == 130
    assert index_file.stat().st_mtime_ns == before  # every entry was fresh: nothing scanned, nothing rewritten
    assert {s.hash for s in ds.shards} == {e["hash"] for e in index.values()}


def test_columns_keeps_only_those(src: Path, tmp_path: Path) -> None:
    convert(str(src), tmp_path / "out", columns=["text"])
    assert records(tmp_path / "out") == records(src, columns=["text"])


def test_tokens_output_is_what_tokenize_yields(src: Path, tmp_path: Path, tokenizer: Path) -> None:
    report = convert(str(src), tmp_path / "tok", to="tokens", tokenizer=tokenizer, shard_size="400B")
    assert report.shards > 2
    want = [r["input_ids"] for r in tidal.Dataset(str(src)).tokenize(tokenizer)]
    got = [r["input_ids"] for r in tidal.Dataset(str(tmp_path / "tok"))]
    assert len(got) == len(want) == 130
    assert all(a.dtype == b.dtype == np.uint16 and np.array_equal(a, b) for a, b in zip(got, want, strict=True))
    index = json.loads((tmp_path / "tok" / "index.json").read_text())
    assert index["format"] == "tidal-tokens" and index["dtype"] == "uint16"
    for entry in index["shards"]:
        assert entry["hash"] == file_digest(tmp_path / "tok" / entry["name"], entry["hash"].split(":")[0])
    # a shard altered after the conversion is refused by its hash
    victim = tmp_path / "tok" / index["shards"][0]["name"]
    data = bytearray(victim.read_bytes())
    data[-1] ^= 1
    victim.write_bytes(bytes(data))
    with pytest.raises(tidal.FormatError, match="hash"):
        tidal.Dataset(str(tmp_path / "tok"))


def test_pretokenized_source_to_tokens_keeps_ids_and_dtype(src: Path, tmp_path: Path, tokenizer: Path) -> None:
    convert(str(src), tmp_path / "tok", to="tokens", tokenizer=tokenizer)
    convert(str(tmp_path / "tok"), tmp_path / "again", to="tokens", shard_size="300B")
    a = [r["input_ids"] for r in tidal.Dataset(str(tmp_path / "tok"))]
    b = [r["input_ids"] for r in tidal.Dataset(str(tmp_path / "again"))]
    assert all(x.dtype == y.dtype == np.uint16 and np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_tokens_to_parquet_with_tokenize(src: Path, tmp_path: Path, tokenizer: Path) -> None:
    convert(str(src), tmp_path / "out", tokenizer=tokenizer)  # to="parquet": a list column of ids beside the others
    got = records(tmp_path / "out")
    want = list(tidal.Dataset(str(src)).tokenize(tokenizer))
    assert [r["id"] for r in got] == [r["id"] for r in want]
    assert [list(r["input_ids"]) for r in got] == [r["input_ids"].tolist() for r in want]
    assert tidal.Dataset(str(tmp_path / "out")).pack(16).batch(2) is not None


# -- restarts ---------------------------------------------------------------------------------------

FAIL_FLAG = "TIDAL_TEST_CONVERT_FAIL_AT"


def fail_at(rec: dict) -> dict:
    """Raises (or kills its process) at one record while the flag says so: a crash mid-conversion."""
    at = os.environ.get(FAIL_FLAG)
    if at is not None and rec["id"] == int(at.split(":")[0]):
        if at.endswith(":kill"):
            os.kill(os.getpid(), 9)
        raise RuntimeError(f"injected failure at id {rec['id']}")
    return rec


def _done_files(out: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in out.glob("part-*.parquet")}


def test_a_failed_conversion_restarts_with_its_finished_shards(
    big: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    ds = tidal.Dataset(str(big)).map(fail_at)
    monkeypatch.setenv(FAIL_FLAG, "1200")
    with pytest.raises(RuntimeError, match="injected failure at id 1200"):
        convert(ds, out, shard_size="4KB")
    finished = _done_files(out)
    assert len(finished) > 0
    assert not (out / ".tidal-index.json").exists()  # the index comes when every shard is done
    monkeypatch.delenv(FAIL_FLAG)
    report = convert(ds, out, shard_size="4KB")
    assert report.resumed == len(finished) < report.shards
    assert {n: m for n, m in _done_files(out).items() if n in finished} == finished  # not written again
    assert records(out) == records(big)


def test_a_killed_conversion_restarts_with_its_finished_shards(big: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    script = (
        "import tidal, test_convert as t; from tidal.convert import convert; "
        f"convert(tidal.Dataset({str(big)!r}).map(t.fail_at), {str(out)!r}, shard_size='4KB')"
    )
    env = {**os.environ, FAIL_FLAG: "1200:kill", "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, timeout=120)
    assert proc.returncode == -9, proc.stderr.decode()
    finished = _done_files(out)
    assert finished and len(list((out / ".tidal-convert" / "done").iterdir())) == len(finished)
    report = convert(tidal.Dataset(str(big)).map(fail_at), out, shard_size="4KB")
    assert report.resumed == len(finished) and report.records == 1500
    assert records(out) == records(big)
    assert not (out / ".tidal-convert" / "staging").exists()


def test_worker_processes_write_the_same_shards(big: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ds = tidal.Dataset(str(big)).map(fail_at)
    one = convert(ds, tmp_path / "one", shard_size="4KB")
    monkeypatch.setenv(FAIL_FLAG, "1400")  # a worker process fails: its error reaches the caller
    with pytest.raises(RuntimeError, match="injected failure at id 1400"):
        convert(ds, tmp_path / "two", shard_size="4KB", workers=2)
    monkeypatch.setenv(FAIL_FLAG, "1400:kill")  # a worker process dies: named as such
    with pytest.raises(tidal.TidalError, match=r"a conversion process died .* run the same conversion again"):
        convert(ds, tmp_path / "two", shard_size="4KB", workers=2)
    monkeypatch.delenv(FAIL_FLAG)
    two = convert(ds, tmp_path / "two", shard_size="4KB", workers=2)
    assert two.resumed >= 1 and two.shards == one.shards
    for a, b in zip(one.entries, two.entries, strict=True):
        assert (a["name"], a["rows"], a["hash"]) == (b["name"], b["rows"], b["hash"])


# -- the command line ---------------------------------------------------------------------------------


def test_cli_draws_progress_and_reports(src: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["convert", str(src), str(tmp_path / "out"), "--shard-size", "1KB", "--progress"]) == 0
    cap = capsys.readouterr()
    assert "convert" in cap.err and "130/130" in cap.err and "shards" in cap.err
    assert cap.out.startswith("wrote ") and "130 records" in cap.out
    assert main(["convert", str(src), str(tmp_path / "out"), "--shard-size", "1KB", "--no-progress"]) == 0
    cap = capsys.readouterr()
    assert cap.err == "" and "already done" in cap.out


def test_cli_tokenize_writes_token_shards(
    src: Path, tmp_path: Path, tokenizer: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["convert", str(src), str(tmp_path / "tok"), "--tokenize", str(tokenizer), "--column", "text"]) == 0
    assert sorted(p.suffix for p in (tmp_path / "tok").iterdir() if not p.name.startswith(".")) == [".json", ".tokens"]


# -- errors ---------------------------------------------------------------------------------------------


def cli_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("tidal convert: ") and err.count("\n") == 1, err  # one line
    return err


def test_errors_are_one_line_naming_the_file(src: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    assert "not empty" in cli_error(["convert", str(src), str(tmp_path / "full")], capsys)
    convert(str(src), tmp_path / "out")
    err = cli_error(["convert", str(src), str(tmp_path / "out"), "--columns", "id"], capsys)
    assert "plan.json" in err and "another source or with other options" in err
    err = cli_error(["convert", str(src), str(tmp_path / "tok"), "--to", "tokens"], capsys)
    assert "no column 'input_ids'" in err
    err = cli_error(["convert", str(tmp_path / "missing"), str(tmp_path / "o")], capsys)
    assert "missing" in err


def test_a_record_that_does_not_fit_the_schema_names_its_file_and_row(tmp_path: Path) -> None:
    recs = [{"id": i, "note": None} for i in range(1200)]
    recs[1100]["note"] = "late"  # null in the first records, which fix the schema
    (tmp_path / "src").mkdir()
    write_jsonl(tmp_path / "src" / "a.jsonl", recs)
    with pytest.raises(tidal.RecordError) as info:
        convert(str(tmp_path / "src"), tmp_path / "out")
    assert "a.jsonl, row 1100" in str(info.value) and "'note'" in str(info.value) and "--columns" in str(info.value)
    convert(str(tmp_path / "src"), tmp_path / "out2", columns=["id"])  # without it, it converts
    assert len(records(tmp_path / "out2")) == 1200


def keep_small(rec: dict) -> bool:
    return rec["id"] < 20 or rec["id"] >= 100


def test_a_shard_left_empty_by_a_filter_is_skipped(src: Path, tmp_path: Path) -> None:
    report = convert(tidal.Dataset(str(src)).filter(keep_small), tmp_path / "out", shard_size="150B")
    assert any(e.get("name") is None for e in report.entries)
    assert [r["id"] for r in records(tmp_path / "out")] == [i for i in range(130) if i < 20 or i >= 100]


def test_the_plan_covers_every_record_once_and_cuts_large_files() -> None:
    files = [
        tidal.Shard(f"f{i}", rows, nbytes, "jsonl")
        for i, (rows, nbytes) in enumerate([(10, 1000), (0, 0), (1000, 50_000), (3, 30)])
    ]
    ranges = cut(files, 0.5, 4000)
    assert ranges[0][0] == 0 and ranges[-1][1] == 1013
    assert all(a < b for a, b in ranges) and all(r[1] == s[0] for r, s in itertools.pairwise(ranges))
    assert len(ranges) == 7  # 25,515 output bytes in shards of 4,000
    assert cut(files, 0.5, 4000) == ranges  # a pure function of the shard list


def test_a_null_text_names_its_row_and_skips_with_errors_skip(
    tmp_path: Path, tokenizer: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recs: list[dict] = [{"id": i, "text": f"record {i}"} for i in range(40)]
    recs[17]["text"] = None
    del recs[30]["text"]
    (tmp_path / "src").mkdir()
    write_jsonl(tmp_path / "src" / "a.jsonl", recs)
    argv = ["convert", str(tmp_path / "src"), str(tmp_path / "out"), "--tokenize", str(tokenizer)]
    err = cli_error(argv, capsys)
    assert "a.jsonl, row 17: tokenize: column 'text' must hold a string, found NoneType" in err
    assert main([*argv[:2], str(tmp_path / "out2"), *argv[3:], "--errors", "skip"]) == 0
    got = list(tidal.Dataset(str(tmp_path / "out2")))
    assert len(got) == 38
    report = convert(str(tmp_path / "src"), tmp_path / "out3", to="tokens", tokenizer=str(tokenizer), errors="skip")
    assert report.records == 38


def test_a_second_run_says_it_wrote_nothing_and_a_skipped_line_is_logged_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    # before: "wrote 1 shards (1 already done)" when it wrote none, and the bad line was logged
    # twice (by the sample that fixes the schema, then by the task that writes it)
    (tmp_path / "src").mkdir()
    lines = [json.dumps({"id": i}) for i in range(10)]
    lines[3] = "{bad"
    (tmp_path / "src" / "a.jsonl").write_text("\n".join(lines) + "\n")
    argv = ["convert", str(tmp_path / "src"), str(tmp_path / "out"), "--errors", "skip", "--no-progress"]
    with caplog.at_level("WARNING", logger="tidal"):
        assert main(argv) == 0
    assert sum("a.jsonl, line 4" in r.getMessage() for r in caplog.records) == 1
    assert capsys.readouterr().out.startswith("wrote 1 shard, 9 records")
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("wrote 0 of 1 shard (1 already done)") and "holds 9 records" in out


def test_a_column_of_two_types_names_the_column_and_the_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # before: ArrowTypeError: Unable to merge: Field zip has incompatible types, naming no file
    (tmp_path / "src").mkdir()
    write_jsonl(tmp_path / "src" / "a.jsonl", [{"id": 0, "zip": 1234}, {"id": 1, "zip": 501}])
    write_jsonl(tmp_path / "src" / "b.jsonl", [{"id": 2, "zip": "K1A 0B1"}])
    with pytest.raises(tidal.SchemaError) as info:
        convert(str(tmp_path / "src"), tmp_path / "out")
    message = str(info.value)
    assert "column 'zip' holds numbers" in message and "a.jsonl, row 0" in message and "b.jsonl, row 0" in message
    # CSV files: one type per column over the files, or the one declared
    (tmp_path / "csv").mkdir()
    (tmp_path / "csv" / "a.csv").write_bytes(b"zip,n\n10001,1\n20002,2\n")
    (tmp_path / "csv" / "b.csv").write_bytes(b"zip,n\nK1A 0B1,3\n")
    convert(str(tmp_path / "csv"), tmp_path / "out-csv")
    assert [r["zip"] for r in records(tmp_path / "out-csv")] == ["10001", "20002", "K1A 0B1"]
    argv = ["convert", str(tmp_path / "csv" / "a.csv"), str(tmp_path / "out-a"), "--no-progress"]
    assert main([*argv, "--format-option", "column_types.zip=string"]) == 0
    assert [r["zip"] for r in records(tmp_path / "out-a")] == ["10001", "20002"]
