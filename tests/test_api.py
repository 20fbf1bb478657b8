"""The public surface: names, import cost, and the README's examples, run as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import make_shards

import tidal

ROOT = Path(__file__).resolve().parents[1]


def test_all_is_sorted_and_complete() -> None:
    assert tidal.__all__ == sorted(tidal.__all__)
    for name in tidal.__all__:
        assert getattr(tidal, name) is not None
    assert {"Dataset", "DataLoader"} <= set(tidal.__all__)


def test_import_does_not_pull_in_torch() -> None:
    code = "import sys, tidal; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_plain_iteration_works_without_torch(tmp_path: Path) -> None:
    root = make_shards(tmp_path / "data", [10, 20])
    code = (
        "import sys; sys.modules['torch'] = None\n"  # any import of torch now fails
        "import tidal\n"
        f"ds = tidal.Dataset({str(root)!r}).shuffle(seed=1).batch(5)\n"
        "print(sum(len(b['id']) for b in ds))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "30"


def train_tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"], initial_alphabet=alphabet)
    tok.train_from_iterator([f"record {i} of shard {i % 3}" for i in range(500)], trainer)
    tok.save(str(path))


def readme_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)


@pytest.mark.parametrize("index", range(len(readme_blocks())))
def test_readme_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, index: int) -> None:
    make_shards(tmp_path / "data" / "web", [300, 200, 250], kinds=("jsonl.zst",))
    train_tokenizer(tmp_path / "tokenizer.json")
    monkeypatch.chdir(tmp_path)
    try:
        exec(compile(readme_blocks()[index], f"README.md block {index}", "exec"), {})
    finally:
        if "accelerate.state" in sys.modules:  # an example set up an Accelerator: leave none behind
            sys.modules["accelerate.state"].AcceleratorState._reset_state(reset_partial_state=True)
