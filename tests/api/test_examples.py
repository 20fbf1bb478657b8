"""The example training scripts run, save, and resume from where they stopped."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("corpus")
    (root / "data").mkdir()
    words = [
        "the",
        "stream",
        "packs",
        "tokens",
        "into",
        "sequences",
        "and",
        "resumes",
        "exactly",
        "where",
        "it",
        "stopped",
    ]
    for s in range(3):
        lines = [
            json.dumps({"text": " ".join(words[(i * 7 + j) % len(words)] for j in range(5 + i % 40))})
            for i in range(150)
        ]
        (root / "data" / f"part-{s}.jsonl").write_text("\n".join(lines))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator([" ".join(words)] * 10, trainer)
    tok.save(str(root / "tokenizer.json"))
    return root / "data", root / "tokenizer.json"


def run(script: str, *args: str) -> str:
    cmd = [sys.executable, str(ROOT / "examples" / script), *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=300).stdout


@pytest.mark.slow
def test_plain_torch_loop_resumes(corpus: tuple[Path, Path], tmp_path: Path) -> None:
    data, tok = corpus
    common = [
        "--data",
        str(data),
        "--tokenizer",
        str(tok),
        "--out",
        str(tmp_path),
        "--seq_len",
        "32",
        "--save_every",
        "5",
    ]
    run("train_torch.py", *common, "--max_steps", "10")
    out = run("train_torch.py", *common, "--max_steps", "15", "--resume")
    assert "resumed at step 10" in out and (tmp_path / "step-15" / "data-rank0.json").exists()


@pytest.mark.slow
def test_hf_trainer_example_resumes(corpus: tuple[Path, Path], tmp_path: Path) -> None:
    data, tok = corpus
    common = [
        "--data",
        str(data),
        "--tokenizer",
        str(tok),
        "--out",
        str(tmp_path),
        "--seq_len",
        "32",
        "--save_steps",
        "3",
    ]
    run("train_causal_lm.py", *common, "--max_steps", "3", "--batch_size", "2")
    run("train_causal_lm.py", *common, "--max_steps", "6", "--batch_size", "2", "--resume")
    state = json.loads((tmp_path / "checkpoint-6" / "trainer_state.json").read_text())
    assert state["global_step"] == 6
    assert (tmp_path / "checkpoint-6" / "tidal_data_state-rank0.json").exists()


@pytest.mark.slow
def test_jax_loop_resumes_to_bit_identical_params(corpus: tuple[Path, Path], tmp_path: Path) -> None:
    pytest.importorskip("jax")
    import numpy as np

    data, tok = corpus
    common = ["--data", str(data), "--tokenizer", str(tok), "--seq_len", "32", "--save_every", "100"]
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    run("train_jax.py", *common, "--out", str(whole), "--max_steps", "12")
    run("train_jax.py", *common, "--out", str(parts), "--max_steps", "5")
    out = run("train_jax.py", *common, "--out", str(parts), "--max_steps", "12", "--resume")
    assert "resumed at step 5" in out
    a, b = np.load(whole / "step-12" / "train.npz"), np.load(parts / "step-12" / "train.npz")
    assert a.files == b.files and all(np.array_equal(a[f], b[f]) for f in a.files)
    first = np.load(parts / "step-5" / "train.npz")
    assert not np.array_equal(first["a0"], a["a0"])  # it trained between the two checkpoints
    state = json.loads((parts / "step-12" / "data.json").read_text())
    assert state["ranks"][0]["counts"]["batches"] == 12  # counted across the restore
