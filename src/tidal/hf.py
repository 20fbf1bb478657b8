"""Hugging Face ``transformers`` integration: a Trainer whose checkpoints hold the data position.

The stock Trainer resumes a streaming dataset by reading and throwing away every batch it
already trained on, which costs as much as the training run's reading so far and, with a
shuffle buffer, is not even exact. :class:`TidalTrainer` feeds the Trainer from a
:class:`tidal.DataLoader`, writes the loader's state into every checkpoint
(``tidal_data_state-rank{R}.json``) and restores it on ``train(resume_from_checkpoint=...)``,
so the data continues exactly where the checkpoint was taken, at once.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tidal.errors import missing

try:
    from transformers import Trainer
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint
except ImportError as exc:
    raise missing("transformers", "tidal.hf", exc, "hf") from None

from tidal.dataset import Dataset
from tidal.errors import ArgumentError, StateError
from tidal.loader import DataLoader
from tidal.stages import walk
from tidal.world import World


def state_file(checkpoint: str | os.PathLike, rank: int) -> Path:
    return Path(checkpoint) / f"tidal_data_state-rank{rank}.json"


class TidalTrainer(Trainer):
    """A ``transformers.Trainer`` that trains on a :class:`tidal.Dataset` and resumes its data exactly.

    >>> ds = tidal.Dataset("data/").shuffle(seed=0).repeat().tokenize(tok).pack(1024, shift_labels=False)
    >>> trainer = TidalTrainer(model=model, args=TrainingArguments("out", max_steps=10_000), train_dataset=ds)
    >>> trainer.train(resume_from_checkpoint=True)   # model, optimizer and data all continue

    Unbatched datasets are batched with ``per_device_train_batch_size``; the loader uses
    ``dataloader_num_workers``. Batch columns the model's ``forward`` does not take
    (``segment_ids``, for most models) are dropped. Hugging Face models shift labels
    themselves, so packed datasets must use ``pack(..., shift_labels=False)``.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        ds = self.train_dataset
        if not isinstance(ds, Dataset):
            raise ArgumentError(f"TidalTrainer trains on a tidal.Dataset, not {type(ds).__name__}")
        if any(s.shifts_labels() for s in walk(ds.stage)):
            raise ArgumentError("Hugging Face models shift labels themselves: use pack(..., shift_labels=False)")
        self.args.ignore_data_skip = True  # the loader restores its own position; never skip batches
        self._data_loader: DataLoader | None = None
        self._data_state: dict | None = None

    def get_train_dataloader(self) -> DataLoader:
        if self._data_loader is None:
            ds = self.train_dataset
            assert isinstance(ds, Dataset)
            if not ds.batched:
                ds = ds.batch(self._train_batch_size, drop_last=self.args.dataloader_drop_last)
            args = self.args
            options: dict[str, Any] = {"pin_memory": args.dataloader_pin_memory}
            if args.dataloader_num_workers > 0:
                options["persistent_workers"] = args.dataloader_persistent_workers
                options["prefetch_factor"] = args.dataloader_prefetch_factor
            self._data_loader = DataLoader(ds, num_workers=args.dataloader_num_workers, **options)
        if self._data_state is not None:
            self._data_loader.load_state_dict(self._data_state)
            self._data_state = None
        return self._data_loader

    def _prepare_inputs(self, inputs: Any) -> Any:
        if isinstance(inputs, dict):
            self._set_signature_columns_if_needed()
            keep: set[str] = set(self._signature_columns or ())
            inputs = {k: v for k, v in inputs.items() if k in keep}
        return super()._prepare_inputs(inputs)

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        super()._save_checkpoint(model, trial)
        if self._data_loader is None:
            return
        folder = Path(self._get_output_dir(trial=trial)) / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        target = state_file(folder, World.ranks().rank)
        tmp = target.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._data_loader.state_dict()))
        os.replace(tmp, target)

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any) -> Any:
        if resume_from_checkpoint:
            path = resume_from_checkpoint
            if path is True:
                path = get_last_checkpoint(self.args.output_dir)
                if path is None:
                    raise StateError(f"no checkpoint to resume from in {self.args.output_dir}")
            assert isinstance(path, str)
            saved = state_file(path, World.ranks().rank)
            if not saved.exists():
                raise StateError(f"{path} holds no tidal data state ({saved.name}): was it saved by TidalTrainer?")
            self._data_state = json.loads(saved.read_text())
            resume_from_checkpoint = path
        return super().train(resume_from_checkpoint, *args, **kwargs)
