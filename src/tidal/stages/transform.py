"""Record-wise stages: ``map`` and ``filter``. They hold no position of their own.

Their function travels with the chain into DataLoader workers: under ``fork`` any function
does, under ``spawn`` and ``forkserver`` it must pickle (a function defined at the top level
of a module, or a ``functools.partial`` of one). :func:`name_of` makes ``repr`` readable.
In a pipeline config a function is named by its import path, ``"package.module:function"``
(:func:`reference`, :func:`resolve`).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tidal.errors import ConfigError
from tidal.stages import Context, OneToOne, StageIterator, Stateless, Step
from tidal.stages.locators import Kept, Locator
from tidal.state.view import View
from tidal.tables import Table, keep, records


def name_of(fn: Callable) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def reference(fn: Callable, what: str) -> str:
    """``"package.module:function"``, the import path that gives back ``fn``; ``what`` names the
    step in the error raised for a function that has none (a lambda, a local function, a partial)."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or "<" in qualname:
        kind = (
            "a lambda" if str(qualname).endswith("<lambda>") else "a local function" if qualname else type(fn).__name__
        )
        raise ConfigError(
            f"{what}: a config names functions by import path ('package.module:function'), and {name_of(fn)} "
            f"({kind}) has none: define it at the top level of a module"
        )
    ref = f"{module}:{qualname}"
    try:
        found = resolve(ref)
    except ConfigError:
        found = None
    if found is not fn:
        raise ConfigError(f"{what}: {ref} does not import as this function: define it at the top level of a module")
    return ref


def resolve(ref: Any) -> Callable:
    """The function an import path ``"package.module:function"`` names (``__main__`` included)."""
    module, _, name = ref.partition(":") if isinstance(ref, str) else ("", "", "")
    if not module or not name:
        raise ConfigError(f"expected an import path 'package.module:function', found {ref!r}")
    try:
        found: Any = sys.modules["__main__"] if module == "__main__" else importlib.import_module(module)
        for part in name.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"{ref!r} does not import: {exc}") from None
    if not callable(found):
        raise ConfigError(f"{ref!r} is not a function but a {type(found).__name__}")
    return found


@dataclass(frozen=True, repr=False)
class Map(OneToOne):
    METHOD = "map"

    fn: Callable[[Any], Any]

    def functions(self) -> list[tuple[str, Callable]]:
        return [(self.call(), self.fn)]

    def open(self, ctx: Context, position: View | None) -> StageIterator:
        return MapIterator(self.upstream.open(ctx, position), self.fn)

    def call(self) -> str:
        return f"map({name_of(self.fn)})"

    def config_args(self) -> dict[str, Any]:
        return {"fn": reference(self.fn, self.call())}


@dataclass(frozen=True, repr=False)
class Filter(Step):
    METHOD = "filter"

    fn: Callable[[Any], bool]

    def functions(self) -> list[tuple[str, Callable]]:
        return [(self.call(), self.fn)]

    def record_wise(self) -> bool:
        return self.upstream.record_wise()

    def open(self, ctx: Context, position: View | None) -> StageIterator:
        return FilterIterator(self.upstream.open(ctx, position), self.fn)

    def call(self) -> str:
        return f"filter({name_of(self.fn)})"

    def config_args(self) -> dict[str, Any]:
        return {"fn": reference(self.fn, self.call())}


class MapIterator(Stateless):
    def __init__(self, upstream: StageIterator, fn: Callable[[Any], Any]):
        super().__init__(upstream)
        self._fn = fn
        self.exact = upstream.exact  # one item per upstream item

    def next(self, max_items: int) -> Table:
        fn = self._fn
        return [fn(r) for r in records(self._up.next(max_items))]

    def locate(self) -> Locator:
        return self._up.locate()


class FilterIterator(Stateless):
    def __init__(self, upstream: StageIterator, fn: Callable[[Any], bool]):
        super().__init__(upstream)
        self._fn = fn
        self._mask: list[bool] | None = None  # what the last table kept of upstream's; None: all

    def next(self, max_items: int) -> Table:
        fn = self._fn
        while True:  # StopIteration from upstream ends this stage too
            table = self._up.next(max_items)
            mask = [bool(fn(r)) for r in records(table)]
            if any(mask):
                every = all(mask)
                self._mask = None if every else mask
                return table if every else keep(table, mask)

    def locate(self) -> Locator:
        up, mask = self._up.locate(), self._mask
        return up if mask is None else Kept(up, [i for i, m in enumerate(mask) if m])
