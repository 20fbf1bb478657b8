"""Directories written by Hugging Face ``datasets``' ``save_to_disk``, read as they are.

``Dataset.save_to_disk(DIR)`` writes the rows as Arrow IPC streams and two JSON files that
describe them, none of which holds records::

    DIR/data-00000-of-00002.arrow    the rows, in this order (``num_shards=``, ``max_shard_size=``)
    DIR/data-00001-of-00002.arrow
    DIR/state.json                   {"_data_files": [{"filename": ...}, ...], "_format_columns": ...}
    DIR/dataset_info.json            features, description, citation: not needed to read the rows

``DatasetDict.save_to_disk(DIR)`` writes one such directory per split and
``DIR/dataset_dict.json`` (``{"splits": ["train", "test"]}``).

:func:`files` recognizes a local directory of the first kind by its ``state.json`` and
``dataset_info.json`` and names its Arrow files in the order ``state.json`` lists them (the
order ``datasets.load_from_disk`` reads them in), read with tidal's Arrow reader; :func:`listed`
does the same for a remote one, from its listing and its ``state.json``. Names in
``state.json`` are plain file names in the directory: one with a separator or ``..``, or one
that is missing, is a :class:`~tidal.errors.SourceError` naming ``state.json``. Where a
saved dataset was given a format with only some columns (``ds.set_format(columns=[...])``, so
``load_from_disk`` shows only those), they are the default ``columns=``.

A ``DatasetDict`` directory holds several splits: as for a ``datasets.DatasetDict`` object
(:mod:`tidal.sources.hf_datasets`), tidal asks for one, naming them (``DIR/train``), rather than
reading the splits one after another.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
from collections.abc import Callable, Collection
from typing import Any

from tidal.errors import SourceError

STATE = "state.json"
_DATA = re.compile(r"data-\d+-of-\d+\.arrow")  # the names save_to_disk gives its files
INFO = "dataset_info.json"
SPLITS = "dataset_dict.json"
__all__ = ["files", "listed"]


def files(path: Any) -> tuple[list[str], list[str] | None] | None:  # see tidal.formats.ordered.in_order
    """``(Arrow files in order, the columns its format shows or None)`` when ``path`` is a local
    ``save_to_disk`` directory, else None (nothing is read from any other path). A
    ``DatasetDict`` directory is a SourceError naming its splits."""
    if not isinstance(path, (str, os.PathLike)):
        return None
    root = os.fspath(path)
    if "://" in root or not os.path.isdir(root):
        return None
    if os.path.isfile(os.path.join(root, SPLITS)):
        raise SourceError(_splits_message(root))
    state = os.path.join(root, STATE)
    if not (os.path.isfile(state) and os.path.isfile(os.path.join(root, INFO))):
        return None
    try:
        with open(state, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise SourceError(f"{state}: unreadable: {exc!r}") from None
    names, shown = _state(state, data)
    for name in names:
        if not os.path.isfile(os.path.join(root, name)):
            raise SourceError(f"{state}: lists {name}, which is not in {root}")
    return [os.path.join(root, name) for name in names], shown


def listed(
    root: str, names: Collection[str], read: Callable[[str], bytes | None]
) -> tuple[list[str], list[str] | None] | None:
    """:func:`files` of a directory, from its listing (``names``: the files directly in it) and
    ``read(path)`` of its ``state.json``: None where it is not a ``save_to_disk`` one. A listing
    that leaves the JSON files out (an index published by ``tidal index`` lists only data files)
    but holds ``data-NNNNN-of-NNNNN.arrow`` files has its ``state.json`` asked for."""
    if SPLITS in names:
        raise SourceError(_splits_message(root, read))
    state = posixpath.join(root, STATE)
    if STATE in names and INFO in names:
        files, shown = _state(state, read(state) or b"")
    elif STATE not in names and INFO not in names and any(_DATA.fullmatch(n) for n in names):
        found = read(state)
        if found is None:
            return None
        try:
            files, shown = _state(state, found)
        except SourceError:  # a state.json of something else
            return None
    else:
        return None
    for name in files:
        if name not in names:
            raise SourceError(f"{state}: lists {name}, which is not in {root}")
    return [posixpath.join(root, name) for name in files], shown


def _state(state: str, data: bytes) -> tuple[list[str], list[str] | None]:
    """The data files a ``state.json`` (at ``state``) lists, and the columns its format shows."""
    try:
        parsed = json.loads(data)
        names = [entry["filename"] for entry in parsed["_data_files"]]
    except (ValueError, LookupError, TypeError) as exc:
        raise SourceError(f"{state}: not the state.json of a datasets.save_to_disk directory: {exc!r}") from None
    if not names:
        raise SourceError(f"{state}: lists no data files")
    for name in names:
        if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or os.sep in name:
            raise SourceError(f"{state}: {name!r} is not a file name in its directory")
    shown = parsed.get("_format_columns")
    if shown is not None and not parsed.get("_output_all_columns", False):
        if not isinstance(shown, list) or not all(isinstance(c, str) for c in shown):
            raise SourceError(f"{state}: _format_columns is not a list of column names: {shown!r}")
        return names, shown
    return names, None


def _splits_message(root: str, read: Callable[[str], bytes | None] | None = None) -> str:
    join = os.path.join if read is None else posixpath.join
    try:
        if read is not None:
            data = read(join(root, SPLITS)) or b""
        else:
            with open(join(root, SPLITS), "rb") as f:
                data = f.read()
        splits = [str(s) for s in json.loads(data)["splits"]]
    except (OSError, ValueError, LookupError, TypeError):
        splits = [] if read is not None else sorted(d for d in os.listdir(root) if os.path.isfile(join(root, d, STATE)))
    first = splits[0] if splits else "train"
    return (
        f"{root} is a datasets.DatasetDict saved with save_to_disk: it holds the splits {', '.join(splits) or '(none)'}. "
        f"Pass one split's directory, e.g. tidal.Dataset({join(root, first)!r}), "
        "or tidal.mix() several"
    )
