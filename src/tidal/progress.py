"""A progress bar on stderr (tqdm, the ``cli`` extra), or nothing where there is no tqdm."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any


class Bar:
    """A tqdm bar on stderr when ``enabled`` and tqdm is installed; otherwise nothing at all."""

    def __init__(self, total: float | None, desc: str, unit: str, enabled: bool, **kwargs: Any):
        self._bar: Any = None
        if not enabled:
            return
        try:
            from tqdm import tqdm
        except ImportError:
            return
        self._bar = tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True, **kwargs)

    def update(self, n: float = 1) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def set(self, text: str) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(text, refresh=False)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def loader_postfix(metrics: Mapping[str, float]) -> dict[str, str]:
    """What a training bar shows of ``loader.metrics()``: tokens (or batches) per second and the
    share of the time the loop waited on data."""
    seconds = metrics.get("seconds", 0.0)
    out = {}
    if metrics.get("tokens"):
        out["tok_s"] = f"{metrics.get('tokens_per_s', 0.0):,.0f}"
    elif seconds:
        out["batch_s"] = f"{metrics.get('batches', 0) / seconds:,.1f}"
    out["data_wait"] = f"{metrics.get('data_wait_share', 0.0):.1%}"
    return out
