"""Directories that list their files in order: a LitData directory, a ``save_to_disk`` directory.

Their manifests (LitData's ``index.json`` ``chunks``, ``datasets``' ``state.json``) name their
files in the order their writer wrote them, which sorting names does not give
(``chunk-0-10.bin`` sorts before ``chunk-0-2.bin``): such a directory gives those files, in
that order, and not its JSON files, whether it is named itself (:func:`in_order`) or found in a
directory searched whole, here or in a store (:func:`listed_in_order`). Apart from the
registry because only the sources' listing asks it.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tidal.formats import known_ending

# Directories whose own manifest names their files in order: a module's ``files(dir)`` gives
# ``(paths in order, default columns or None)``, or None for a directory that is not one of them.
_ORDERED_DIRECTORIES = ("tidal.formats.hf_saved", "tidal.formats.litdata")


def in_order(src: Any, columns: Sequence[str] | None) -> tuple[Any, Sequence[str] | None]:
    """``(src, columns)`` with each local directory whose manifest names its files in order (a
    ``datasets`` ``save_to_disk`` directory, a LitData directory) replaced by those files, in
    that order; anything else as it is. ``columns`` is the directory's default where it has one
    and the caller named none (``src`` is that one directory)."""
    if isinstance(src, (str, os.PathLike)):
        found = _ordered(src)
        if found is None:
            return src, columns
        return found[0], columns if columns is not None else found[1]
    if isinstance(src, (list, tuple)):
        out: list[Any] = []
        for entry in src:
            found = _ordered(entry) if isinstance(entry, (str, os.PathLike)) else None
            out.extend(found[0] if found is not None else [entry])
        return out, columns
    return src, columns


def _ordered(path: str | os.PathLike) -> tuple[list[str], list[str] | None] | None:
    name = os.fspath(path)
    if "://" in name or known_ending(os.path.basename(name.rstrip("/")), exists=_nothing) or not os.path.isdir(name):
        return None  # a file's name: no stat (a list of a million files is given at times)
    for where in _ORDERED_DIRECTORIES:
        found = importlib.import_module(where).files(name)
        if found is not None:
            return found
    return None


_MAY_LIST = ("/chunk-", "/state.json\0", "/dataset_dict.json\0")  # LitData's, save_to_disk's files


def listed_in_order(found: Mapping[str, Any], read: Callable[[str], bytes | None]) -> dict[str, Any]:
    """A directory's listing (``found``: sorted paths or URLs, each with what the listing said of
    it), searched whole, as :func:`in_order` makes a directory that lists its files: every
    directory in it, at any depth, that lists its files in order in a manifest
    (``save_to_disk``'s ``state.json``, LitData's ``index.json``: ``read(path)``, None where
    there is none) gives those files in that order, where its first file sorts, and not the
    manifest's other files (``state.json``, ``dataset_info.json``); the rest is as it is. So a
    directory holding several saved datasets or LitData directories reads each as it reads on
    its own, here or in a store. A ``DatasetDict`` in it is a SourceError naming its splits."""
    joined = "\0".join(found) + "\0"
    if not any(mark in joined for mark in _MAY_LIST) and not ("/data-" in joined and ".arrow\0" in joined):
        return dict(found)  # the common case at once: a listing may hold a million files
    dirs: dict[str, set[str]] = {}
    for path in found:
        d, _, name = path.rpartition("/")
        dirs.setdefault(d, set()).add(name)
    ordered: dict[str, list[str]] = {}
    for d, names in dirs.items():
        for where in _ORDERED_DIRECTORIES:
            got = importlib.import_module(where).listed(d, names, read)
            if got is not None:
                ordered[d] = got[0]
                break
    if not ordered:
        return dict(found)
    out: dict[str, Any] = {}
    for path in found:
        d = path.rpartition("/")[0]
        files = ordered.get(d)
        if files is None:
            out[path] = found[path]
        elif files[0] not in out:  # the directory's first file: all of them, in their order
            out.update((f, found[f]) for f in files)
    return out


def _nothing(path: str) -> bool:
    return False
