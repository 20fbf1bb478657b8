"""Checks every tidal stage passes, reusable on your own datasets and stages.

>>> from tidal.testing import assert_resumes_exactly
>>> assert_resumes_exactly(my_dataset.shuffle(seed=0).repeat(3).batch(4))
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np

from tidal.dataset import Dataset
from tidal.world import World


def same(a: Any, b: Any) -> bool:
    """Deep equality for records and batches: dicts, lists, numpy arrays, tensors, scalars."""
    if hasattr(a, "numpy") and hasattr(a, "shape"):  # a torch tensor
        a = a.numpy()
    if hasattr(b, "numpy") and hasattr(b, "shape"):
        b = b.numpy()
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        return a.shape == b.shape and a.dtype == b.dtype and bool(np.array_equal(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def assert_resumes_exactly(
    dataset: Dataset,
    world: World | None = None,
    *,
    every: int = 1,
    horizon: int | None = 8,
    limit: int = 10_000,
) -> int:
    """Save the state after every ``every``-th item, restore it (through JSON) into a fresh
    iterator, and check the next ``horizon`` items (``None``: all the rest) equal the
    uninterrupted run's. Covers epoch boundaries when the dataset repeats. Returns the
    number of items checked; stops after ``limit`` items of an infinite stream.
    """
    world = world or World()
    it = dataset.iterator(world)
    reference: list[Any] = []
    states = [json.loads(json.dumps(it.state()))]
    for item in itertools.islice(it, limit):
        reference.append(item)
        states.append(json.loads(json.dumps(it.state())))
    it.close()
    for k in range(0, len(states), every):
        resumed = dataset.iterator(world, state=states[k])
        want = reference[k:] if horizon is None else reference[k : k + horizon]
        got = list(itertools.islice(resumed, len(want)))
        resumed.close()
        assert len(got) == len(want), f"after resuming at item {k}: {len(got)} items, expected {len(want)}"
        for j, (g, w) in enumerate(zip(got, want, strict=True)):
            assert same(g, w), f"after resuming at item {k}, item {k + j} differs: {g!r} != {w!r}"
        if k == len(reference) and len(reference) < limit:
            assert not list(itertools.islice(dataset.iterator(world, state=states[k]), 1)), "resumed past the end"
    return len(reference)


def read_partitioned(dataset: Dataset, world_size: int, num_workers: int) -> list[list[list[Any]]]:
    """Every reader's items, in one process: ``out[rank][worker]`` is that reader's list."""
    out = []
    for rank in range(world_size):
        per_rank = []
        for worker in range(num_workers):
            it = dataset.iterator(World(rank, world_size, worker, num_workers))
            per_rank.append(list(it))
            it.close()
        out.append(per_rank)
    return out


def assert_partition_exact(
    dataset: Dataset,
    world_size: int,
    num_workers: int,
    key: Callable[[Any], Hashable],
) -> None:
    """Across ``world_size`` ranks x ``num_workers`` workers, each record of the unsplit
    dataset is read exactly once (apart from the documented remainder of a finite epoch,
    fewer than ranks x workers records per epoch) and every rank yields as many items."""
    whole = Counter(key(r) for r in dataset)
    parts = read_partitioned(dataset, world_size, num_workers)
    seen = Counter(key(r) for per_rank in parts for items in per_rank for r in items)
    extra = seen - whole
    assert not extra, f"records read that the unsplit dataset does not have, or read twice: {list(extra)[:5]}"
    missing = sum((whole - seen).values())
    epochs = max([p.epochs or 1 for p in dataset.sources().values()], default=1)
    assert missing < world_size * num_workers * epochs, f"{missing} records were never read"
    counts = [sum(len(items) for items in per_rank) for per_rank in parts]
    assert len(set(counts)) == 1, f"ranks yield different numbers of items: {counts}"
