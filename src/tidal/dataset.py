"""The lazy, chainable front of tidal.

A :class:`Dataset` is a description: a list of shards plus the stages applied to them.
Nothing is read until it is iterated. Iteration reads the topology (rank, world size,
DataLoader worker) at that moment and yields this reader's share of the data.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from tidal.errors import ArgumentError, needs
from tidal.formats import Errors, check_options
from tidal.formats.bad_data import check_errors
from tidal.iterator import DatasetIterator
from tidal.sources import resolve_source, storage_settings
from tidal.sources.shards import Shards
from tidal.stages import Stage, walk
from tidal.stages.batch import Batch
from tidal.stages.mix import Schedule
from tidal.stages.mix import mix as mix_stage
from tidal.stages.plan import DEFAULT_BLOCK_BYTES, DEFAULT_BLOCK_SIZE, DEFAULT_SHARDS_PER_BLOCK, Opening
from tidal.stages.read import Read, ReadPlan, Repeat, Shuffle
from tidal.stages.tokenize import Tokenize
from tidal.stages.transform import Filter, Map
from tidal.storage.config import Storage, parse_size
from tidal.storage.urls import is_remote
from tidal.world import World

Source = str | os.PathLike | Sequence[str | os.PathLike]


class Dataset:
    """Records streamed from files, lazily, with chainable transforms.

    >>> ds = tidal.Dataset("data/**/*.jsonl.zst", columns=["text"])
    >>> for batch in ds.shuffle(seed=0).repeat(epochs=2).batch(8):
    ...     batch["text"]  # a list of 8 strings

    ``src`` is a file, a directory (searched recursively for known file endings), a glob
    (``**`` included) or a list of them, or a Hugging Face ``datasets.Dataset`` or
    ``IterableDataset`` (see :mod:`tidal.sources.hf_datasets`). The format of each file is detected from its ending
    and its siblings; ``format`` forces one (see :func:`tidal.formats.formats`).
    ``format_options`` go to the readers: ``allow_pickle`` (MDS and LitData ``pkl`` columns,
    refused by default: unpickling runs code from the data), ``decode_images`` (MDS image
    columns as PIL images), ``dtype`` (headerless token ``.bin`` files; default uint16),
    ``column_types`` (CSV columns' types, declared: ``{"zip": "string"}``; see docs/formats.md).

    ``errors`` is what happens to bad data: a malformed record, a file that is truncated or
    corrupt (every compressed byte is checked: gzip and bz2 CRCs, zstd frames and
    checksums, Parquet page CRCs where written).

    - ``"raise"`` (default): a :class:`tidal.RecordError` naming the file and line or row,
      or a :class:`tidal.FormatError` naming the file and, where known, the byte offset.
    - ``"skip"``: drop it and go on; each file with bad data is logged once (logger
      ``tidal``) and ``iterator.stats()`` counts ``skipped`` records and ``bad_files``.
      A file that cannot be indexed (say, a truncated ``.jsonl.zst``) is skipped whole:
      it counts no records, since records before the damage cannot be checked (the CRC or
      checksum comes at the end); a file damaged past its index (an Arrow batch, a CSV
      segment, the 256 rows of a Parquet row group a damaged page is in) loses that part;
      a bad record only itself.
    - a function ``fn(error)``, given each such error (a ``RecordError``, or a
      ``FormatError`` for a file or part of one): return to skip it (counted as with
      ``"skip"``, not logged: the function logs if it wants to), raise to stop. Define it
      at module level so that the dataset pickles into DataLoader workers::

          def skip_records_not_files(error):
              if isinstance(error, tidal.FormatError):
                  raise error                     # a damaged file: stop and fix the data
              # a bad record: returning skips it

    No policy skips a ``columns=`` name the data does not have (a
    :class:`tidal.SchemaError`, raised at once where the files have a schema, else at the
    first block with no record holding it), a dataset none of whose files can be read,
    or a repeating reader that skipped every record of an epoch: each is an error, not an
    endless stream of nothing (in a finite pass, such a reader logs a warning).

    Symbolic links under a directory or glob are read where they point inside it; one that
    leads outside is an error naming it, unless ``follow_links=True``.
    """

    def __init__(
        self,
        src: Source,
        columns: Sequence[str] | None = None,
        format: str | None = None,
        errors: Errors = "raise",
        *,
        format_options: dict[str, Any] | None = None,
        follow_links: bool = False,
        storage_options: dict[str, Any] | None = None,
        cache_dir: str | os.PathLike | None = None,
        cache_limit: int | str | None = None,
        storage: Storage | None = None,
        index_url: str | None = None,
        progress: bool = False,
    ):
        """Index ``src`` (URLs too: any fsspec protocol) and describe how to read it.

        Remote files are fetched into a local shard cache shared by all processes of the
        machine: ``cache_dir`` (default ``~/.cache/tidal/shards/<key of the dataset's URL>``),
        at most ``cache_limit`` bytes on disk (``"50GB"`` by default), least recently used
        shards evicted first.
        ``storage_options`` go to the fsspec filesystem (credentials, ``endpoint_url``...).
        ``storage`` (a :class:`tidal.storage.Storage`) sets everything else: timeouts,
        retries, prefetch depth; the three arguments before it, and ``index_url``, override
        its fields.

        A remote directory or glob is opened from the index published beside it (``tidal
        index URL``) when there is one: one request, no listing. ``index_url`` names an index
        elsewhere (any store, or a local file): one that cannot be read is an error. Nothing is
        written where the data is unless asked (``Storage.publish_index``; see
        :mod:`tidal.sources.published`): what this job counts is kept in the shard cache.
        ``progress``: a bar on stderr while the files are indexed (tqdm, ``tidal[cli]``).

        >>> tidal.Dataset("s3://bucket/web/*.parquet", columns=["text"], cache_limit="20GB")
        """
        options = check_options(format or "", format_options)
        errors = check_errors(errors)
        if progress:  # asked for: a bar that cannot be drawn is an error, not nothing
            needs("tqdm", "Dataset(progress=True)", "cli")
        settings = storage_settings(
            storage, storage_options=storage_options, cache_dir=cache_dir, cache_limit=cache_limit, index_url=index_url
        )
        found = resolve_source(
            src,
            format,
            columns,
            errors,
            storage=settings,
            follow_links=follow_links,
            progress=progress,
            options=options,
        )
        shards = found.shards
        plan = ReadPlan(
            shards=shards,
            columns=found.columns,
            errors=errors,
            seed=None,
            block_size=DEFAULT_BLOCK_SIZE,
            shards_per_block=DEFAULT_SHARDS_PER_BLOCK,
            epochs=1,
            storage=found.storage if any(map(is_remote, shards.paths)) else None,
            options=dict(options),
            given={"src": _given(found.src), "format": format, "follow_links": follow_links},
            indexed=found.indexed,
            opening=Opening(found.downloaded),
        )
        self._init(Read(plan))

    def _init(self, stage: Stage, resume: dict | None = None, fingerprint: str | None = None) -> None:
        self._stage = stage
        self._fingerprint = fingerprint  # of the chain, which never changes: worked out once
        self._resume = resume  # a state the next iter() continues from
        self._last: DatasetIterator | None = None
        _register_with_torch()

    @classmethod
    def of(cls, stage: Stage) -> Dataset:
        """A dataset over a chain of stages built by hand."""
        new = object.__new__(cls)
        new._init(stage)
        return new

    @property
    def stage(self) -> Stage:
        """The top stage of the chain: a frozen, picklable description of the whole pipeline."""
        return self._stage

    def __getstate__(self) -> dict:  # the chain and a pending resume; never an open iterator
        return {"stage": self._stage, "resume": self._resume, "fingerprint": self._fingerprint}

    def __setstate__(self, state: dict) -> None:
        self._init(state["stage"], state["resume"], state.get("fingerprint"))

    def __repr__(self) -> str:
        return repr(self._stage)

    # -- chaining --------------------------------------------------------------------

    def _then(self, stage: Stage) -> Dataset:
        return Dataset.of(stage)

    def _before_batch(self, what: str) -> None:
        if self.batched:
            raise ArgumentError(f"{what}() must come before batch()")

    def shuffle(
        self,
        seed: int,
        *,
        block_size: int = DEFAULT_BLOCK_SIZE,
        shards_per_block: int = DEFAULT_SHARDS_PER_BLOCK,
        block_bytes: int | str = DEFAULT_BLOCK_BYTES,
    ) -> Dataset:
        """Shuffle shards and records, differently each epoch, as a pure function of ``seed``.

        Records are permuted within blocks that each mix at least ``shards_per_block`` shards
        and hold at most ``block_size`` records and ``block_bytes`` bytes of their files (as
        stored: a compressed file counts its compressed bytes, pro rata to the records taken;
        an int or a size such as ``"64MB"``).
        The two bounds are the memory bound: 16,384 tweets or 1,300 books of 100 KB. Larger
        blocks mix more and cost more memory and a longer first batch after a resume.

        >>> ds.shuffle(seed=42, block_size=65_536, block_bytes=256 << 20)
        """
        self._before_batch("shuffle")
        block_bytes = parse_size(block_bytes) if isinstance(block_bytes, str) else block_bytes
        return self._then(self._stage.with_source(Shuffle(seed, block_size, shards_per_block, block_bytes)))

    def repeat(self, epochs: int | None = None) -> Dataset:
        """Read the data ``epochs`` times (``None``: forever), reshuffled each epoch.

        >>> ds.shuffle(seed=0).repeat()        # the infinite stream step-based training wants
        """
        self._before_batch("repeat")
        return self._then(self._stage.with_source(Repeat(epochs)))

    def map(self, fn: Callable[[Any], Any]) -> Dataset:
        """Apply ``fn`` to every record (a dict of column to value).

        Under DataLoader workers started with ``spawn`` or ``forkserver``, ``fn`` must pickle:
        define it at the top level of a module (a ``lambda`` works with ``fork`` only).

        >>> ds.map(add_length)
        """
        self._before_batch("map")
        return self._then(Map(self._stage, fn))

    def filter(self, fn: Callable[[Any], bool]) -> Dataset:
        """Keep the records for which ``fn`` is true.

        Filtering changes how many records each rank reads, so ranks may yield different
        numbers of batches in a finite epoch; infinite streams (``repeat()``) are unaffected.

        >>> ds.filter(is_long)
        """
        self._before_batch("filter")
        return self._then(Filter(self._stage, fn))

    def batch(self, size: int, drop_last: bool = True, *, continuous: bool = False) -> Dataset:
        """Group records into dicts of columns: numpy arrays where values share a shape, else lists.

        ``continuous=True``: each of the ``size`` rows is a stream of its own over a disjoint
        share of the data, and row ``i`` of the next batch continues row ``i`` of this one
        (for truncated BPTT and memory-carrying models; see :mod:`tidal.stages.continuous`).

        >>> next(iter(ds.batch(8)))["id"]      # array([...]) of 8 ints
        >>> ds.tokenize(tok).pack(512).batch(8, continuous=True)
        """
        self._before_batch("batch")
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ArgumentError(f"batch size must be an int of at least 1, not {size!r}")
        if continuous:
            from tidal.stages.continuous import ContinuousBatch

            if not drop_last:
                raise ArgumentError("batch(continuous=True) keeps whole batches only: drop drop_last=False")
            return self._then(ContinuousBatch(self._stage, size))
        return self._then(Batch(self._stage, size, bool(drop_last)))

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
        from tidal.stages.tokenize import load

        self._before_batch("tokenize")
        return self._then(Tokenize(self._stage, load(tokenizer, eos), column, max_length))

    def pack(
        self,
        seq_len: int,
        strategy: str = "concat",
        *,
        shift_labels: bool = True,
        mask_boundaries: bool = False,
        pad_id: int | None = None,
        buffer_size: int = 256,
        column: str = "input_ids",
        eos: int | None = None,
        outputs: Sequence[str] = ("input_ids", "labels", "position_ids", "segment_ids"),
    ) -> Dataset:
        """Pack documents of token ids into sequences of ``seq_len`` tokens for causal LM training.

        The documents are the records' ``column`` (``input_ids``, what ``tokenize()`` makes, what
        token shards, Megatron, LitData and flat token files yield; any column of integer lists or
        arrays, e.g. a Parquet ``list<int>``). ``eos``: a token id appended to each document, for
        pre-tokenized data stored without one (``tokenize()`` appends its own).
        ``strategy="concat"`` joins documents and cuts every ``seq_len`` tokens (only the last
        remainder of the stream, shorter than a sequence, is dropped). ``"best_fit"`` packs a
        buffer of about ``buffer_size`` sequences' worth of documents best-fit-decreasing,
        cutting only documents longer than ``seq_len``, and pads with ``pad_id`` (default: the
        EOS id, else 0). Each sequence has ``input_ids``, ``labels``, ``position_ids`` and
        ``segment_ids``; see :mod:`tidal.stages.pack` for their exact meaning. ``outputs``: the
        ones to make, e.g. ``("input_ids",)`` for a loop that shifts its own labels: the others
        cost nothing then.

        >>> ds.tokenize(tok).pack(2048, "best_fit", mask_boundaries=True)
        >>> tidal.Dataset("tokens/").pack(2048)          # pre-tokenized: no tokenizer needed
        """
        from tidal.stages.pack import OUTPUTS, Pack, PackConfig

        self._before_batch("pack")
        if strategy not in ("concat", "best_fit"):
            raise ArgumentError(f"strategy must be 'concat' or 'best_fit', not {strategy!r}")
        if seq_len < 1 or buffer_size < 1:
            raise ArgumentError("seq_len and buffer_size must be at least 1")
        if pad_id is None:
            tokenizers = [t for s in walk(self._stage) if (t := s.tokenizer_used()) is not None]  # mixed streams too
            known = eos if eos is not None else tokenizers[0].eos_id if tokenizers else None
            pad_id = known if known is not None else 0
        if (
            isinstance(outputs, str)
            or not outputs
            or not set(outputs) <= set(OUTPUTS)
            or len(set(outputs)) < len(outputs)
        ):
            raise ArgumentError(f"outputs must name some of {', '.join(OUTPUTS)}, each once; got {outputs!r}")
        made = tuple(name for name in OUTPUTS if name in outputs)
        cfg = PackConfig(
            seq_len, strategy, shift_labels, mask_boundaries, pad_id, buffer_size, column=column, eos=eos, outputs=made
        )
        return self._then(Pack(self._stage, cfg))

    # -- facts -----------------------------------------------------------------------

    @property
    def shards(self) -> Shards:
        """Every file read, as a sequence of :class:`tidal.Shard` (for a mixture, each stream's in turn)."""
        return Shards.concat(p.shards for p in self.sources().values())

    @property
    def num_records(self) -> int:
        """Records in one epoch of the source (of each stream, for a mixture), before any filter."""
        return sum(p.total for p in self.sources().values())

    def sources(self) -> dict[str, ReadPlan]:
        """The file sources this dataset reads, by key: ``""`` for files, ``"name/"`` for a mixed stream."""
        return self._stage.sources()

    def epochs_per_pass(self) -> int:
        """Epochs one pass reads; 0 where passes do not apply (forever, or a mixture)."""
        return self._stage.epochs_per_pass()

    @property
    def batched(self) -> bool:
        return any(s.batch_size() is not None for s in self._stage.main_line())

    def records_per_batch(self) -> int | None:
        """How many source records every item holds, where that is fixed: plain records (1) or
        plain batches (their size, continuous rows included) read from files, mapped or
        tokenized, without filters, packing, mixing or records skipped as bad; otherwise None.
        ``tidal state skip`` is exact where it is known."""
        return self._stage.records_per_item()

    def may_end_unevenly(self) -> bool:
        """Whether readers may yield different numbers of items in a finite pass: a filter,
        packing, a mixture that stops, or records skipped as bad change the count per reader
        (see "Ranks and workers" in the README for how the DataLoader keeps ranks together)."""
        return self._stage.may_end_unevenly()

    # -- declarative configs ----------------------------------------------------------

    def to_config(self) -> dict:
        """This dataset's whole chain as plain, JSON-able data, for a JSON, YAML or TOML file
        that :meth:`from_config` builds the same dataset from (see :mod:`tidal.config`).
        Credentials are left out; functions are written by import path (a lambda cannot be).

        >>> json.dump(ds.to_config(), open("pipeline.json", "w"))
        """
        from tidal import config

        return config.describe(self._stage)

    @classmethod
    def from_config(cls, config: Mapping | str | os.PathLike) -> Dataset:
        """The dataset a config describes: a dict, or a ``.json``, ``.yaml`` or ``.toml`` file.
        Every key is checked; an unknown one is a :class:`tidal.ConfigError` that names it.

        >>> ds = tidal.Dataset.from_config("pipeline.yaml")
        """
        from tidal import config as schema

        return schema.build(schema.load(config), cls, mix)

    def fingerprint(self) -> str:
        """A short digest of everything that decides the order; a saved state carries it."""
        if self._fingerprint is None:
            text = json.dumps(self._stage.describe(), default=str)
            self._fingerprint = hashlib.sha1(text.encode()).hexdigest()[:16]
        return self._fingerprint

    # -- iteration -------------------------------------------------------------------

    def iterator(
        self,
        world: World | None = None,
        state: dict | None = None,
        first_epoch: int = 0,
        origin: dict | None = None,
        where: str = "state",
        weights: Mapping[str, float] | None = None,
    ) -> DatasetIterator:
        """An iterator over this reader's share, from ``state`` (as saved by one) or the start of
        ``first_epoch``. ``world`` defaults to the topology of the calling process; ``where``
        is how errors name ``state``. ``weights``: the mixture weights a loader set
        (``loader.set_weights``, a loader state's ``"weights"``), from the next draw on."""
        world = world or World.current()
        return DatasetIterator(self._stage, self.fingerprint(), world, state, first_epoch, origin, where, weights)

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


def _given(src: Source) -> str | list[str]:
    """``src`` as the user gave it, as plain data (what ``to_config()`` writes)."""
    return os.fspath(src) if isinstance(src, (str, os.PathLike)) else [os.fspath(s) for s in src]


def _register_with_torch() -> None:
    """Let torch (and torchdata's StatefulDataLoader) see a Dataset as the IterableDataset it is.

    torch decides how to iterate a dataset with ``isinstance(ds, IterableDataset)``; a tidal
    Dataset does not subclass it (``import tidal`` does not import torch), so it is registered
    as a virtual subclass once torch is loaded.
    """
    torch = sys.modules.get("torch")
    if torch is None or Dataset in _registered:
        return
    torch.utils.data.IterableDataset.register(Dataset)
    _registered.add(Dataset)


_registered: set[type] = set()


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
    named = list(datasets.items()) if isinstance(datasets, Mapping) else [(str(i), d) for i, d in enumerate(datasets)]
    for n, d in named:
        if not isinstance(d, Dataset):
            raise ArgumentError(f"mix(): stream {n!r} is a {type(d).__name__}, not a tidal.Dataset")
    return Dataset.of(mix_stage([(n, d.stage) for n, d in named], weights, seed, stop, choose, repeat, epoch_size))
