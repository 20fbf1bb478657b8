"""What a directory holds that is not data: the files that document it.

A directory people point a dataset at holds more than records: a ``README.txt`` or
``LICENSE.txt`` beside Parquet files, the ``dataset_info.json`` of a Hugging Face dataset
beside its JSON lines. Read as records, their lines would be trained on, and a typo'd column
would be blamed on the README. So, in a directory searched whole (here or in a store):

- a text file *named as documentation* (:data:`DOCUMENT_NAMES`: ``README``, ``LICENSE``,
  ..., whatever follows the name: ``README.txt``, ``LICENSE-MIT.txt``) is left out where the
  directory also holds data of another format: ``README.txt`` beside ``.parquet`` files. A
  directory of text files only reads them all: by their format, a corpus's README cannot be
  told from the corpus;
- the metadata files of Hugging Face ``datasets`` (:data:`METADATA_NAMES`) are left out
  wherever other files are read;

each listing naming what it left out in one warning (logger ``tidal``). A glob, or a file
named on its own, reads exactly what it names.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import TypeVar

from tidal.formats import by_ending
from tidal.storage.retry import redact_urls

log = logging.getLogger("tidal")

DOCUMENT_NAMES = frozenset(
    {
        "readme",
        "license",
        "licence",
        "copying",
        "notice",
        "authors",
        "contributors",
        "contributing",
        "changelog",
        "citation",
        "code_of_conduct",
        "checksums",
        "md5sums",
        "sha1sums",
        "sha256sums",
        "sha512sums",
    }
)
"""Names of text files (before any ``.``, ``-`` or ``_`` part, in any case) that document a dataset."""

METADATA_NAMES = frozenset({"dataset_info.json", "dataset_infos.json", "dataset_dict.json"})
"""The JSON files ``datasets`` writes to describe a dataset: never records."""

SHOWN = 5  # documents named in the warning; the rest counted

T = TypeVar("T")


def documentation(name: str) -> bool:
    """Whether a file's name (no directory) says it documents the data: a text file named
    README, LICENSE, ... (:data:`DOCUMENT_NAMES`; ``README.txt``, ``LICENSE-MIT.txt``).

    >>> documentation("README.txt"), documentation("license_cc-by.txt"), documentation("readers.txt")
    (True, True, False)
    >>> documentation("authors.csv")  # a table of authors: data
    False
    """
    stem = name.lower().split(".", 1)[0]
    named = stem in DOCUMENT_NAMES or re.split(r"[-_ ]", stem, maxsplit=1)[0] in DOCUMENT_NAMES
    return named and by_ending(name) == "text"


def without_documents(found: Mapping[str, T]) -> dict[str, T]:
    """``found`` (the files of a directory searched whole, sorted) without the files that
    document it (see the module); those left out named in one warning. A name is looked at
    only where it may be left out (a JSON file; a text file beside data of another format), so
    a listing of a million files costs a C call or two per file."""
    text = [p for p in found if p.endswith(_TEXT)]
    metadata = {p for p in found if p.endswith(_JSON) and p[p.rfind("/") + 1 :].lower() in METADATA_NAMES}
    documents: set[str] = set()
    if len(text) + len(metadata) < len(found):  # data of another format than text: documents are not
        documents = {p for p in text if documentation(p[p.rfind("/") + 1 :])}
    left = documents | (metadata if len(metadata) < len(found) else set())
    if not left:
        return dict(found)
    root = _common_directory(list(found))
    shown = [p[len(root) + 1 :] for p in sorted(left)]
    more = f" and {len(shown) - SHOWN} more" if len(shown) > SHOWN else ""
    log.warning(
        "%s: left out %s, which document the data rather than hold its records "
        "(name a file on its own, or by a glob, to read it)",
        redact_urls(root),
        ", ".join(shown[:SHOWN]) + more,
    )
    return {p: v for p, v in found.items() if p not in left}


_TEXT = (
    *(e + c for e in (".txt", ".text") for c in ("", ".gz", ".zst", ".zstd", ".bz2")),
    ".TXT",
    ".TEXT",
)  # text files' endings, as tidal reads them
_JSON = (".json", ".JSON")


def _common_directory(paths: list[str]) -> str:
    """The directory every one of ``paths`` (local paths or URLs) is under: its messages name
    files from there."""
    first, last = min(paths), max(paths)
    n = 0
    while n < min(len(first), len(last)) and first[n] == last[n]:
        n += 1
    return first[:n].rpartition("/")[0]
