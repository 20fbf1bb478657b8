"""Sources: what ``tidal.Dataset(src, ...)`` reads, found once per job.

:func:`resolve_source` is the one way in: it turns what a user names (a path, directory, glob,
URL or a list of them; a Hugging Face ``datasets`` object or an ``hf://`` URL) into the
dataset's shards, each file with its format, records and bytes. ``tidal.Dataset`` calls it, and
so every command that opens a dataset. Nothing here reads a record; it lists and counts.

The way down, one module each:

- :mod:`~tidal.sources.hf_datasets`: ``datasets`` objects become their files (or in-memory
  shards), ``hf://`` URLs are spelled out;
- :mod:`~tidal.sources.discover`: under ``torch.distributed``, rank 0 lists and counts a remote
  dataset for the whole job;
- :mod:`~tidal.sources.listing`: which files a source names (globs, directories, symbolic
  links, remote listings), or the index published beside them (:mod:`~tidal.sources.published`);
- :mod:`~tidal.sources.counting`: how many records each file holds, from the index file
  (:mod:`~tidal.sources.index_file`) where it is still valid, else scanned
  (:mod:`~tidal.sources.scanning`: one file's entry) or, for remote files, counted once for
  every node (:mod:`~tidal.sources.remote_counting`);
- :mod:`~tidal.sources.shards`: :class:`~tidal.Shard` and :class:`~tidal.Shards`, what comes out.

``tidal index`` (:mod:`~tidal.sources.indexing`) lists and counts a remote dataset afresh, on
local processes or Ray, and publishes its index beside it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from tidal.errors import SchemaError
from tidal.formats import Errors
from tidal.formats.agreement import agree, check_columns
from tidal.formats.ordered import in_order
from tidal.sources.discover import open_shards
from tidal.sources.hf_datasets import resolve as resolve_hf
from tidal.sources.shards import Shard, Shards
from tidal.storage.config import Storage
from tidal.storage.retry import redact_urls

__all__ = ["Resolved", "resolve_source", "storage_settings"]

Source = Any
"""What a dataset reads: a path, directory, glob or fsspec URL, a list of them, or a ``datasets`` object."""


@dataclass(frozen=True)
class Resolved:
    """A source resolved: its shards and how to read them.

    ``src``: the paths and URLs read, as plain data (a ``datasets`` object's files, ``hf://``
    URLs spelled out; ``[]`` for an in-memory table); ``format``: the format to read them as,
    where one is forced; ``columns``: the columns to read (a ``datasets`` object's, where it
    names them); ``storage``: the settings with the dataset's own cache directory; ``indexed``:
    whether the shards were listed from a published index (then checked on download);
    ``downloaded``: the bytes indexing it brought over the network in this process (files
    downloaded to count their records; 0 where an index or rank 0 had the counts).
    """

    src: Source
    shards: Shards
    format: str | None
    columns: tuple[str, ...] | None
    storage: Storage
    indexed: bool
    downloaded: int = 0


def storage_settings(
    storage: Storage | None = None,
    *,
    storage_options: dict[str, Any] | None = None,
    cache_dir: str | os.PathLike | None = None,
    cache_limit: int | str | None = None,
    index_url: str | None = None,
) -> Storage:
    """``storage`` (default: :class:`tidal.storage.Storage`'s defaults) with the fields given
    apart, as ``tidal.Dataset`` and ``tidal.index`` take them, put in; None leaves a field be.

    >>> storage_settings(storage_options={"anon": True}, cache_limit="20GB").cache_limit
    20000000000
    """
    settings = storage or Storage()
    given: dict[str, Any] = {
        "options": storage_options,
        "cache_dir": cache_dir,
        "cache_limit": cache_limit,
        "index_url": index_url,
    }
    given = {k: v for k, v in given.items() if v is not None}
    return replace(settings, **given) if given else settings


def resolve_source(
    src: Source,
    format: str | None = None,
    columns: Sequence[str] | None = None,
    errors: Errors = "raise",
    *,
    storage: Storage | None = None,
    follow_links: bool = False,
    progress: bool = False,
    options: Mapping[str, Any] | None = None,
) -> Resolved:
    """The shards of ``src``, listed (or read from the index published beside them) and counted,
    and every name in ``columns`` checked against what the files hold.

    ``errors`` is the policy for files that cannot be counted (see :class:`tidal.Dataset`);
    ``follow_links``: read what symbolic links lead to outside a directory; ``progress``: a bar
    on stderr while the files are counted; ``options``: the readers' ``format_options``, which
    decide some formats' column types (CSV's ``column_types``: :func:`tidal.formats.agreement.agree`).

    >>> resolve_source("data/web", columns=["text"]).shards.total   # records in the files
    """
    if isinstance(columns, str):
        columns = [columns]
    settings = storage or Storage()
    src, columns = in_order(src, columns)  # save_to_disk and LitData directories: their files, in their order
    src, fmt, columns, held = resolve_hf(src, format, columns)  # datasets objects: their files or table
    indexed, downloaded = False, 0
    if held is not None:  # an in-memory table's shards
        shards = Shards.of(Shard(**fields) for fields in held)
    else:
        settings, shards, indexed, downloaded = open_shards(src, fmt, errors, settings, follow_links, progress)
    try:
        shards = agree(shards, options, columns)  # one type per column over the files (tidal.formats.schemas, CSV)
    except SchemaError as exc:  # it names files: never a signed URL's query
        raise SchemaError(redact_urls(str(exc))) from None
    check_columns(shards, columns)
    return Resolved(src, shards, fmt, tuple(columns) if columns is not None else None, settings, indexed, downloaded)
