"""The source stage: :class:`Read`, the shards read in epoch order, and :class:`Shuffle` and
:class:`Repeat`, the steps that set its order and its epochs.

The reading itself (a reader's share of each epoch, bad data, the remainder of a finite epoch)
is :mod:`tidal.stages.read_iterator`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

from tidal.errors import ArgumentError, ConfigError
from tidal.stages import Context, Declared, Stage
from tidal.stages.plan import DEFAULT_BLOCK_BYTES, DEFAULT_BLOCK_SIZE, DEFAULT_SHARDS_PER_BLOCK, ReadPlan
from tidal.stages.read_iterator import ReadIterator
from tidal.stages.transform import reference
from tidal.state.view import View
from tidal.storage.config import public_source


@dataclass(frozen=True, repr=False)
class Read(Stage):
    """The source: this reader's share of each epoch of the shards, block by block, in epoch order."""

    plan: ReadPlan

    def open(self, ctx: Context, position: View | None) -> ReadIterator:
        origin = (ctx.origin or {}).get(ctx.key)
        return ReadIterator(self.plan, ctx.world, position, ctx.first_epoch, origin, ctx.key, ctx.replay)

    def describe(self) -> list:
        p = self.plan
        names = [path[path.rfind("/") + 1 :] for path in p.shards.paths]  # basenames, of URLs too
        shards = list(zip(names, p.shards.rows.tolist(), strict=True))
        facts = [p.columns, p.seed, p.block_size, p.shards_per_block, p.epochs, p.options]
        if p.seed is not None and p.bounded_by_bytes():  # else the order is what it was without the bound
            facts.append({"block_bytes": p.block_bytes, "bytes": p.shards.bytes.tolist()})
        return [["Read", shards, *facts]]

    def call(self) -> str:
        p = self.plan
        text = f"Dataset({len(p.shards)} shards, {p.total} records)"
        if p.seed is not None:
            text += (
                f".shuffle(seed={p.seed}, block_size={p.block_size}, shards_per_block={p.shards_per_block}"
                f", block_bytes={p.block_bytes})"
            )
        if p.epochs != 1:
            text += f".repeat({p.epochs})"
        return text

    def sources(self, key: str = "") -> dict[str, ReadPlan]:
        return {key: self.plan}

    def epochs_per_pass(self) -> int:
        return self.plan.epochs or 0

    def with_source(self, change: Callable[[Read], Read]) -> Stage:
        return change(self)

    def records_per_item(self) -> int | None:
        return 1 if self.plan.errors == "raise" else None  # a record skipped as bad leaves a gap

    def finite(self) -> bool:
        return self.plan.epochs is not None

    def may_end_unevenly(self) -> bool:
        return self.finite() and self.plan.errors != "raise"

    def functions(self) -> list[tuple[str, Callable]]:
        errors = self.plan.errors
        return [(f"errors={getattr(errors, '__qualname__', errors)!r}", errors)] if callable(errors) else []

    def record_wise(self) -> bool:
        return True

    def to_config(self) -> dict:
        p = self.plan
        if not p.given:
            raise ConfigError(f"{self.call()}: a source built by hand, not by tidal.Dataset(...), has no config")
        src, removed = public_source(p.given["src"])
        source = {
            "src": src,
            "columns": list(p.columns) if p.columns is not None else None,
            "format": p.given["format"],
            "errors": p.errors if isinstance(p.errors, str) else reference(p.errors, "errors="),
            "format_options": dict(p.options),
            "follow_links": p.given["follow_links"],
        }
        if p.storage is not None:
            source.update(p.storage.to_config(p.shards.paths))
        if removed:  # credentials in the URL itself
            source["storage_options_removed"] = ["src", *source.get("storage_options_removed", [])]
        steps: list[dict] = []
        if p.seed is not None:
            steps.append(Shuffle(p.seed, p.block_size, p.shards_per_block, p.block_bytes).config_step())
        if p.epochs != 1:
            steps.append(Repeat(p.epochs).config_step())
        return {"source": {k: v for k, v in source.items() if v is not None and v != {}}, "steps": steps}


@dataclass(frozen=True)
class Shuffle(Declared):
    """``shuffle()``: the source's order changed to a shuffle of ``seed`` (see :meth:`tidal.Dataset.shuffle`)."""

    METHOD = "shuffle"

    seed: int
    block_size: int = DEFAULT_BLOCK_SIZE
    shards_per_block: int = DEFAULT_SHARDS_PER_BLOCK
    block_bytes: int = DEFAULT_BLOCK_BYTES

    def __post_init__(self) -> None:
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ArgumentError(f"seed must be a non-negative int, not {self.seed!r}")
        for name in ("block_size", "shards_per_block", "block_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ArgumentError(f"{name} must be an int of at least 1, not {value!r}")

    def __call__(self, read: Read) -> Read:
        return Read(replace(read.plan, **asdict(self)))


@dataclass(frozen=True)
class Repeat(Declared):
    """``repeat()``: the source read ``epochs`` times (None: forever; see :meth:`tidal.Dataset.repeat`)."""

    METHOD = "repeat"

    epochs: int | None = None

    def __post_init__(self) -> None:
        if self.epochs is not None and (not isinstance(self.epochs, int) or self.epochs < 1):
            raise ArgumentError(f"epochs must be at least 1 or None, not {self.epochs!r}")

    def __call__(self, read: Read) -> Read:
        return Read(replace(read.plan, epochs=self.epochs))
