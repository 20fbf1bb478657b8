"""The lazy, chainable front of tidal.

A :class:`Dataset` is a description: a list of shards plus the stages applied to them.
Nothing is read until it is iterated. Iteration reads the topology (rank, world size,
DataLoader worker) at that moment and yields this reader's share of the data.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from tidal.errors import StateError
from tidal.formats import Errors
from tidal.shards import Shard, index, listing
from tidal.stages import StageIterator
from tidal.stages.batch import BatchIterator
from tidal.stages.mix import MixIterator, MixSpec, Schedule, spec
from tidal.stages.read import ReadIterator, ReadPlan
from tidal.stages.transform import FilterIterator, MapIterator
from tidal.storage.config import Storage
from tidal.storage.fs import is_remote
from tidal.tables import records
from tidal.world import World

Source = str | os.PathLike | Sequence[str | os.PathLike]

DEFAULT_BLOCK_SIZE = 16_384
DEFAULT_SHARDS_PER_BLOCK = 8


@dataclass(frozen=True)
class _Stage:
    """One link of the chain: how to build its iterator over an upstream one."""

    kind: str
    build: Callable[[StageIterator, dict | None], StageIterator]
    desc: tuple = ()  # what decides its output, for the fingerprint
    nested: bool = False  # its state wraps its upstream's: {"upstream": ..., ...}


class Dataset:
    """Records streamed from files, lazily, with chainable transforms.

    >>> ds = tidal.Dataset("data/**/*.jsonl.zst", columns=["text"])
    >>> for batch in ds.shuffle(seed=0).repeat(epochs=2).batch(8):
    ...     batch["text"]  # a list of 8 strings

    ``src`` is a file, a directory (searched recursively for known file endings), a glob
    (``**`` included) or a list of them. ``format`` forces a reader (``"parquet"``,
    ``"jsonl"``, ``"text"``) instead of guessing from file endings. ``errors="skip"`` drops
    malformed records and counts them instead of raising.
    """

    def __init__(
        self,
        src: Source,
        columns: Sequence[str] | None = None,
        format: str | None = None,
        errors: Errors = "raise",
        *,
        storage_options: dict[str, Any] | None = None,
        cache_dir: str | os.PathLike | None = None,
        cache_limit: int | str | None = None,
        storage: Storage | None = None,
    ):
        """Index ``src`` (URLs too: any fsspec protocol) and describe how to read it.

        Remote files are fetched into a local shard cache shared by all processes of the
        machine: ``cache_dir`` (default ``~/.cache/tidal/shards/<key of the dataset's URL>``),
        at most ``cache_limit`` bytes on disk (``"50GB"`` by default), least recently used
        shards evicted first.
        ``storage_options`` go to the fsspec filesystem (credentials, ``endpoint_url``...).
        ``storage`` (a :class:`tidal.storage.Storage`) sets everything else: timeouts,
        retries, prefetch depth; the three arguments before it override its fields.

        >>> tidal.Dataset("s3://bucket/web/*.parquet", columns=["text"], cache_limit="20GB")
        """
        if errors not in ("raise", "skip"):
            raise ValueError(f"errors must be 'raise' or 'skip', not {errors!r}")
        if isinstance(columns, str):
            columns = [columns]
        settings = storage or Storage()
        overrides: dict[str, Any] = {"options": storage_options, "cache_dir": cache_dir, "cache_limit": cache_limit}
        overrides = {k: v for k, v in overrides.items() if v is not None}
        if overrides:
            settings = replace(settings, **overrides)
        found = listing(src, settings)
        settings = settings.for_files(found)  # the default cache directory: keyed by the dataset's URL
        shards = tuple(index(list(found), format, errors, settings, found))
        self._plan = ReadPlan(
            shards=shards,
            columns=tuple(columns) if columns is not None else None,
            errors=errors,
            seed=None,
            block_size=DEFAULT_BLOCK_SIZE,
            shards_per_block=DEFAULT_SHARDS_PER_BLOCK,
            epochs=1,
            storage=settings if any(is_remote(s.path) for s in shards) else None,
        )
        self._stages: tuple[_Stage, ...] = ()
        self._mix: MixSpec | None = None
        self._resume: dict | None = None
        self._last: DatasetIterator | None = None

    # -- chaining --------------------------------------------------------------------

    def _with(self, plan: ReadPlan | None = None, stage: _Stage | None = None) -> Dataset:
        new = object.__new__(Dataset)
        new._plan = plan or self._plan
        new._stages = self._stages + ((stage,) if stage else ())
        new._mix = self._mix
        new._resume = None
        new._last = None
        return new

    def _before_batch(self, what: str) -> None:
        if any(s.kind == "batch" for s in self._stages):
            raise ValueError(f"{what}() must come before batch()")
        if self._mix is not None and what in ("shuffle", "repeat"):
            raise ValueError(f"{what}() applies to files: call it on the streams before mix()")

    def shuffle(
        self,
        seed: int,
        *,
        block_size: int = DEFAULT_BLOCK_SIZE,
        shards_per_block: int = DEFAULT_SHARDS_PER_BLOCK,
    ) -> Dataset:
        """Shuffle shards and records, differently each epoch, as a pure function of ``seed``.

        Records are permuted within blocks of ``block_size`` records (the memory bound) that
        each mix at least ``shards_per_block`` shards. Larger blocks mix more and cost more
        memory and a longer first batch after a resume.

        >>> ds.shuffle(seed=42, block_size=65_536)
        """
        self._before_batch("shuffle")
        if not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be a non-negative int, not {seed!r}")
        if block_size < 1 or shards_per_block < 1:
            raise ValueError("block_size and shards_per_block must be at least 1")
        return self._with(replace(self._plan, seed=seed, block_size=block_size, shards_per_block=shards_per_block))

    def repeat(self, epochs: int | None = None) -> Dataset:
        """Read the data ``epochs`` times (``None``: forever), reshuffled each epoch.

        >>> ds.shuffle(seed=0).repeat()        # the infinite stream step-based training wants
        """
        self._before_batch("repeat")
        if epochs is not None and epochs < 1:
            raise ValueError(f"epochs must be at least 1 or None, not {epochs}")
        return self._with(replace(self._plan, epochs=epochs))

    def map(self, fn: Callable[[Any], Any]) -> Dataset:
        """Apply ``fn`` to every record (a dict of column to value).

        >>> ds.map(lambda r: {**r, "n": len(r["text"])})
        """
        self._before_batch("map")
        return self._with(stage=_Stage("map", lambda up, _: MapIterator(up, fn)))

    def filter(self, fn: Callable[[Any], bool]) -> Dataset:
        """Keep the records for which ``fn`` is true.

        Filtering changes how many records each rank reads, so ranks may yield different
        numbers of batches in a finite epoch; infinite streams (``repeat()``) are unaffected.

        >>> ds.filter(lambda r: len(r["text"]) > 100)
        """
        self._before_batch("filter")
        return self._with(stage=_Stage("filter", lambda up, _: FilterIterator(up, fn)))

    def batch(self, size: int, drop_last: bool = True) -> Dataset:
        """Group records into dicts of columns: numpy arrays where values share a shape, else lists.

        >>> next(iter(ds.batch(8)))["id"]      # array([...]) of 8 ints
        """
        self._before_batch("batch")
        if size < 1:
            raise ValueError(f"batch size must be at least 1, not {size}")
        build = lambda up, _: BatchIterator(up, size, drop_last)  # noqa: E731
        return self._with(stage=_Stage("batch", build, (size, drop_last)))

    def tokenize(
        self,
        tokenizer: Any,
        column: str = "text",
        *,
        eos: bool | int | str = True,
        max_length: int | None = None,
    ) -> Dataset:
        """Replace the text ``column`` by ``input_ids``, a compact numpy array of token ids.

        ``tokenizer`` is a path to ``tokenizer.json`` (or its directory), a
        ``tokenizers.Tokenizer`` or a ``transformers`` tokenizer. An EOS token is appended to
        every document (``eos=True`` finds the tokenizer's; pass a token or id, or ``False``).
        No truncation unless ``max_length`` is given: packing handles long documents.

        >>> ds.tokenize("tokenizer.json").pack(2048).batch(8)
        """
        from tidal.stages.tokenize import TokenizeIterator, load

        self._before_batch("tokenize")
        tok = load(tokenizer, eos)
        build = lambda up, _: TokenizeIterator(up, tok, column, max_length)  # noqa: E731
        return self._with(stage=_Stage("tokenize", build, (column, tok.eos_id, str(tok.dtype), max_length)))

    def pack(
        self,
        seq_len: int,
        strategy: str = "concat",
        *,
        shift_labels: bool = True,
        mask_boundaries: bool = False,
        pad_id: int | None = None,
        buffer_size: int = 256,
    ) -> Dataset:
        """Pack tokenized documents into sequences of ``seq_len`` tokens for causal LM training.

        ``strategy="concat"`` joins documents and cuts every ``seq_len`` tokens (only the last
        remainder of the stream, shorter than a sequence, is dropped). ``"best_fit"`` packs a
        buffer of about ``buffer_size`` sequences' worth of documents best-fit-decreasing,
        cutting only documents longer than ``seq_len``, and pads with ``pad_id`` (default: the
        EOS id, else 0). Each sequence has ``input_ids``, ``labels``, ``position_ids`` and
        ``segment_ids``; see :mod:`tidal.stages.pack` for their exact meaning.

        >>> ds.tokenize(tok).pack(2048, "best_fit", mask_boundaries=True)
        """
        from tidal.stages.pack import BestFitPackIterator, ConcatPackIterator, PackConfig

        self._before_batch("pack")
        if not any(s.kind == "tokenize" for s in self._stages):
            raise ValueError("pack() packs token ids: call tokenize() first")
        if strategy not in ("concat", "best_fit"):
            raise ValueError(f"strategy must be 'concat' or 'best_fit', not {strategy!r}")
        if seq_len < 1 or buffer_size < 1:
            raise ValueError("seq_len and buffer_size must be at least 1")
        if pad_id is None:
            tok_desc = next(s.desc for s in reversed(self._stages) if s.kind == "tokenize")
            pad_id = tok_desc[1] if tok_desc[1] is not None else 0
        cfg = PackConfig(seq_len, strategy, shift_labels, mask_boundaries, pad_id, buffer_size)
        kind = BestFitPackIterator if strategy == "best_fit" else ConcatPackIterator
        build = lambda up, state: kind(up, cfg, state)  # noqa: E731
        return self._with(stage=_Stage("pack", build, tuple(vars(cfg).values()), nested=True))

    # -- facts -----------------------------------------------------------------------

    @property
    def shards(self) -> tuple[Shard, ...]:
        return tuple(s for p in self.sources().values() for s in p.shards)

    @property
    def num_records(self) -> int:
        """Records in one epoch of the source (of each stream, for a mixture), before any filter."""
        return sum(p.total for p in self.sources().values())

    def sources(self) -> dict[str, ReadPlan]:
        """The file sources this dataset reads, by key: ``""`` for files, ``"name/"`` for a mixed stream."""
        if self._mix is None:
            return {"": self._plan}
        return {f"{n}/{k}": p for n, d in self._mix.streams for k, p in d.sources().items()}

    def _epochs_per_pass(self) -> int:
        """Epochs one pass reads; 0 where passes do not apply (forever, or a mixture)."""
        return 0 if self._mix is not None else self._plan.epochs or 0

    @property
    def batched(self) -> bool:
        return any(s.kind == "batch" for s in self._stages)

    def fingerprint(self) -> str:
        """A short digest of everything that decides the order; a saved state carries it."""
        p = self._plan
        desc = [
            self._mix.describe() if self._mix is not None else None,
            [(os.path.basename(s.path), s.rows) for s in p.shards],
            p.columns,
            p.seed,
            p.block_size,
            p.shards_per_block,
            p.epochs,
            [(s.kind, s.desc) for s in self._stages],
        ]
        return hashlib.sha1(json.dumps(desc, default=str).encode()).hexdigest()[:16]

    # -- iteration -------------------------------------------------------------------

    def iterator(
        self,
        world: World | None = None,
        state: dict | None = None,
        first_epoch: int = 0,
        origin: dict | None = None,
    ) -> DatasetIterator:
        """An iterator over this reader's share, from ``state`` (as saved by one) or the start of
        ``first_epoch``. ``world`` defaults to the topology of the calling process."""
        return DatasetIterator(self, world or World.current(), state, first_epoch, origin)

    def __iter__(self) -> Iterator[Any]:
        it = self.iterator(state=self._resume)
        self._resume = None
        self._last = it
        return it

    # the stateful protocol of torchdata's StatefulDataLoader and HF Accelerate
    def state_dict(self) -> dict:
        """The position of the latest iterator over this dataset (or the pending resume)."""
        if self._last is not None:
            return self._last.state()
        return self._resume if self._resume is not None else {}

    def load_state_dict(self, state: dict) -> None:
        """Make the next ``iter()`` continue from ``state``."""
        self._resume = state or None
        self._last = None

    def __repr__(self) -> str:
        chain = "".join(f".{s.kind}({', '.join(map(str, s.desc))})" for s in self._stages)
        if self._mix is not None:
            return f"mix({', '.join(n for n, _ in self._mix.streams)}){chain}"
        p = self._plan
        chain = "".join(f".{s.kind}({', '.join(map(str, s.desc))})" for s in self._stages)
        shuffled = f".shuffle({p.seed})" if p.seed is not None else ""
        return f"Dataset({len(p.shards)} shards, {p.total} records){shuffled}.repeat({p.epochs}){chain}"

    def _build(
        self, world: World, state: dict | None, first_epoch: int, origin: dict | None = None, key: str = ""
    ) -> list[StageIterator]:
        """The chain of iterators, source first, each restored from its part of ``state``."""
        outputs = []  # the state of each stage's output, top first
        for s in reversed(self._stages):
            outputs.append(state)
            if s.nested and state is not None:
                state = state["upstream"]
        chain: list[StageIterator]
        if self._mix is not None:
            chain = [MixIterator(self._mix, world, state, origin)]
        else:
            chain = [ReadIterator(self._plan, world, state, first_epoch, (origin or {}).get(""), key)]
        for s, out in zip(self._stages, reversed(outputs), strict=True):
            chain.append(s.build(chain[-1], out if s.nested else None))
        return chain


def mix(
    datasets: Mapping[str, Dataset] | Sequence[Dataset],
    weights: Mapping[str, float] | Sequence[float] | Schedule | None = None,
    *,
    seed: int = 0,
    stop: str = "first_exhausted",
    choose: Mapping[str, int] | None = None,
    repeat: Mapping[str, float] | None = None,
    epoch_size: int | None = None,
) -> Dataset:
    """Several datasets as one stream, each record drawn from one of them.

    ``datasets``: a dict of named streams, or a list (named ``"0"``, ``"1"``, ...).
    ``weights``: relative proportions (dict or list), or a schedule over records drawn
    (:class:`tidal.Piecewise`, :class:`tidal.Linear`, :class:`tidal.Cosine`); default equal.
    Instead of weights, exact counts per *mixture epoch*: ``choose={"code": 10_000}``
    (records), ``repeat={"wiki": 2.0}`` (times the stream's records; streams named in
    neither take their records once), or weights with ``epoch_size``. ``stop``:
    ``"first_exhausted"``, ``"all_exhausted"`` (restart ended streams until all have ended)
    or ``"never"``. The order is a pure function of ``seed`` and the position, so it resumes
    exactly; mixing can come before or after ``tokenize``/``pack`` in each stream, and the
    mixture itself can be tokenized, packed and batched.

    >>> mixed = tidal.mix({"web": web, "code": code}, weights={"web": 0.7, "code": 0.3}, seed=0)
    """
    s = spec(datasets, weights, seed, stop, choose, repeat, epoch_size)
    first = s.streams[0][1]
    new = first._with()
    new._mix, new._stages = s, ()
    return new


class DatasetIterator(Iterator[Any]):
    """Yields items one by one; ``state()`` is the exact position after the last one yielded.

    Items are pulled from the stages in chunks; the state is the stages' position at the
    start of the current chunk plus how many of its items were yielded. Since a chunk pulled
    from a given position is always the same, that pair names the position exactly.
    """

    CHUNK = 256

    def __init__(
        self, dataset: Dataset, world: World, state: dict | None, first_epoch: int = 0, origin: dict | None = None
    ):
        self.world = world
        self._fingerprint = dataset.fingerprint()
        self._origin = (state or {}).get("origin", origin)
        upstream, skip = None, 0
        if state:
            self._check(state)
            upstream, skip = state["position"], int(state["skip"])
        self._chain = dataset._build(world, upstream, first_epoch, self._origin)
        self._stages = self._chain[-1]
        # many items per pull only where an offset within the pull maps to source records
        self._chunk_size = self.CHUNK if getattr(self._stages, "exact", False) else 1
        self._chunk: list[Any] = []
        self._at = 0
        self._chunk_state = self._stages.state()
        self._chunk_consumed = self._stages.consumed()
        self._done = False
        self.items = int(state.get("items", 0)) if state else 0
        if skip:
            self._fill()
            if skip > len(self._chunk):
                raise StateError(f"the state skips {skip} items of a chunk of {len(self._chunk)}")
            self._at = skip

    def _check(self, state: dict) -> None:
        if state.get("dataset") != self._fingerprint:
            raise StateError("this state was saved from a different dataset (other files, seed, block size or stages)")
        saved = state.get("world")
        here = [self.world.rank, self.world.world_size, self.world.worker, self.world.num_workers]
        if saved != here:
            raise StateError(f"this state was saved by reader {saved} (rank, ranks, worker, workers), not {here}")

    def _fill(self) -> None:
        self._chunk_state, self._chunk_consumed = self._stages.state(), self._stages.consumed()
        try:
            self._chunk = records(self._stages.next(self._chunk_size))
        except StopIteration:
            self._chunk, self._done = [], True
        self._at = 0

    def __next__(self) -> Any:
        if self._at >= len(self._chunk):
            if not self._done:
                self._fill()
            if not self._chunk:
                self.close()
                raise StopIteration
        item = self._chunk[self._at]
        self._at += 1
        self.items += 1
        return item

    def stats(self) -> dict:
        """Counters: items yielded, rows read, bad records skipped, tokens, padding (per stage)."""
        out = {"items": self.items}
        for stage in self._chain:
            if hasattr(stage, "stats"):
                out.update(stage.stats())
        return out

    def state(self) -> dict:
        """Small and JSON-able: restores to exactly the next item."""
        if self._at >= len(self._chunk):
            position, skip = self._stages.state(), 0
        else:
            position, skip = self._chunk_state, self._at
        state = {
            "dataset": self._fingerprint,
            "world": [self.world.rank, self.world.world_size, self.world.worker, self.world.num_workers],
            "position": position,
            "skip": skip,
            "consumed": self.consumed(),
            "items": self.items,
            "records": sum(getattr(stage, "passed", 0) for stage in self._chain),
        }
        if self._origin:
            state["origin"] = self._origin
        return state

    def consumed(self) -> dict[str, list[int]]:
        """Source records used up so far, ``{source key: [epoch, offset]}``: see :mod:`tidal.elastic`."""
        if self._at >= len(self._chunk):
            return self._stages.consumed()
        ((key, (epoch, offset)),) = self._chunk_consumed.items()  # chunks of many only in exact chains
        return {key: [epoch, offset + self._at]}

    def close(self) -> None:
        """Close the files this iterator holds open (also done at its end)."""
        self._stages.close()

    def __del__(self) -> None:
        stages = getattr(self, "_stages", None)
        if stages is not None:
            stages.close()
