"""tidal raises the leaves of its error tree (:mod:`tidal.errors`), never the base ``TidalError``
and never a bare ``ValueError`` / ``TypeError`` for what a user causes.

The source is read with ``ast``: every ``TidalError(...)`` made and every ``raise ValueError`` /
``raise TypeError`` is a site, named by its file, the function it is in and the class. The sites
allowed are listed below, each with why; a new one fails here until it is given a leaf (or, if it
is truly internal, listed with its reason).
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import pytest

import tidal
from tidal import errors

SRC = Path(tidal.__file__).resolve().parent

Site = tuple[str, str, str]  # (file under src/tidal, enclosing function, what is raised or made)

# Internal control flow: a parser or decoder raises ValueError, and its caller inside tidal catches
# it (``data_errors()``, ``except ValueError``) and raises the leaf that names the file and the
# record (a RecordError, a FormatError), or falls back.
INTERNAL: dict[Site, tuple[int, str]] = {
    ("formats/arrow.py", "ArrowReader._batch", "ValueError"): (2, "caught in _batch: a RecordError for the batch"),
    ("formats/litdata_chunks.py", "Chunk._inflate", "ValueError"): (3, "a zstd frame: caught in read(): a RecordError"),
    ("formats/litdata_chunks.py", "Chunk._frame", "ValueError"): (1, "a zstd frame: caught in read(): a RecordError"),
    ("formats/litdata.py", "LitdataReader._leaf", "ValueError"): (1, "caught in read(): a RecordError"),
    ("formats/litdata.py", "LitdataReader._item", "ValueError"): (2, "caught in read(): a RecordError"),
    ("formats/mds.py", "_image", "ValueError"): (1, "caught in MdsReader.read(): a RecordError"),
    ("formats/mds.py", "_split_list", "ValueError"): (2, "caught in MdsReader.read(): a RecordError"),
    ("formats/mds.py", "MdsReader._value", "ValueError"): (1, "caught in MdsReader.read(): a RecordError"),
    ("formats/mds.py", "MdsReader._sample", "ValueError"): (2, "caught in MdsReader.read(): a RecordError"),
    ("formats/parquet.py", "_Stream.take", "ValueError"): (1, "caught in ParquetReader._streamed"),
    ("formats/parquet.py", "_Stream._next", "ValueError"): (1, "caught in ParquetReader._streamed"),
    ("formats/parquet.py", "ParquetReader._start", "ValueError"): (1, "caught in ParquetReader._streamed"),
    ("formats/parquet_pages.py", "_skip", "ValueError"): (2, "caught in Groups.get: no verdict on the footer"),
    ("formats/webdataset.py", "_npy", "ValueError"): (1, "caught in the reader: a RecordError for the sample"),
    ("writers/parquet.py", "infer_schema", "ValueError"): (1, "caught in convert.plan: a SchemaError"),
}

# The base, where no leaf can say what went wrong.
BASE: dict[Site, tuple[int, str]] = {
    ("sources/discover.py", "_from_rank_0", "TidalError"): (
        1,
        "rank 0's error was not a tidal error (its class is known by name only): it is re-raised on the other "
        "ranks with that name in its message; a leaf would claim a cause nobody knows",
    ),
    ("transport/pool.py", "_Failure.__init__", "TidalError"): (
        1,
        "a reader process's error that does not pickle crosses as its class name and traceback: as above",
    ),
    ("transport/rings.py", "take", "TidalError"): (
        1,
        "a bundle that arrives after its loader released the ring: tidal's own invariant, nothing a user passed",
    ),
    ("transport/rings.py", "_reused", "TidalError"): (
        1,
        "a slot reused before it was read: 'a bug in tidal: please report it'",
    ),
}

# Sites in files being changed on other branches: they may go, and none may be added.
ELSEWHERE: dict[Site, tuple[int, str]] = {
    ("jax.py", "Loader._ranks", "TidalError"): (1, "tidal.jax, changed on its own branch"),
    ("jax.py", "Loader._globalize", "TidalError"): (1, "tidal.jax, changed on its own branch"),
}


class _Sites(ast.NodeVisitor):
    """The sites of one file: every ``raise ValueError``/``raise TypeError`` and every ``TidalError(...)``."""

    def __init__(self, name: str, found: Counter[Site]):
        self.name, self.found, self.scope = name, found, []

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_AsyncFunctionDef = visit_FunctionDef
    visit_ClassDef = visit_FunctionDef

    def visit_Raise(self, node: ast.Raise) -> None:
        exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
        if isinstance(exc, ast.Name) and exc.id in ("ValueError", "TypeError"):
            self.found[(self.name, ".".join(self.scope), exc.id)] += 1
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:  # made anywhere: raised, returned or kept
        func = node.func
        called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        if called == "TidalError":
            self.found[(self.name, ".".join(self.scope), "TidalError")] += 1
        self.generic_visit(node)


def _sites() -> Counter[Site]:
    found: Counter[Site] = Counter()
    for path in sorted(SRC.rglob("*.py")):
        _Sites(path.relative_to(SRC).as_posix(), found).visit(ast.parse(path.read_text(), str(path)))
    return found


def test_the_base_and_bare_value_and_type_errors_are_raised_only_where_listed() -> None:
    found = _sites()
    listed = {site: n for site, (n, _) in (INTERNAL | BASE).items()}
    elsewhere = {site: n for site, (n, _) in ELSEWHERE.items()}
    unlisted = {site: n for site, n in found.items() if n > listed.get(site, 0) + elsewhere.get(site, 0)}
    assert not unlisted, (
        "raise a leaf of tidal.errors here (ArgumentError for an argument refused when called; FormatError, "
        "SchemaError or RecordError for data; ConfigError, StateError, StorageError...), or list the site with "
        f"its reason: {sorted(unlisted)}"
    )
    stale = {site: n for site, n in listed.items() if found[site] != n}
    assert not stale, f"listed, but the source has fewer now: update the lists: {sorted(stale)}"


def test_the_scan_sees_the_sites() -> None:
    """The scan finds what it looks for (a scan that found nothing would pass the test above)."""
    found = _sites()
    assert found[("formats/mds.py", "MdsReader._sample", "ValueError")] == 2
    assert found[("transport/rings.py", "_reused", "TidalError")] == 1


@pytest.mark.parametrize(
    ("leaf", "bases"),
    [
        (errors.SourceError, (FileNotFoundError,)),
        (errors.FormatError, (ValueError,)),
        (errors.SchemaError, (errors.FormatError, ValueError)),
        (errors.RecordError, (ValueError,)),
        (errors.StateError, (ValueError,)),
        (errors.ArgumentError, (ValueError, TypeError)),
        (errors.MissingDependency, (ImportError,)),
        (errors.ConfigError, (ValueError,)),
        (errors.StorageError, (OSError,)),
    ],
)
def test_each_leaf_is_also_the_builtin_error_its_callers_catch(leaf: type, bases: tuple[type, ...]) -> None:
    """``except ValueError`` (or TypeError, OSError...) in users' code keeps catching what it did
    when tidal raised the built-in class."""
    assert issubclass(leaf, errors.TidalError)
    for base in bases:
        assert issubclass(leaf, base)
