"""`tidal convert --engine ray`: the same shard tasks as Ray tasks, on a local Ray of 2 CPUs."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import make_shards

import tidal
from tidal.cli import main
from tidal.convert import convert

pytestmark = pytest.mark.slow
pytest_plugins = ["s3_fixtures"]

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    # the workers import tidal and this test's map function as the test process does
    path = os.pathsep.join([p for p in sys.path if p] + [os.environ.get("PYTHONPATH", "")])
    ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": path}})
    try:
        yield
    finally:
        ray.shutdown()


def test_ray_tasks_write_what_local_processes_write(tmp_path: Path, local_ray: None) -> None:
    src = make_shards(tmp_path / "src", [100] * 15, kinds=("jsonl", "parquet"))
    local = convert(str(src), tmp_path / "local", shard_size="4KB")
    on_ray = convert(str(src), tmp_path / "ray", shard_size="4KB", engine="ray")
    assert on_ray.shards == local.shards > 2
    for a, b in zip(local.entries, on_ray.entries, strict=True):
        assert (a["name"], a["rows"], a["hash"]) == (b["name"], b["rows"], b["hash"])
    assert list(tidal.Dataset(str(tmp_path / "ray"))) == list(tidal.Dataset(str(src)))


def fail_while(flag: str, at: int, rec: dict) -> dict:
    """Raises at record ``at`` while the file ``flag`` exists (seen by Ray workers on this machine too)."""
    if rec["id"] == at and os.path.exists(flag):
        raise RuntimeError(f"injected failure at id {at}")
    return rec


def test_a_failed_ray_task_raises_its_error_and_a_rerun_goes_on(tmp_path: Path, local_ray: None) -> None:
    src = make_shards(tmp_path / "src", [100] * 15, kinds=("jsonl",))
    flag = tmp_path / "fail"
    flag.touch()
    ds = tidal.Dataset(str(src)).map(functools.partial(fail_while, str(flag), 1400))
    with pytest.raises(RuntimeError, match="injected failure at id 1400"):
        convert(ds, tmp_path / "out", shard_size="4KB", engine="ray", workers=2)
    flag.unlink()
    report = convert(ds, tmp_path / "out", shard_size="4KB", engine="ray")
    assert 0 < report.resumed < report.shards
    assert list(tidal.Dataset(str(tmp_path / "out"))) == list(tidal.Dataset(str(src)))


def test_cli_engine_ray_writes_token_shards(
    tmp_path: Path, local_ray: None, capsys: pytest.CaptureFixture[str]
) -> None:
    src = make_shards(tmp_path / "src", [40, 60], kinds=("jsonl",))
    tok = tidal.Dataset(str(src)).tokenize  # the same tokenizer both ways
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=280,
        special_tokens=["<|endoftext|>"],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    t.train_from_iterator(["record of shard"] * 10, trainer)
    t.save(str(tmp_path / "tokenizer.json"))
    argv = ["convert", str(src), str(tmp_path / "tok"), "--tokenize", str(tmp_path / "tokenizer.json")]
    assert main([*argv, "--engine", "ray", "--shard-size", "500B", "--no-progress"]) == 0
    assert "100 records" in capsys.readouterr().out
    want = [r["input_ids"] for r in tok(str(tmp_path / "tokenizer.json"))]
    got = [r["input_ids"] for r in tidal.Dataset(str(tmp_path / "tok"))]
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True)) and len(got) == 100


def test_tidal_index_counts_a_remote_dataset_in_ray_tasks(
    tmp_path: Path, local_ray: None, s3: Any, bucket: str
) -> None:
    url = s3.upload(make_shards(tmp_path / "src", [30] * 70, kinds=("jsonl.zst", "parquet")), bucket, "web")
    shards = tidal.index(url, storage_options=s3.options(), cache_dir=tmp_path / "c", engine="ray", workers=2)
    assert len(shards) == 70 and shards.total == 2100
    ds = tidal.Dataset(url, storage_options=s3.options(), cache_dir=tmp_path / "node")
    assert ds.shards == shards and sorted(r["id"] for r in ds) == list(range(2100))
