"""The Hugging Face Trainer, stopped and resumed from its checkpoint, reads what an uninterrupted run reads."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import transformers
from makers import EOS, word_tokenizer, write_docs

import tidal
from tidal.hf import TidalTrainer


class RecordingTrainer(TidalTrainer):
    """Notes a digest of every batch the model trains on."""

    seen: list[str]

    def training_step(self, model: Any, inputs: dict, *args: Any, **kwargs: Any) -> Any:
        self.seen.append(hashlib.sha1(inputs["input_ids"].cpu().numpy().tobytes()).hexdigest()[:10])
        return super().training_step(model, inputs, *args, **kwargs)


def run(out: Path, ds: tidal.Dataset, max_steps: int, resume: str | None = None) -> list[str]:
    config = transformers.GPT2Config(vocab_size=EOS + 1, n_positions=32, n_embd=16, n_layer=1, n_head=2)
    args = transformers.TrainingArguments(
        output_dir=str(out), max_steps=max_steps, per_device_train_batch_size=2, gradient_accumulation_steps=2,
        save_strategy="steps", save_steps=3, logging_steps=100, report_to=[], use_cpu=True,
        dataloader_num_workers=2, disable_tqdm=True, seed=0,
    )  # fmt: skip
    transformers.set_seed(0)
    trainer = RecordingTrainer(model=transformers.GPT2LMHeadModel(config), args=args, train_dataset=ds)
    trainer.seen = []
    trainer.train(resume_from_checkpoint=resume)
    return trainer.seen


@pytest.mark.slow
def test_trainer_resume_consumes_exactly_the_uninterrupted_data(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, EOS, rng.integers(5, 50)).tolist() for _ in range(120)]
    ds = (
        tidal.Dataset(write_docs(tmp_path / "data", docs, shards=4))
        .shuffle(seed=3, block_size=20)
        .repeat()
        .tokenize(word_tokenizer(), eos="<eos>")
        .pack(32, shift_labels=False)
    )
    full = run(tmp_path / "full", ds, max_steps=8)
    assert len(full) == 16  # 8 steps x 2 accumulated batches
    first = run(tmp_path / "cut", ds, max_steps=3)
    assert first == full[:6]
    rest = run(tmp_path / "cut", ds, max_steps=8, resume=str(tmp_path / "cut" / "checkpoint-3"))
    assert rest == full[6:]


def test_trainer_refuses_pre_shifted_labels(tmp_path: Path) -> None:
    ds = tidal.Dataset(write_docs(tmp_path / "data", [[1, 2, 3]], shards=1)).tokenize(word_tokenizer(), eos="<eos>")
    config = transformers.GPT2Config(vocab_size=EOS + 1, n_positions=8, n_embd=8, n_layer=1, n_head=1)
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "o"), max_steps=1, report_to=[], use_cpu=True)
    with pytest.raises(ValueError, match="shift_labels=False"):
        TidalTrainer(model=transformers.GPT2LMHeadModel(config), args=args, train_dataset=ds.pack(8))
