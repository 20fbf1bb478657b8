"""A progress bar on stderr (tqdm, the ``cli`` extra), or nothing where there is no tqdm."""

from __future__ import annotations

import sys
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
