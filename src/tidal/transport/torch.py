"""The converter for torch: a bundle whose batches come out as tensors (views of its arrays).

Integer columns cross from a worker as narrow as their values allow and are widened to int64
as each batch is taken out; token ids become int64, which torch wants for indexing.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from tidal.transport import rings
from tidal.transport.bundles import Bundle, prepare


def widen(value: np.ndarray) -> np.ndarray:
    """Token ids as int64, which torch wants for indexing; done in the worker, not the loop."""
    if value.dtype in (np.uint16, np.uint32):
        return value.astype(np.int64)
    return np.ascontiguousarray(value)


def _tensor(value: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(widen(value))


def _numeric(value: Any) -> bool:
    return isinstance(value, np.ndarray) and value.dtype.kind in "biuf"


def _to_torch(value: Any) -> Any:
    if _numeric(value):
        return torch.from_numpy(value)
    if isinstance(value, dict):
        return {k: _to_torch(v) for k, v in value.items()}
    return value


def _narrow(value: np.ndarray) -> tuple[np.ndarray, bool]:
    """An integer column as it crosses from a worker: as few bytes as its values need, and
    whether the main process must widen it back to int64 (token ids stay uint16/uint32;
    int64 labels and positions travel as int32). Pipes, not the work, bound packed batches."""
    if value.dtype in (np.uint16, np.uint32):
        return value, True
    if value.dtype == np.int64 and value.size:
        lo, hi = value.min(), value.max()
        if lo >= -(1 << 31) and hi < (1 << 31):
            return value.astype(np.int32), True
    return value, False


def _keep(value: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(value)


class TorchBundle(Bundle):
    """A bundle whose items are tensors (views of the bundle's arrays), pinnable by torch.

    Packed for another process (``pack``), its integer columns travel narrow (:func:`_narrow`)
    and are widened to int64 as each batch is taken out in the main process. Made in the
    training process, its items hold tensors from the start."""

    def __init__(
        self,
        worker: int,
        items: list[Any],
        states: list[dict],
        end: bool,
        pack: bool,
        widen: Any,
        ring: tuple[str, int] | None = None,
    ):
        super().__init__(worker, items, states, end, pack, _keep if pack else _tensor)
        self.pack = pack
        self.ring = ring  # (segment, slots) of the shared memory its worker sends through (tidal.transport.rings); None: the pipe
        self.wide: set[str] = set()
        if self.columns is not None:
            for name, col in self.columns.items():
                if _numeric(col):
                    self.columns[name], wide = _narrow(col)
                    if wide:
                        self.wide.add(name)
        elif pack and self.items is not None:
            self.items = [prepare(i, widen) for i in self.items]

    def item(self, j: int) -> Any:
        if self.columns is not None:
            wide = self.wide
            return {
                k: (torch.from_numpy(col[j]).long() if k in wide else torch.from_numpy(col[j]))
                if _numeric(col)
                else _to_torch(col[j])
                for k, col in self.columns.items()
            }
        assert self.items is not None
        return _to_torch(self.items[j]) if self.pack else self.items[j]

    def __getstate__(self) -> dict:  # pickled in a worker: the arrays through shared memory where it can
        state = dict(self.__dict__)
        if self.columns is not None and self.ring is not None:
            moved = rings.pack_columns(self.columns, *self.ring)
            if moved is not None:
                state["columns"], state["shm"] = moved
        return state

    def __setstate__(self, state: dict) -> None:  # in the training process, as the message arrives
        packed = state.pop("shm", None)
        if packed is not None:
            state["columns"] = rings.unpack_columns(state["columns"], packed)
        self.__dict__.update(state)

    def pin_memory(self) -> TorchBundle:  # called by torch when pin_memory=True
        new = object.__new__(TorchBundle)
        new.__dict__.update(self.__dict__)
        if self.columns is not None:
            new.columns = {
                k: torch.from_numpy(v).pin_memory().numpy() if _numeric(v) else v for k, v in self.columns.items()
            }
        return new


def as_tensors(item: Any) -> Any:
    """A batch made in the training process (no worker), as torch tensors."""
    return _to_torch(prepare(item, widen))
