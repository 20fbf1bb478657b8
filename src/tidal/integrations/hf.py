"""The loader's metrics in the Hugging Face Trainer's logs.

>>> from tidal.integrations import hf
>>> trainer = TidalTrainer(model=model, args=args, train_dataset=ds)
>>> hf.attach(trainer)                  # every log: data/records, data/tokens, data/data_wait_share, ...
>>> trainer.train()

:class:`MetricsCallback` adds ``loader.metrics()`` to every ``logs`` dict the Trainer hands its
callbacks (``on_log``) and to the entry of ``trainer.state.log_history`` it just wrote. The
Trainer calls its callbacks in order, the reporting ones (W&B, TensorBoard, MLflow, ...) first
and those given as ``callbacks=[...]`` after them: :func:`attach` puts the callback first, so
every reporter logs the metrics too. The loader is the one given, or else the Trainer's own
training loader where it is a tidal loader (as :class:`tidal.hf.TidalTrainer`'s is).
"""

from __future__ import annotations

from typing import Any

from tidal.errors import missing

try:
    from transformers import TrainerCallback
except ImportError as exc:
    raise missing("transformers", "tidal.integrations.hf", exc, "hf") from None

from tidal.integrations import find_loader, prefixed

__all__ = ["MetricsCallback", "attach"]


class MetricsCallback(TrainerCallback):
    """Adds ``loader.metrics()``, each key under ``prefix``, to the Trainer's logs.

    >>> trainer = transformers.Trainer(..., callbacks=[MetricsCallback(loader)])
    """

    def __init__(self, loader: Any = None, prefix: str = "data/"):
        self.loader = loader
        self.prefix = prefix

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        loader = self.loader if self.loader is not None else find_loader(kwargs.get("train_dataloader"))
        if logs is None or loader is None:
            return
        metrics = prefixed(loader.metrics(), self.prefix)
        logs.update(metrics)
        history = state.log_history
        if history and history[-1].get("step") == state.global_step:  # the entry the Trainer wrote for these logs
            history[-1].update(metrics)


def attach(trainer: Any, loader: Any = None, prefix: str = "data/") -> MetricsCallback:
    """A :class:`MetricsCallback` put first among ``trainer``'s callbacks, ahead of the reporters,
    so that every one of them logs the metrics; returned."""
    callback = MetricsCallback(loader, prefix)
    trainer.callback_handler.callbacks.insert(0, callback)
    return callback
