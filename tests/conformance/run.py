"""Running a cell: its loaders on its topology, as a training loop drives them.

Ranks are run one after another in this process, each with ``RANK``/``WORLD_SIZE`` set (the
topology is read when iteration starts). What every run yields is kept as plain rows
(:func:`rows_of`), with the states saved along the way and the loader's metrics, for the
checks (:mod:`conformance.checks`) to compare with what was written.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import tidal
from conformance.cells import Cell
from conformance.pipeline import ERRORS_ENV

Row = dict[str, Any]


@contextlib.contextmanager
def rank_env(rank: int, world_size: int) -> Iterator[None]:
    """``RANK``/``WORLD_SIZE`` of one rank (none set for a world of one), restored afterwards."""
    before = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE")}
    if world_size > 1:
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size))
    else:
        for k in before:
            os.environ.pop(k, None)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def errors_to(path: Path) -> Iterator[Path]:
    """The errors function of the matrix writes to ``path`` meanwhile (see conformance.pipeline)."""
    before = os.environ.get(ERRORS_ENV)
    path.touch()
    os.environ[ERRORS_ENV] = str(path)
    try:
        yield path
    finally:
        if before is None:
            os.environ.pop(ERRORS_ENV, None)
        else:
            os.environ[ERRORS_ENV] = before


class Plain:
    """No loader: the dataset iterated as it is, resumed by its stateful protocol."""

    def __init__(self, ds: tidal.Dataset):
        self.ds = ds

    def __iter__(self) -> Iterator[Any]:
        return iter(self.ds)

    def state_dict(self) -> dict:
        return self.ds.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.ds.load_state_dict(state)


def make_loader(ds: tidal.Dataset, kind: str) -> Any:
    if kind == "none":
        return Plain(ds)
    if kind == "torch0":
        return tidal.DataLoader(ds, num_workers=0)
    if kind in ("fork2", "spawn2"):
        return tidal.DataLoader(ds, num_workers=2, multiprocessing_context=kind[:-1])
    if kind in ("jax", "jax1"):
        import tidal.jax as tidal_jax  # JAX only where a cell asks for it

        return tidal_jax.Loader(ds, num_workers=1 if kind == "jax1" else 2)
    raise ValueError(kind)


def plain(value: Any) -> Any:
    """A value of a batch as plain Python: tensors, numpy and JAX arrays to lists."""
    if isinstance(value, (str, bytes, int, float, type(None))):
        return value
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "tolist"):  # numpy, torch
        return value.tolist()
    return np.asarray(value).tolist()  # a jax.Array


def rows_of(item: Any, batched: bool) -> list[Row]:
    """The rows of a batch (or the one record of an unbatched item), as plain dicts."""
    item = plain(item)
    if not batched:
        return [item]
    n = len(next(iter(item.values())))
    return [{k: v[i] for k, v in item.items()} for i in range(n)]


def jsonable(state: dict) -> dict:
    return json.loads(json.dumps(state))


@dataclass
class Pass:
    """What one loader of one rank yielded: rows per batch, states after some batches, metrics."""

    rank: int
    batches: list[list[Row]] = field(default_factory=list)
    states: dict[int, dict] = field(default_factory=dict)  # batches consumed -> state then
    end: dict | None = None  # the state once the loop stopped (after a whole pass: the next pass's start)
    metrics: dict | None = None
    error: BaseException | None = None


def drive(
    loader: Any,
    cell: Cell,
    rank: int,
    *,
    start: int = 0,
    stop: int | None = None,
    save_every: int | None = None,
) -> Pass:
    """Take batches from ``loader`` (from batch ``start`` of the rank's pass, up to ``stop``),
    as a loop does: ``set_weights`` at the cell's step, states saved every ``save_every``
    batches and at the end. An error the loop gets is kept in the pass, not raised."""
    out = Pass(rank)
    batched = cell.batch is not None
    step = start
    if save_every:
        out.states[step] = jsonable(loader.state_dict())
    it = None
    try:
        it = iter(loader)
        while stop is None or step < stop:
            if cell.set_weights and step == cell.set_weights[0]:
                loader.set_weights(dict(zip("ab", cell.set_weights[1], strict=True)))
            try:
                item = next(it)
            except StopIteration:
                break
            out.batches.append(rows_of(item, batched))
            step += 1
            if save_every and step % save_every == 0:
                out.states[step] = jsonable(loader.state_dict())
    except Exception as exc:  # what the training loop would see
        out.error = exc
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()
    if out.error is None:
        out.end = jsonable(loader.state_dict())
    if hasattr(loader, "metrics"):
        out.metrics = dict(loader.metrics())
    return out


def run_ranks(ds: tidal.Dataset, cell: Cell, kind: str, ranks: int, **kw: Any) -> list[Pass]:
    """Every rank's pass, one rank after another, each from a new loader (``states``: one per rank
    to load first)."""
    states: list[dict] | None = kw.pop("states", None)
    out = []
    for r in range(ranks):
        with rank_env(r, ranks):
            loader = make_loader(ds, kind)
            if states is not None:
                loader.load_state_dict(states[r])
            out.append(drive(loader, cell, r, **kw))
            close = getattr(loader, "close", None)
            if close is not None:
                close()
            del loader
    return out


def take(it: Iterator[Any], n: int) -> list[Any]:
    return list(itertools.islice(it, n))
