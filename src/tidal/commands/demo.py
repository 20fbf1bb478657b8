"""``tidal demo``: train a small GPT-2 on a stream, interrupt it, resume it exactly (see :mod:`tidal.demo`)."""

from __future__ import annotations

import argparse
from importlib.util import find_spec
from typing import Any

from tidal.errors import MissingDependency


def add(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "demo",
        parents=parents,
        help="train a small GPT-2 on a stream made on this machine, interrupt it, resume it exactly",
        description="Build a corpus from the docstrings of Python's standard library, train a tokenizer and a "
        "small GPT-2 on it (CPU, progress bars), save a checkpoint halfway, resume it in a new process and check "
        "that the resumed run trained on the same batches. Needs pip install 'tidal[demo]'.",
    )
    p.add_argument(
        "--dir", default="demo-data", help="where the corpus, tokenizer and checkpoints go (default demo-data)"
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    missing = [name for name in ("torch", "tokenizers", "transformers", "tqdm") if find_spec(name) is None]
    if missing:
        raise MissingDependency(f"tidal demo needs {', '.join(missing)}, not installed: pip install 'tidal[demo]'")
    from tidal.demo import main

    return main(args.dir)
