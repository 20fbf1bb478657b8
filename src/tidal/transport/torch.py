"""The converter for torch: a bundle whose batches come out as tensors (views of its arrays).

Integer columns cross from a worker as narrow as their values allow and are widened to int64
as the bundle arrives in the training process; token ids become int64, which torch wants for
indexing.
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
    """An int64 column as it crosses from a worker through a pipe: as int32 where its values
    fit, and whether it was (the main process widens it back). Pipes, not the work, bound
    packed batches; through shared memory the scans and the copy would cost more than they save."""
    if value.dtype == np.int64 and value.size:
        lo, hi = value.min(), value.max()
        if lo >= -(1 << 31) and hi < (1 << 31):
            return value.astype(np.int32), True
    return value, False


def _keep(value: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(value)


class TorchBundle(Bundle):
    """A bundle whose items are tensors (views of the bundle's arrays), pinnable by torch.

    Packed for another process (``pack``), its token ids travel as they are (uint16/uint32) and,
    through a pipe, its int64 columns as int32 (:func:`_narrow`); all are widened to int64 as the
    bundle arrives in the main process (one pass, out of shared memory). Made in the training
    process, its items hold tensors from the start."""

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
        self.wide: set[str] = set()  # columns the main process widens to int64: token ids stay uint16/uint32 until then
        if self.columns is not None:
            self.wide = {k for k, v in self.columns.items() if _numeric(v) and v.dtype in (np.uint16, np.uint32)}
        elif pack and self.items is not None:
            self.items = [prepare(i, widen) for i in self.items]

    def item(self, j: int) -> Any:
        if self.columns is not None:
            return {
                k: torch.from_numpy(col[j]) if _numeric(col) else _to_torch(col[j]) for k, col in self.columns.items()
            }
        assert self.items is not None
        return _to_torch(self.items[j]) if self.pack else self.items[j]

    def __getstate__(self) -> dict:  # pickled in a worker: the arrays through shared memory where it can
        state = dict(self.__dict__)
        if self.columns is None:
            return state
        if self.ring is not None:
            moved = rings.pack_columns(self.columns, *self.ring)
            if moved is not None:
                state["columns"], state["shm"] = moved
                return state
        columns, wide = dict(self.columns), set(self.wide)  # through the pipe: int64 as int32 where it fits
        for name, col in columns.items():
            if _numeric(col) and name not in wide:
                columns[name], narrowed = _narrow(col)
                if narrowed:
                    wide.add(name)
        state["columns"], state["wide"] = columns, wide
        return state

    def __setstate__(self, state: dict) -> None:  # in the training process, as the message arrives
        packed, wide = state.pop("shm", None), state.get("wide", ())
        if packed is not None:
            state["columns"] = rings.unpack_columns(state["columns"], packed, wide)
        elif state.get("columns") is not None:
            state["columns"] = {k: v.astype(np.int64) if k in wide else v for k, v in state["columns"].items()}
        state["wide"] = set()  # int64 from here on: what pin_memory pins is what the batches are
        self.__dict__.update(state)

    def pin_memory(self) -> TorchBundle:  # called by torch when pin_memory=True
        new = object.__new__(TorchBundle)
        new.__dict__.update(self.__dict__)
        if self.columns is not None:
            new.columns = {k: _pinned(v) for k, v in self.columns.items()}
        elif self.items is not None:  # made in the training process (no worker), or not stackable
            new.items = [_pinned(i) for i in self.items]
        return new


def _pinned(value: Any) -> Any:
    """``value`` with its tensors and numeric arrays (nested dicts included) in pinned memory."""
    if isinstance(value, torch.Tensor):
        return value.pin_memory()
    if _numeric(value):
        return torch.from_numpy(value).pin_memory().numpy()
    if isinstance(value, dict):
        return {k: _pinned(v) for k, v in value.items()}
    return value


def as_tensors(item: Any) -> Any:
    """A batch made in the training process (no worker), as torch tensors."""
    return _to_torch(prepare(item, widen))


def abandon(it: Any) -> list[Any]:
    """Stop at once what torch's DataLoader iterator ``it`` started, whatever its workers are
    doing: they read for a start that no longer holds (a loader started early, then given a
    state, or iterated as other ranks). Torch's own shutdown lets each worker finish the batch it
    is making, up to 5 s each, and a worker filling its first shuffle block takes longer.
    Returns the workers killed, to be joined: a killed worker runs no more of its code, but the
    system takes 10-30 ms to free what it held, which a pass started in its place need not wait on."""
    workers = getattr(it, "_workers", None)
    if workers is None:  # no worker processes: the reader in this process stops after its batch
        close = getattr(getattr(getattr(it, "_dataset_fetcher", None), "dataset_iter", None), "close", None)
        if close is not None:
            close()
        return []
    if getattr(it, "_shutdown", True):
        return []
    needed = ("_worker_pids_set", "_workers_done_event", "_index_queues", "_worker_result_queue")
    if not all(hasattr(it, name) for name in needed):  # another torch: its own way
        it._shutdown_workers()
        return []
    if hasattr(it, "_pin_memory_thread"):  # first: it reads what the workers write, and would wait
        it._pin_memory_thread_done_event.set()  # for ever on a message a killed worker cut short
        it._worker_result_queue.put((None, None))
        it._pin_memory_thread.join()
    if it._worker_pids_set:  # torch's SIGCHLD handler would take the kills for a failure
        torch.utils.data._utils.signal_handling._remove_worker_pids(id(it))
        it._worker_pids_set = False
    it._shutdown = True  # nothing left for torch's __del__ to do
    it._workers_done_event.set()
    for worker in workers:
        worker.kill()
    for q in (*it._index_queues, it._worker_result_queue):
        q.cancel_join_thread()
        q.close()
    return list(workers)
