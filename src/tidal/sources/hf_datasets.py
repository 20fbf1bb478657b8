"""Hugging Face ``datasets`` objects and Hub URLs as tidal sources.

``tidal.Dataset(x)`` accepts, besides paths and URLs:

- a ``datasets.Dataset`` (map-style). Arrow-backed ones are read from their Arrow cache
  files with tidal's Arrow IPC reader (memory-mapped, any row at once), projected to the
  dataset's columns. One built in memory (``Dataset.from_dict``, ``from_pandas``, ...) has no
  files: its table becomes in-memory shards (:mod:`tidal.formats.memory`) that travel with
  the chain into spawn workers and Ray tasks (each worker holds a copy). A dataset whose rows
  are a mapping over its files (``_indices``, after ``select``, ``shuffle``, ``filter``,
  ``sort``, ``train_test_split``) or whose columns were renamed or cast without writing a file
  is refused with what to do: tidal would otherwise read other rows than the dataset shows.
- a ``datasets.IterableDataset`` (streaming) backed by data files tidal reads (what
  ``load_dataset(..., streaming=True)`` gives for Parquet, JSON lines, CSV, text and Arrow
  data, on disk or on the Hub): tidal reads those files directly. One made by a generator or
  a loading script, or that applies ``map``, ``filter``, ``shuffle``, ``take``... is refused with
  what to do instead (the same steps as tidal's own ``.map()``, ``.filter()``, ``.shuffle()``).
- (a directory written by ``save_to_disk`` is a directory that lists its own files, read in
  their order before anything here: see :mod:`tidal.formats.hf_saved`.)
- ``hf://datasets/org/name[@revision][/path]`` URLs, through fsspec's ``HfFileSystem``
  (``pip install 'tidal[hf]'``); ``@~parquet`` names the Hub's Parquet conversion of a repo
  (the ``refs/convert/parquet`` branch), e.g. ``hf://datasets/org/name@~parquet/default/train``.

Nothing here imports ``datasets``: an object is recognized by the module of its type, and
read through the attributes ``datasets`` has had since 2.x (``cache_files``, ``_indices``,
``data``, ``_ex_iterable``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from tidal.errors import SourceError

PARQUET_REVISION = "refs%2Fconvert%2Fparquet"  # what ``@~parquet`` stands for in an hf:// URL
ROWS_PER_MEMORY_SHARD = 65_536

# the packaged builders of ``datasets`` whose files tidal reads, and the format it reads them as
_BUILDERS = {"parquet": "parquet", "json": "jsonl", "csv": "csv", "text": "text", "arrow": "arrow"}


def is_hf_object(src: Any) -> bool:
    """Whether ``src`` is an object of the ``datasets`` library (never imports it)."""
    return type(src).__module__.split(".")[0] == "datasets"


def hub_url(url: str) -> str:
    """``hf://`` URLs with ``@~parquet`` spelled as the branch it names; anything else unchanged.

    >>> hub_url("hf://datasets/org/web@~parquet/default/train")
    'hf://datasets/org/web@refs%2Fconvert%2Fparquet/default/train'
    """
    if url.startswith("hf://") and "@~parquet" in url:
        head, _, tail = url.partition("@~parquet")
        if tail == "" or tail.startswith("/"):
            return f"{head}@{PARQUET_REVISION}{tail}"
    return url


def resolve(
    src: Any, format: str | None, columns: Sequence[str] | None
) -> tuple[Any, str | None, Sequence[str] | None, list[Any] | None]:
    """``(source, format, columns, shards)`` for what ``tidal.Dataset`` was given: a ``datasets``
    object becomes its files (or, without files, ``shards``: the fields of each shard of its
    in-memory table, see :func:`tidal.formats.memory.shards`); hf:// URLs are spelled out;
    anything else is returned as it is, with ``shards`` None."""
    if isinstance(src, str):
        return hub_url(src), format, columns, None
    if isinstance(src, (list, tuple)):
        return [hub_url(s) if isinstance(s, str) else s for s in src], format, columns, None
    if not is_hf_object(src):
        return src, format, columns, None
    kind = type(src).__name__
    if kind == "Dataset":
        return _map_style(src, format, columns)
    if kind == "IterableDataset":
        return _streaming(src, format, columns)
    if kind in ("DatasetDict", "IterableDatasetDict"):
        raise SourceError(f"a {kind} holds several splits ({', '.join(src)}): pass one, e.g. ds['train']")
    raise SourceError(f"a datasets.{kind} is not a dataset tidal reads: pass a datasets.Dataset or IterableDataset")


def _chosen(have: Sequence[str], columns: Sequence[str] | None, what: str) -> list[str]:
    if columns is None:
        return list(have)
    missing = [c for c in columns if c not in have]
    if missing:
        raise SourceError(f"{what} has no column {missing[0]!r} (columns: {', '.join(have)})")
    return list(columns)


def _map_style(ds: Any, format: str | None, columns: Sequence[str] | None) -> tuple[Any, Any, Any, Any]:
    what = f"the datasets.Dataset {_name(ds)}"
    if getattr(ds, "_indices", None) is not None:
        raise SourceError(
            f"{what} has an indices mapping (from select, shuffle, filter, sort or train_test_split), so its rows "
            "are not its files' rows: call ds = ds.flatten_indices() first (it writes them in that order), or pass "
            "the dataset before that step and use tidal's .shuffle() / .filter()"
        )
    wanted = _chosen(list(ds.column_names), columns, what)
    files = [f["filename"] for f in ds.cache_files]
    if not files:
        from tidal.formats.memory import shards

        table = ds.data.table.select(wanted)
        return [], "memory", None, shards(table, f"<{what} in memory>", ROWS_PER_MEMORY_SHARD)
    _check_files(ds, files, wanted, what)
    return files, format or "arrow", wanted, None


def _check_files(ds: Any, files: list[str], wanted: list[str], what: str) -> None:
    """The cache files hold the dataset's rows and its columns as the dataset types them."""
    import pyarrow as pa

    rows, schema = 0, None
    for f in files:
        try:
            with pa.memory_map(f) as m:
                reader = pa.ipc.open_stream(m)
                schema = schema or reader.schema
                rows += sum(b.num_rows for b in reader)
        except (pa.ArrowException, OSError) as exc:
            raise SourceError(f"{f}: a cache file of {what} that cannot be read as Arrow: {exc}") from None
    shown = ds.data.schema
    differ = [
        c for c in wanted if schema is None or c not in schema.names or schema.field(c).type != shown.field(c).type
    ]
    if rows != len(ds) or differ:
        why = f"column {differ[0]!r}" if differ else f"{len(ds)} rows against {rows} in its files"
        raise SourceError(
            f"{what} differs from its Arrow cache files ({why}: columns renamed, cast or added, or datasets "
            "concatenated in memory, without a new file): save it with ds.save_to_disk(DIR) and read "
            "tidal.Dataset('DIR')"
        )


def _streaming(ds: Any, format: str | None, columns: Sequence[str] | None) -> tuple[Any, Any, Any, Any]:
    what = f"the datasets.IterableDataset {_name(ds)}"
    ex = ds._ex_iterable
    if type(ex).__name__ == "SelectColumnsIterable":  # select_columns(): a projection tidal does itself
        columns = _chosen(list(ex.column_names), columns, what)
        ex = ex.ex_iterable
    steps = type(ex).__name__
    if steps not in ("ArrowExamplesIterable", "ExamplesIterable"):
        raise SourceError(
            f"{what} applies {steps.replace('ExamplesIterable', '').replace('Iterable', '') or steps} to its data; "
            "tidal reads the data files themselves: pass the dataset as load_dataset(..., streaming=True) returns it "
            "and chain tidal's .map(), .filter(), .shuffle() instead"
        )
    if getattr(ds, "_distributed", None) is not None:
        raise SourceError(
            f"{what} is split by node (split_dataset_by_node): pass it whole; tidal splits over ranks itself"
        )
    fn = getattr(ex, "generate_tables_fn", None) or getattr(ex, "generate_examples_fn", None)
    builder = getattr(fn, "__self__", None)
    name = type(builder).__module__.split(".")[-1] if builder is not None else ""
    packaged = type(builder).__module__.startswith("datasets.packaged_modules.") if builder is not None else False
    if builder is None or not packaged or name not in _BUILDERS:
        made = f"the {name} builder" if builder is not None else "a generator"
        raise SourceError(
            f"{what} is made by {made}, not from data files tidal reads (Parquet, JSON lines, CSV, text, Arrow): "
            "write it out (ds.to_parquet(...), or push_to_hub and read hf://datasets/...) or use a map-style "
            "datasets.Dataset"
        )
    _check_config(builder.config, name, what)
    files = _files(ex.kwargs)
    if not files:
        raise SourceError(f"{what} names no data files")
    compound = [f for f in files if "::" in f]
    if compound:
        raise SourceError(f"{compound[0]}: a file inside an archive; tidal reads plain data files: extract the archive")
    if name == "parquet" and getattr(builder.config, "columns", None):
        columns = _chosen(list(builder.config.columns), columns, what)
    return [hub_url(f) for f in files], format or _BUILDERS[name], columns, None


def _check_config(config: Any, name: str, what: str) -> None:
    """Builder options that change what the files mean: refused rather than read differently."""
    odd: list[str] = []
    if name == "json" and getattr(config, "field", None):
        odd.append(f"field={config.field!r}")
    if name == "csv" and getattr(config, "sep", ",") not in (",", None):
        odd.append(f"sep={config.sep!r}")
    if name == "text" and getattr(config, "sample_by", "line") != "line":
        odd.append(f"sample_by={config.sample_by!r}")
    if name == "parquet" and getattr(config, "filters", None):
        odd.append("filters=...")
    if odd:
        raise SourceError(
            f"{what} reads its {name} files with {odd[0]}, which tidal does not apply: read them as files"
        )


def _files(kwargs: dict) -> list[str]:
    """The data files of a packaged builder's generator arguments (``files``, or JSON's ``original_files``)."""
    for key in ("files", "original_files", "base_files"):
        value = kwargs.get(key)
        if value:
            out: list[str] = []
            for item in value:
                if isinstance(item, (str, os.PathLike)):
                    out.append(os.fspath(item))
                else:  # datasets' FilesIterable: an iterable of paths
                    out.extend(os.fspath(p) for p in item)
            return out
    return []


def _name(ds: Any) -> str:
    info = getattr(ds, "info", None)
    name = getattr(info, "dataset_name", None) or getattr(info, "builder_name", None)
    split = getattr(ds, "split", None)
    return f"{name or '(unnamed)'}{f'[{split}]' if split else ''}"
