"""``tidal.DataLoader``: a torch DataLoader over a tidal dataset, with exact state.

Workers do not send batches one by one. Each sends *bundles* of consecutive batches (1, 2,
4, ... up to ``MAX_BUNDLE`` of them, and at most ``MAX_BUNDLE_BYTES``), with each column of
a bundle stacked into one tensor, which torch moves through shared memory. One message
per bundle instead of one per batch is what keeps workers from costing throughput.

The main process yields batches round-robin over workers (worker 0, 1, ..., again 0),
skipping workers that have finished, whatever the bundle sizes. Each batch carries its
worker's state after it, so ``state_dict()`` is exactly what the training loop consumed
however far the workers have run ahead: per worker, the position after its last consumed
batch, and which worker is next.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import torch.utils.data

from tidal.dataset import Dataset
from tidal.errors import StateError
from tidal.world import World

MAX_BUNDLE = 64
MAX_BUNDLE_BYTES = 16 << 20
STATE_VERSION = 1


def _to_tensor(value: np.ndarray) -> torch.Tensor:
    if value.dtype in (np.uint16, np.uint32):  # token ids: torch wants int64 for indexing
        value = value.astype(np.int64)
    return torch.from_numpy(np.ascontiguousarray(value))


def _convert(value: Any) -> Any:
    if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
        return _to_tensor(value)
    if isinstance(value, dict):
        return {k: _convert(v) for k, v in value.items()}
    return value


class _Bundle:
    """Consecutive items of one worker; columns stacked into one tensor where shapes agree."""

    def __init__(self, worker: int, items: list[Any], states: list[dict], end: bool):
        self.worker, self.states, self.end = worker, states, end
        self.columns: dict[str, Any] | None = None
        self.items: list[Any] | None = None
        first = items[0] if items else None
        if isinstance(first, dict) and all(isinstance(i, dict) and i.keys() == first.keys() for i in items):
            self.columns = {k: self._stack([i[k] for i in items]) for k in first}
        else:
            self.items = [_convert(i) for i in items]

    @staticmethod
    def _stack(values: list[Any]) -> Any:
        v0 = values[0]
        if (
            isinstance(v0, np.ndarray)
            and v0.dtype.kind in "biuf"
            and all(isinstance(v, np.ndarray) and v.shape == v0.shape and v.dtype == v0.dtype for v in values)
        ):
            return _to_tensor(np.stack(values))
        return [_convert(v) for v in values]

    def __len__(self) -> int:
        return len(self.states)

    def item(self, j: int) -> Any:
        if self.columns is not None:
            return {k: col[j] for k, col in self.columns.items()}
        assert self.items is not None
        return self.items[j]

    def pin_memory(self) -> _Bundle:  # called by torch when pin_memory=True
        new = object.__new__(_Bundle)
        new.__dict__.update(self.__dict__)
        if self.columns is not None:
            new.columns = {k: v.pin_memory() if isinstance(v, torch.Tensor) else v for k, v in self.columns.items()}
        return new


def _nbytes(item: Any) -> int:
    if isinstance(item, dict):
        return sum(_nbytes(v) for v in item.values())
    if isinstance(item, np.ndarray):
        return item.nbytes
    if isinstance(item, (list, tuple)):
        return sum(_nbytes(v) for v in item[:4]) * len(item) // max(1, min(4, len(item)))
    if isinstance(item, (str, bytes)):
        return len(item)
    return 8


class _WorkerStream(torch.utils.data.IterableDataset):
    """What each worker (or the main process, with no workers) iterates: bundles."""

    def __init__(self, dataset: Dataset):
        self.dataset = dataset
        self.ranks = World()
        self.states: list[dict | None] = [None]
        self.first_epoch = 0

    def __iter__(self) -> Iterator[_Bundle]:
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        world = self.ranks.with_worker(worker, workers)
        it = self.dataset.iterator(world, self.states[worker], self.first_epoch)
        size = 1
        try:
            while True:
                items: list[Any] = []
                states: list[dict] = []
                nbytes = 0
                for item in it:
                    items.append(item)
                    states.append(it.state())
                    nbytes += _nbytes(item)
                    if len(items) >= size or nbytes >= MAX_BUNDLE_BYTES:
                        break
                else:
                    yield _Bundle(worker, items, states, end=True)
                    return
                yield _Bundle(worker, items, states, end=False)
                size = min(2 * size, MAX_BUNDLE)
        finally:
            it.close()


def _identity(x: Any) -> Any:
    return x


class DataLoader(torch.utils.data.DataLoader):
    """A torch DataLoader over a tidal :class:`~tidal.Dataset`, with exact, small state.

    >>> loader = tidal.DataLoader(ds.shuffle(seed=0).repeat().batch(8), num_workers=2)
    >>> for step, batch in enumerate(loader):
    ...     if step % 1000 == 0:
    ...         json.dump(loader.state_dict(), open("data_state.json", "w"))
    >>> loader.load_state_dict(json.load(open("data_state.json")))  # in a new process

    Batches are made by the dataset (``.batch(n)``); ``batch_size=n`` here is a shortcut
    for it. Numeric numpy columns arrive as tensors (unsigned token ids as int64), other
    columns as lists. Other keyword arguments go to ``torch.utils.data.DataLoader``.
    A state restores on the same number of ranks and workers.
    """

    def __init__(self, dataset: Dataset, num_workers: int = 0, **kwargs: Any):
        if not isinstance(dataset, Dataset):
            raise TypeError(f"tidal.DataLoader takes a tidal.Dataset, not {type(dataset).__name__}")
        batch_size = kwargs.pop("batch_size", None)
        drop_last = kwargs.pop("drop_last", False)
        if batch_size is not None:
            if dataset.batched:
                raise ValueError("the dataset is already batched; drop batch_size= or the .batch() call")
            dataset = dataset.batch(batch_size, drop_last=drop_last)
        for unsupported in ("sampler", "batch_sampler", "shuffle", "collate_fn"):
            if kwargs.get(unsupported) not in (None, False):
                raise ValueError(f"{unsupported}= does not apply: tidal's dataset shuffles and batches itself")
            kwargs.pop(unsupported, None)
        self.tidal_dataset = dataset
        self._stream = _WorkerStream(dataset)
        self._workers = max(1, num_workers)
        self._state = self._fresh_state(0)
        super().__init__(self._stream, batch_size=None, num_workers=num_workers, collate_fn=_identity, **kwargs)

    def _fresh_state(self, pass_: int) -> dict:
        return {
            "version": STATE_VERSION,
            "dataset": self.tidal_dataset.fingerprint(),
            "ranks": None,
            "num_workers": self._workers,
            "pass": pass_,
            "next_worker": 0,
            "workers": [None] * self._workers,
        }

    def state_dict(self) -> dict:
        """What the training loop has consumed: small, JSON-able, restorable in a new process."""
        state = dict(self._state)
        state["workers"] = list(state["workers"])
        if state["ranks"] is None:
            ranks = World.ranks()
            state["ranks"] = [ranks.rank, ranks.world_size]
        return state

    def load_state_dict(self, state: dict) -> None:
        """Continue, at the next ``iter()``, exactly after the last batch consumed when ``state`` was saved."""
        if state.get("version") != STATE_VERSION:
            raise StateError(f"not a tidal loader state (version {state.get('version')!r})")
        if state.get("dataset") != self.tidal_dataset.fingerprint():
            raise StateError("this state was saved from a different dataset (other files, seed, block size or stages)")
        if state["num_workers"] != self._workers:
            raise StateError(
                f"this state was saved with {state['num_workers']} workers, this loader has {self._workers}"
            )
        self._state = {**state, "workers": list(state["workers"])}
        if getattr(self, "_iterator", None) is not None:  # persistent workers hold the old position
            self._iterator._shutdown_workers()  # type: ignore[union-attr]
            self._iterator = None

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        ranks = World.ranks()
        saved = self._state["ranks"]
        if saved is not None and saved != [ranks.rank, ranks.world_size]:
            here = [ranks.rank, ranks.world_size]
            raise StateError(
                f"this state was saved on rank {saved[0]} of {saved[1]}, this is rank {here[0]} of {here[1]}"
            )
        state = self._state = {**self._state, "ranks": [ranks.rank, ranks.world_size]}
        epochs = self.tidal_dataset._plan.epochs or 0
        self._stream.ranks = ranks
        self._stream.states = list(state["workers"])
        self._stream.first_epoch = state["pass"] * epochs
        if self.persistent_workers and getattr(self, "_iterator", None) is not None:
            self._iterator._shutdown_workers()  # type: ignore[union-attr]
            self._iterator = None  # the workers must start from this state
        return self._round_robin(super().__iter__(), state)

    def _round_robin(self, bundles: Iterator[_Bundle], state: dict) -> Iterator[Any]:
        n = self._workers
        queues: list[deque[tuple[_Bundle, int]]] = [deque() for _ in range(n)]
        ended = [False] * n
        w = state["next_worker"]
        while not all(ended[i] and not queues[i] for i in range(n)):
            while not queues[w] and not ended[w]:
                bundle = next(bundles)
                queues[bundle.worker].extend((bundle, j) for j in range(len(bundle)))
                ended[bundle.worker] |= bundle.end
            if queues[w]:
                bundle, j = queues[w].popleft()
                state["workers"][w] = bundle.states[j]
                state["next_worker"] = (w + 1) % n
                yield bundle.item(j)
            w = (w + 1) % n
        for _ in bundles:  # let torch see every worker finish
            pass
        self._state = self._fresh_state(state["pass"] + 1)
