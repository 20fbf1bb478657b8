"""The ``tidal`` command, run as users run it (``python -m tidal.cli ...`` in a subprocess) on
small data made in tmp_path: what each command prints, its exit status, and its errors."""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tarfile
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import make_shards
from makers import train_tokenizer
from s3_server import KEY, REGION, SECRET, S3Server

import tidal
from tidal.cli import parser
from tidal.commands import storage_options
from tidal.formats.tokens import TokenWriter
from tidal.simulate import Setup, simulate
from tidal.stages.blocks import BlockReader
from tidal.stages.plan import DEFAULT_BLOCK_BYTES
from tidal.stages.read import Read
from tidal.world import World

pytest_plugins = ["s3_fixtures"]

SIZES = [40, 75, 13, 60, 52, 33, 90, 17]  # 380 records, ids consecutive per shard (make_shards)


def tidal_cli(*args: str, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    environment = {**os.environ, **(env or {})}
    environment.pop("PYTHONWARNINGS", None)
    return subprocess.run(
        [sys.executable, "-m", "tidal.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=environment,
        timeout=120,
    )


def one_line_error(out: subprocess.CompletedProcess, command: str) -> str:
    assert out.returncode == 2, out
    assert out.stderr.startswith(f"tidal {command}: ") and out.stderr.count("\n") == 1, out.stderr
    assert "Traceback" not in out.stderr
    return out.stderr


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return make_shards(tmp_path / "data", SIZES)


# -- the parser ---------------------------------------------------------------------------------


def test_every_argument_of_every_command_has_help() -> None:
    def check(p: argparse.ArgumentParser, where: str) -> None:
        for action in p._actions:
            if action.dest in ("help",):
                continue
            if action.__class__.__name__ == "_SubParsersAction":
                for name, sub in action.choices.items():
                    check(sub, f"{where} {name}")
                continue
            assert action.help, f"{where}: {action.option_strings or action.dest} has no help"

    check(parser(), "tidal")


def test_storage_options_nest_dotted_keys_and_read_json_values() -> None:
    got = storage_options(["anon=true", "client_kwargs.region_name=eu-west-1", "endpoint_url=http://h:9000", "n=3"])
    assert got == {"anon": True, "client_kwargs": {"region_name": "eu-west-1"}, "endpoint_url": "http://h:9000", "n": 3}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        storage_options(["anon"])


# -- inspect ------------------------------------------------------------------------------------


def test_inspect_shows_formats_records_columns_samples_and_shards(data: Path) -> None:
    out = tidal_cli("inspect", str(data), "--samples", "2", "--limit", "3")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("8 shards, 380 records, ") and lines[0].endswith(str(data))
    assert lines[1] == "format: jsonl (3 shards), jsonl.zstd (3 shards), parquet (2 shards)"
    assert "  id                   int" in lines and "  text                 string" in lines
    assert (
        "  {'id': 0, 'text': 'record 0 of shard 0'}" in lines and "  {'id': 1, 'text': 'record 1 of shard 0'}" in lines
    )
    assert f"{data}/part-002.parquet" in out.stdout and "part-003" not in out.stdout
    assert "... 5 more (--limit)" in out.stdout


def test_inspect_shows_a_file_with_bad_lines_and_names_each(tmp_path: Path) -> None:
    """Bad JSON lines do not stop it: the good records are shown, each bad line counted and named,
    exit status 1; --errors raise stops at the first, as before."""
    path = tmp_path / "mixed.jsonl"
    path.write_text('{"id": 0}\n{"id": 1\n{"id": 2}\nnot json\n{"id": 4}\n')
    out = tidal_cli("inspect", str(path), "--samples", "3")
    assert out.returncode == 1, out.stderr
    lines = out.stdout.splitlines()
    assert "  id                   int" in lines
    assert [line for line in lines if line.startswith("  {")] == ["  {'id': 0}", "  {'id': 2}", "  {'id': 4}"]
    assert "bad records: 2 skipped among the records read for the columns and samples (of mixed.jsonl):" in lines
    named = [line for line in lines if line.startswith(f"  {path}, line ")]
    assert [line.split(":")[0] for line in named] == [f"  {path}, line 2", f"  {path}, line 4"]
    assert all("malformed JSON record" in line for line in named)
    out = tidal_cli("inspect", str(path), "--limit", "1")
    assert out.returncode == 1 and "  ... 1 more (--limit)" in out.stdout.splitlines()
    err = one_line_error(tidal_cli("inspect", str(path), "--errors", "raise"), "inspect")
    assert f"{path}, line 2: malformed JSON record" in err


def _formats(root: Path) -> dict[str, tuple[Path, int, list[str]]]:
    """One small dataset per format: (path, records, words the column listing must show)."""
    import pyarrow.parquet as pq

    root.mkdir()
    pq.write_table(pa.table({"x": [1.5, 2.5], "tags": [["a"], ["b", "c"]]}), root / "t.parquet")
    (root / "t.csv").write_text("name,n\nada,1\nbob,2\ncyd,3\n")
    with pa.OSFile(str(root / "t.arrow"), "wb") as sink, pa.ipc.new_file(sink, pa.schema([("v", pa.int32())])) as w:
        w.write_table(pa.table({"v": pa.array([7, 8], pa.int32())}))
    with TokenWriter(root / "tokens", shard_size=1000) as tw:
        for i in range(4):
            tw.write(np.arange(i + 2))
    with tarfile.open(root / "t.tar", "w") as tf:
        for key in ("a", "b"):
            for ext, body in (("txt", f"caption {key}"), ("json", json.dumps({"k": key}))):
                info = tarfile.TarInfo(f"{key}.{ext}")
                payload = body.encode()
                info.size = len(payload)
                tf.addfile(info, io.BytesIO(payload))
    (root / "t.txt").write_text("one line\nanother line\n")
    return {
        "parquet": (
            root / "t.parquet",
            2,
            ["x                    double", "tags                 list<element: string>"],
        ),
        "csv": (root / "t.csv", 3, ["name", "n"]),
        "arrow": (root / "t.arrow", 2, ["v                    int32"]),
        "tokens": (root / "tokens", 4, ["input_ids            array[uint16]"]),
        "webdataset": (root / "t.tar", 2, ["txt                  string", "json                 dict"]),
        "text": (root / "t.txt", 2, ["text                 string"]),
    }


def test_inspect_reads_every_kind_of_format(tmp_path: Path) -> None:
    for name, (path, records, columns) in _formats(tmp_path / "formats").items():
        out = tidal_cli("inspect", str(path), "--samples", "1")
        assert out.returncode == 0, (name, out.stderr)
        assert out.stdout.startswith(f"1 shard, {records} records"), (name, out.stdout)
        assert f"format: {name}" in out.stdout, (name, out.stdout)
        for column in columns:
            assert column in out.stdout, (name, column, out.stdout)


def test_inspect_of_a_glob_over_several_formats_shows_the_columns_of_each(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"text": "a", "id": 1}\n')
    pq.write_table(pa.table({"body": ["b"], "n": [2]}), tmp_path / "b.parquet")
    (tmp_path / "c.csv").write_text("text,score\nx,1.5\n")
    out = tidal_cli("inspect", str(tmp_path / "*"), "--samples", "1")
    assert out.returncode == 0, out.stderr
    for kind, file, columns in [
        ("jsonl", "a.jsonl", "id"),
        ("parquet", "b.parquet", "body"),
        ("csv", "c.csv", "score"),
    ]:
        assert f"columns ({kind} shards, of the first records, in {file}):" in out.stdout, out.stdout
        assert columns in out.stdout.split(f"in {file}):")[1]


def test_inspect_of_a_config_shows_the_pipeline_and_its_first_item(data: Path, tmp_path: Path) -> None:
    train_tokenizer(tmp_path / "tokenizer.json")
    config = {
        "source": {"src": str(data), "columns": ["text"]},
        "steps": [{"shuffle": {"seed": 0}}, {"tokenize": {"tokenizer": str(tmp_path / "tokenizer.json")}},
                  {"pack": {"seq_len": 16}}, {"batch": {"size": 4}}],
    }  # fmt: skip
    (tmp_path / "pipeline.json").write_text(json.dumps(config))
    out = tidal_cli("inspect", "--config", str(tmp_path / "pipeline.json"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("Dataset(8 shards, 380 records).shuffle(seed=0")
    assert "  source: 8 shards, 380 records" in out.stdout
    assert "  input_ids            array[int64] of shape (4, 16)" in out.stdout or "array[uint" in out.stdout
    assert "'position_ids': array[" in out.stdout


def test_inspect_reads_s3_with_storage_options_and_never_prints_them(
    s3: S3Server, bucket: str, data: Path, tmp_path: Path
) -> None:
    url = s3.upload(data, bucket, "web")
    options = [f"key={KEY}", f"secret={SECRET}", f"endpoint_url={s3.endpoint}", f"client_kwargs.region_name={REGION}"]
    args = [x for o in options for x in ("--storage-option", o)]
    out = tidal_cli("inspect", url, *args, "--samples", "1", env={"TIDAL_CACHE_DIR": str(tmp_path / "cache")})
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("8 shards, 380 records, ") and f"{url}/part-000.jsonl" in out.stdout
    assert "{'id': 0, 'text': 'record 0 of shard 0'}" in out.stdout
    assert SECRET not in out.stdout + out.stderr
    out = tidal_cli("inspect", url, "--storage-option", f"endpoint_url={s3.endpoint}", "--storage-option", "anon=true",
                    env={"TIDAL_CACHE_DIR": str(tmp_path / "cache2")})  # fmt: skip
    assert one_line_error(out, "inspect")  # no credentials: one line, whatever the store answered


def test_inspect_draws_a_progress_bar_while_indexing(data: Path) -> None:
    out = tidal_cli("inspect", str(data), "--progress")
    assert out.returncode == 0 and "index: 100%" in out.stderr and "8/8" in out.stderr
    assert tidal_cli("inspect", str(data)).stderr == ""  # not a terminal: no bar


# -- bench --------------------------------------------------------------------------------------


def test_bench_measures_the_pipeline_and_the_wait_of_a_training_step(data: Path, tmp_path: Path) -> None:
    train_tokenizer(tmp_path / "tokenizer.json")
    out = tidal_cli(
        "bench", str(data), "--tokenize", str(tmp_path / "tokenizer.json"), "--pack", "32", "--batch", "4",
        "--workers", "1", "--shuffle", "0", "--seconds", "1", "--step-time", "0.002", "--plot", str(tmp_path / "b.png"),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert text.startswith("pipeline: Dataset(8 shards, 380 records).shuffle(seed=0")
    assert ".tokenize(" in text and ".pack(32" in text and ".batch(4" in text
    assert "through: tidal.DataLoader, 1 worker(s)" in text
    assert "first batch: " in text and "after iter()" in text
    assert "tokens/s" in text and "records/s" in text and "in batches" in text and "of source files" in text
    assert "a training step of 2 ms " in text and "of the time waiting" in text
    assert "throughput at full speed, tokens/s" in text and "data wait of the training loop" in text
    assert (tmp_path / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_without_torch_reads_in_process(data: Path) -> None:
    out = tidal_cli("bench", str(data), "--no-torch", "--seconds", "0.5", "--batch", "5")
    assert out.returncode == 0, out.stderr
    assert "through: the dataset iterated in this process (--no-torch)" in out.stdout
    assert "records/s" in out.stdout and "a training step longer than that should not wait" in out.stdout
    assert "throughput at full speed, records/s" in out.stdout


def test_bench_packs_a_column_of_token_ids_named_with_column(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    ids = pa.array([list(range(i, i + 7 + i % 5)) for i in range(200)], pa.list_(pa.uint16()))
    pq.write_table(pa.table({"id": list(range(200)), "tokens": ids}), tmp_path / "t.parquet")
    out = tidal_cli("bench", str(tmp_path / "t.parquet"), "--pack", "16", "--column", "tokens", "--no-torch",
                    "--seconds", "0.5", "--batch", "4")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert ".pack(16" in out.stdout and "column='tokens'" in out.stdout and "tokens/s" in out.stdout


def test_bench_of_a_finite_config_starts_each_pass_again_and_says_so(data: Path, tmp_path: Path) -> None:
    """A config without repeat ends after 47 batches: the measurement goes on over new passes (as
    an epoch loop calls iter() again), for the whole --seconds, and the report says it."""
    config = tmp_path / "finite.json"
    config.write_text(json.dumps({"source": {"src": str(data)}, "steps": [{"batch": {"size": 8}}]}))
    out = tidal_cli("bench", "--config", str(config), "--no-torch", "--seconds", "1", "--step-time", "0.001")
    assert out.returncode == 0, out.stderr
    assert "the pipeline is finite: a pass gives 47 batches; it ended " in out.stdout
    assert "a training step of 1 ms " in out.stdout


IGNORED = [
    # a flag that would not apply in that combination: refused, naming it
    (["bench", "--config", "{config}", "--batch", "4"], "--batch: the pipeline comes from --config"),
    (["bench", "--config", "{config}", "--column", "text"], "--column: the pipeline comes from --config"),
    (["bench", "{data}", "--column", "text"], "--column names the text --tokenize reads or the token ids --pack packs"),
    (["bench", "{data}", "--no-torch", "--workers", "2"], "--workers: with --no-torch"),
    (["bench", "--config", "{config}", "--format", "jsonl"], "--format: the source comes from --config"),
    (["inspect", "--config", "{config}", "--columns", "id"], "--columns: the source comes from --config"),
    (["inspect", "--config", "{config}", "--storage-option", "anon=true"], "--storage-option: the source comes from"),
    (["inspect", "--config", "{config}", "--cache-dir", "c"], "--cache-dir: the source comes from --config"),
    (["inspect", "--config", "{config}", "--follow-links"], "--follow-links: the source comes from --config"),
    (["inspect", "--config", "{config}", "--limit", "3"], "--limit: with --config the pipeline is shown"),
    (["inspect", "--config", "{config}", "--errors", "skip"], "--errors: with --config the config's own errors"),
    (["plan", "--config", "{config}", "--format", "jsonl"], "--format: the source comes from --config"),
    (["index", "s3://bucket/data/", "--ray-address", "auto"], "ray_address is the cluster of engine='ray'"),
    (["index", "s3://bucket/data/", "--engine", "ray"], "engine='ray' counts in Ray tasks: give workers=N"),
    (["convert", "{data}", "{out}", "--ray-address", "auto"], "ray_address is the cluster of engine='ray'"),
]


@pytest.mark.parametrize(("argv", "message"), IGNORED, ids=[" ".join(a[:1] + a[2:]) for a, _ in IGNORED])
def test_a_flag_that_would_be_ignored_is_an_error_naming_it(
    argv: list[str], message: str, data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tidal.cli import main

    config = tmp_path / "p.json"
    config.write_text(json.dumps({"source": {"src": str(data)}, "steps": [{"batch": {"size": 8}}]}))
    names = {"config": str(config), "data": str(data), "out": str(tmp_path / "out")}
    assert main([a.format(**names) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"tidal {argv[0]}: ") and message in err, err
    assert not (tmp_path / "out").exists()


def test_version_and_follow_links_on_the_command_line(tmp_path: Path) -> None:
    out = tidal_cli("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"tidal {tidal.__version__}"
    outside = make_shards(tmp_path / "outside", [5])
    data = make_shards(tmp_path / "data", [3])
    (data / "more").symlink_to(outside, target_is_directory=True)
    refused = one_line_error(tidal_cli("inspect", str(data), "--no-progress"), "inspect")
    assert "--follow-links" in refused
    out = tidal_cli("inspect", str(data), "--follow-links", "--no-progress", "--samples", "0")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("2 shards, 8 records")


# -- plan ---------------------------------------------------------------------------------------


def test_plan_of_an_unshuffled_run_splits_the_shards_between_nodes(data: Path) -> None:
    out = tidal_cli("plan", str(data), "--ranks", "2", "--workers", "1", "--batch", "10")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "2 nodes x 1 rank(s) x 1 worker(s) = 2 readers" in text
    assert "each reader: 190 records; 19 batches per rank per epoch" in text
    assert "node 0 (rank 0): 5 shards" in text and "node 1 (rank 1): 4 shards" in text  # shard 4 is split
    assert "shuffle: none" in text


def test_plan_reports_cache_quality_and_first_batch(data: Path) -> None:
    out = tidal_cli(
        "plan", str(data), "--ranks", "4", "--ranks-per-node", "2", "--workers", "2", "--shuffle", "3",
        "--block-size", "50", "--block-bytes", "1MB", "--shards-per-block", "3", "--batch", "5", "--cache-limit", "1MB",
        "--bandwidth", "100MB/s",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "2 nodes x 2 rank(s) x 2 worker(s) = 8 readers" in text
    assert "shuffled (seed 3) in blocks of 50 records and 1 MB mixing at least 3 shards" in text
    assert "tidal needs a cache_limit of at least" in text and "distinct shards on average" in text
    assert "first batch: " in text and "at 100MB/s" in text


def _opened(ds: tidal.Dataset, world: World, monkeypatch: pytest.MonkeyPatch) -> tuple[set[int], list[list[int]]]:
    """The shards a real reader opens, and the ids of its batches."""
    opened: set[int] = set()
    real = BlockReader._open_reader

    def spy(self: BlockReader, index: int):  # type: ignore[no-untyped-def]
        opened.add(index)
        return real(self, index)

    monkeypatch.setattr(BlockReader, "_open_reader", spy)
    batches = [b["id"].tolist() for b in ds.iterator(world)]
    monkeypatch.setattr(BlockReader, "_open_reader", real)
    return opened, batches


@pytest.mark.parametrize(
    ("ranks", "workers", "seed", "block_bytes"),
    [(1, 1, 3, None), (2, 2, 3, None), (3, 1, 5, None), (2, 1, None, None), (2, 2, 3, 600), (1, 2, None, 600)],
)
def test_plan_knows_which_shards_each_reader_opens_and_how_mixed_its_batches_are(
    data: Path, monkeypatch: pytest.MonkeyPatch, ranks: int, workers: int, seed: int | None, block_bytes: int | None
) -> None:
    """``block_bytes`` 600: blocks of ~15 records of these files, not ``block_size``'s 50."""
    ds = tidal.Dataset(data)
    bound = block_bytes or DEFAULT_BLOCK_BYTES
    if seed is not None:
        ds = ds.shuffle(seed=seed, block_size=50, shards_per_block=3, block_bytes=bound)
    elif block_bytes is not None:
        ds = tidal.Dataset.of(Read(replace(ds.sources()[""], block_bytes=bound)))  # in order, blocks bounded
    ds = ds.batch(6)
    starts = np.cumsum([0, *SIZES])
    setup = Setup(
        rows=SIZES, bytes=[s.bytes for s in ds.shards], seed=seed, block_size=50 if seed is not None else 16_384,
        shards_per_block=3, block_bytes=bound, ranks=ranks, workers=workers, batch=6, sample_batches=10_000,
    )  # fmt: skip
    sim = simulate(setup)
    distinct = []
    for reader in sim.readers:
        opened, batches = _opened(ds, World(reader.rank, ranks, reader.worker, workers), monkeypatch)
        assert reader.shards == opened
        assert reader.records // 6 == len(batches)
        distinct += [len({int(np.searchsorted(starts, i, side="right")) - 1 for i in b}) for b in batches]
    assert sim.quality["batches"] == len(distinct)
    assert sim.quality["distinct"] == pytest.approx(np.mean(distinct))


def test_plan_counts_shards_fetched_again_when_the_cache_is_small(data: Path) -> None:
    sizes = [s.bytes for s in tidal.Dataset(data).shards]
    base = dict(
        rows=SIZES, bytes=sizes, seed=1, block_size=40, shards_per_block=2, ranks=2, workers=2, ranks_per_node=2
    )
    roomy = simulate(Setup(**base))  # type: ignore[arg-type]
    (node,) = roomy.nodes
    assert node.downloads == node.touched == len(SIZES) and node.downloaded_bytes == sum(sizes)
    tight = simulate(Setup(**base, cache_limit=roomy.cache_per_node))  # type: ignore[arg-type]
    assert tight.nodes[0].downloads >= node.downloads and not tight.nodes[0].too_small
    assert simulate(Setup(**base, cache_limit=1)).nodes[0].too_small  # type: ignore[arg-type]


# -- errors: one line, naming the file; --verbose for the traceback ------------------------------


def test_errors_are_one_line_naming_the_file(tmp_path: Path, data: Path) -> None:
    (tmp_path / "x.json").write_text("{not json")
    err = one_line_error(tidal_cli("state", "show", str(tmp_path / "x.json")), "state")
    assert f"{tmp_path / 'x.json'}: not JSON: " in err and "line 1, column 2" in err
    (tmp_path / "y.json").write_text('{"not": "a state"}')
    err = one_line_error(tidal_cli("state", "skip", str(tmp_path / "y.json"), "--batches", "3"), "state")
    assert f"{tmp_path / 'y.json'}: " in err and "not a tidal loader state" in err
    err = one_line_error(tidal_cli("inspect", str(tmp_path / "missing")), "inspect")
    assert "missing: no such file or directory" in err
    err = one_line_error(tidal_cli("bench", str(tmp_path / "missing"), "--seconds", "1"), "bench")
    assert "missing" in err
    assert "--ranks must be at least 1" in one_line_error(tidal_cli("plan", str(data), "--ranks", "0"), "plan")
    assert "--bandwidth 'fast'" in one_line_error(tidal_cli("plan", str(data), "--bandwidth", "fast"), "plan")
    (tmp_path / "bad.jsonl").write_text('{"id": 1}\n{oops\n')
    err = one_line_error(tidal_cli("inspect", str(tmp_path / "bad.jsonl"), "--errors", "raise"), "inspect")
    assert "bad.jsonl" in err and "line 2" in err


def test_verbose_prints_the_traceback_before_or_after_the_command(tmp_path: Path) -> None:
    (tmp_path / "x.json").write_text("[")
    for args in (["--verbose", "state", "show"], ["state", "show", "--verbose"], ["-v", "state", "show"]):
        out = tidal_cli(*args, str(tmp_path / "x.json"))
        assert out.returncode == 2 and "Traceback (most recent call last)" in out.stderr
        assert out.stderr.splitlines()[-1].startswith("tidal state: ")


def test_a_wrong_argument_is_exit_status_2(data: Path) -> None:
    out = tidal_cli("plan", str(data), "--ranks", "many")
    assert out.returncode == 2 and "invalid int value: 'many'" in out.stderr
    assert tidal_cli("inspect").returncode == 2  # neither URL nor --config


def test_state_skip_writes_beside_the_state(data: Path, tmp_path: Path) -> None:
    loader = tidal.DataLoader(tidal.Dataset(data).shuffle(seed=3).batch(5), num_workers=0)
    for _, _ in zip(range(4), loader, strict=False):
        pass
    (tmp_path / "s.json").write_text(json.dumps(loader.state_dict()))
    out = tidal_cli("state", "skip", str(tmp_path / "s.json"), "--batches", "2")
    assert out.returncode == 0 and out.stdout.startswith(f"wrote {tmp_path / 's.skip2.json'}")
    shown = tidal_cli("state", "show", str(tmp_path / "s.skip2.json")).stdout
    assert "skipped by `tidal state skip`: 2 batches per rank" in shown
    assert Counter(shown.split())["batches"] >= 1


def test_plan_takes_the_workers_of_a_configs_loader(data: Path, tmp_path: Path) -> None:
    config = tmp_path / "pipe.json"
    config.write_text(
        json.dumps(
            {
                "version": 1,
                "source": {"src": str(data)},
                "steps": [{"batch": {"size": 8}}],
                "loader": {"num_workers": 3},
            }
        )
    )
    out = tidal_cli("plan", "--config", str(config), "--ranks", "2", "--no-progress")
    assert out.returncode == 0, out.stderr
    assert "x 3 worker(s) = 6 readers" in out.stdout
    out = tidal_cli("plan", "--config", str(config), "--ranks", "2", "--workers", "1", "--no-progress")
    assert "x 1 worker(s) = 2 readers" in out.stdout


def test_a_dataset_indexes_under_a_bar_when_asked(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ds = tidal.Dataset(data, progress=True, cache_dir=None)
    err = capsys.readouterr().err
    assert "index" in err and f"{len(ds.shards)}/{len(ds.shards)}" in err
    tidal.Dataset(data)
    assert capsys.readouterr().err == ""
    config = {"source": {"src": str(data), "progress": True}, "steps": []}
    assert tidal.Dataset.from_config(config).num_records == ds.num_records


# -- trace -----------------------------------------------------------------------------------------


def test_trace_without_a_state_from_another_directory(data: Path, tmp_path: Path) -> None:
    """A config to_config() wrote from relative paths, traced from another directory, with no
    state: the batches from the start of the run, as a loader yields them."""
    ds = tidal.Dataset(os.path.relpath(data)).shuffle(seed=5).batch(4)
    (tmp_path / "pipeline.json").write_text(json.dumps(ds.to_config()))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tidal_cli("trace", "--config", str(tmp_path / "pipeline.json"), "--steps", "3", cwd=elsewhere)
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert [line["step"] for line in lines] == [0, 1, 2]
    assert [line["rows"] for line in lines] == tidal.trace(ds, None, steps=3)  # what test_trace checks against a loader
