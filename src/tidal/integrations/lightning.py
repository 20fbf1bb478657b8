"""The loader's metrics in Lightning's loggers.

>>> from tidal.integrations.lightning import MetricsCallback
>>> trainer = L.Trainer(callbacks=[MetricsCallback()], logger=CSVLogger("logs"))
>>> trainer.fit(model, tidal.DataLoader(ds, num_workers=4))   # data/tokens, data/data_wait_share, ... logged

After every training batch, :class:`MetricsCallback` logs ``loader.metrics()``, each key under
``prefix``, with ``pl_module.log_dict(..., on_step=True, on_epoch=False)``: the trainer's loggers
write them at its ``log_every_n_steps``, beside the loss. The loader is the one given, or else
the tidal loader among the trainer's training loaders. Lightning fetches one batch ahead of the
step it trains (to know the last one), so ``data/batches`` runs one ahead of ``global_step``.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch import Callback

from tidal.integrations import find_loader, prefixed

__all__ = ["MetricsCallback"]


class MetricsCallback(Callback):
    """Logs ``loader.metrics()`` with ``pl_module.log_dict`` after every training batch."""

    def __init__(self, loader: Any = None, prefix: str = "data/"):
        self.loader = loader
        self.prefix = prefix

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        loader = self.loader if self.loader is not None else find_loader(trainer.train_dataloader)
        if loader is None:
            return
        metrics = prefixed(loader.metrics(), self.prefix)
        pl_module.log_dict(metrics, on_step=True, on_epoch=False, logger=True, prog_bar=False, batch_size=1)
