"""What every peer module provides: the copies of the corpus it writes (``Copy``) and the loaders it compares
(``Peer``), each built the way its documentation shows. The harness knows loaders only through this."""

from __future__ import annotations

import argparse
import glob
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from peers.spec import Spec

DATA_VERSION = 1  # a change rebuilds every converted copy


@dataclass(frozen=True)
class Copy:
    """One copy of the corpus: a sub-directory ``fmt`` of the corpus directory, its data files (``pattern``), and
    how it is written from the generator's JSONL files, each once, in its own process. ``params``: what the copy
    depends on besides the corpus (a change rebuilds it alone); ``write(files, out, shard_mb, row_group)`` returns
    the seconds of the conversion and the tool. Both None: the generator's own output, no conversion."""

    fmt: str
    pattern: str
    params: Callable[[argparse.Namespace], dict[str, Any]] | None = None
    write: Callable[[list[str], str, float, int], dict[str, Any]] | None = None

    def files(self, root: Path | str) -> list[str]:
        """The data files of this copy under ``root``, at any depth, sorted."""
        return sorted(glob.glob(os.path.join(str(root), "**", self.pattern), recursive=True))


@dataclass(frozen=True)
class Peer:
    """One loader in the tables: the copy it reads, its loader of text batches (``{"id", "text"}`` columns) and
    of packed token rows, each built from a ``Spec`` (``spec.root`` its copy, or ``spec.url`` on the s3 server)."""

    name: str
    copy: Copy
    loader: Callable[[Spec], Any]
    tokens: Callable[[Spec], Any]
    how: str  # how it reads from the s3 server: a note under the s3 table
    resumable: bool = False  # has state_dict() and load_state_dict()


def forever(loader: Any, repeats: bool) -> Iterator[Any]:
    """Batches without end: tidal repeats by itself (``repeats``); a peer's loader is iterated again, epoch after
    epoch."""
    if repeats:
        yield from loader
        return
    while True:
        n = 0
        for batch in loader:
            n += 1
            yield batch
        if n == 0:
            raise RuntimeError("the loader yielded no batch in an epoch")
