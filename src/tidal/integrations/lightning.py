"""The loader's metrics in Lightning's loggers.

>>> from tidal.integrations.lightning import MetricsCallback
>>> trainer = L.Trainer(callbacks=[MetricsCallback()], logger=CSVLogger("logs"))
>>> trainer.fit(model, tidal.DataLoader(ds, num_workers=4))   # data/tokens, data/data_wait_share, ... logged

After each training batch whose logs the trainer writes (every ``log_every_n_steps``),
:class:`MetricsCallback` logs ``loader.metrics()``, each key under ``prefix``, with
``pl_module.log_dict(..., on_step=True, on_epoch=False)``: beside the loss, in every logger. The loader is the one given, or else
the tidal loader among the trainer's training loaders. Lightning fetches one batch ahead of the
step it trains (to know the last one), so ``data/batches`` runs one ahead of ``global_step``.

Lightning logs only floating values, as float32 unless given float64: a count of 123,456,789
tokens would be logged as 123456792. The metrics are given as float64 tensors, so every count
below 2**53 is logged exactly (as a float: ``123456789.0``).
"""

from __future__ import annotations

from typing import Any

from tidal.errors import missing

try:
    import torch
except ImportError as exc:
    raise missing("torch", "tidal.integrations.lightning", exc, "torch") from None
try:
    from lightning.pytorch import Callback
except ImportError as exc:
    raise missing("lightning", "tidal.integrations.lightning", exc, "lightning") from None

from tidal.integrations import find_loader, prefixed

__all__ = ["MetricsCallback"]


class MetricsCallback(Callback):
    """Logs ``loader.metrics()`` with ``pl_module.log_dict`` at the training steps the loggers write."""

    def __init__(self, loader: Any = None, prefix: str = "data/"):
        self.loader = loader
        self.prefix = prefix

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        connector = getattr(trainer, "_logger_connector", None)  # whether this step's logs are written
        if connector is not None and not getattr(connector, "should_update_logs", True):
            return  # not a step the loggers write: metrics() and log_dict would cost for nothing
        loader = self.loader if self.loader is not None else find_loader(trainer.train_dataloader)
        if loader is None:
            return
        metrics = {k: torch.tensor(v, dtype=torch.float64) for k, v in prefixed(loader.metrics(), self.prefix).items()}
        pl_module.log_dict(metrics, on_step=True, on_epoch=False, logger=True, prog_bar=False, batch_size=1)
