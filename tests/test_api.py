"""The public surface: names and import cost. (The examples of the README and docs/ run in test_docs.py.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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


def test_reading_shuffled_batches_does_not_import_pandas(tmp_path: Path) -> None:
    """pyarrow imports pandas on the first ``pa.array()`` or ``to_numpy()``: 0.3 s and 40 MB in
    every DataLoader worker before its first batch. tidal's read path calls neither."""
    root = make_shards(tmp_path / "data", [30, 20, 25], kinds=("parquet",))
    code = (
        "import sys, tidal\n"
        f"ds = tidal.Dataset({str(root)!r}).shuffle(seed=1, block_size=16).batch(5)\n"
        "print(sum(len(b['id']) for b in ds), 'pandas' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.split() == ["75", "False"], out.stderr


def train_tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"], initial_alphabet=alphabet)
    tok.train_from_iterator([f"record {i} of shard {i % 3}" for i in range(500)], trainer)
    tok.save(str(path))
