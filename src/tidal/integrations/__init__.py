"""``loader.metrics()`` where training logs go: the Hugging Face Trainer, Lightning, Prometheus.

Each integration is a module of its own, imported when it is used, so ``import tidal`` and
``import tidal.integrations`` import none of ``transformers``, ``lightning`` or
``prometheus_client``:

- :mod:`tidal.integrations.hf`: :class:`~tidal.integrations.hf.MetricsCallback`, a
  ``transformers.TrainerCallback`` that adds the loader's metrics to the Trainer's logs;
  :func:`~tidal.integrations.hf.attach` puts it ahead of the reporting callbacks (W&B,
  TensorBoard, MLflow) so they log the metrics too.
- :mod:`tidal.integrations.lightning`: :class:`~tidal.integrations.lightning.MetricsCallback`,
  a Lightning ``Callback`` that logs them with ``pl_module.log_dict`` to the trainer's loggers.
- :mod:`tidal.integrations.prometheus`: :func:`~tidal.integrations.prometheus.serve`, a
  Prometheus text endpoint over HTTP, and :func:`~tidal.integrations.prometheus.collector`
  for a registry of one's own.

>>> from tidal.integrations import hf
>>> hf.attach(trainer)                         # logs["data/tokens"], logs["data/data_wait_share"], ...

Metrics keep their names under a prefix (``"data/"`` by default for the callbacks):
``data/tokens``, ``data/tokens/web``, ``data/weight/web``. They are this rank's.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["hf", "lightning", "prometheus"]


def prefixed(metrics: dict[str, float | int], prefix: str) -> dict[str, float | int]:
    """``metrics`` with every key under ``prefix``."""
    return {prefix + key: value for key, value in metrics.items()}


def find_loader(candidate: Any) -> Any:
    """The tidal loader in ``candidate`` (a loader, or a list or dict of loaders), or None."""
    if hasattr(candidate, "metrics") and callable(candidate.metrics):
        return candidate
    if isinstance(candidate, dict):
        candidate = list(candidate.values())
    values = candidate if isinstance(candidate, (list, tuple)) else ()
    for value in values:
        found = find_loader(value)
        if found is not None:
            return found
    return None


def __getattr__(name: str) -> Any:
    if name in __all__:
        return importlib.import_module(f"tidal.integrations.{name}")
    raise AttributeError(f"module 'tidal.integrations' has no attribute {name!r}")
