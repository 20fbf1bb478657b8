"""``--cells N --seed S``: run N drawn cells from seed S (``make conformance``) instead of the fixed sample."""

from __future__ import annotations

import random

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("conformance", "the conformance matrix (tests/conformance)")
    group.addoption("--cells", type=int, default=None, help="run this many cells drawn at random, not the fixed sample")
    group.addoption("--seed", type=int, default=None, help="the first cell's seed (cell k: seed + k); default: random")


def drawn(config: pytest.Config) -> tuple[int, int] | None:
    """``(first seed, cells)`` asked for on the command line, or None: the fixed sample."""
    cells = config.getoption("cells", default=None)
    if cells is None:
        return None
    seed = config.getoption("seed", default=None)
    if seed is None:  # `make conformance` always gives one: xdist's workers must all draw the same cells
        if hasattr(config, "workerinput"):
            raise pytest.UsageError("--cells with several test processes needs --seed")
        seed = config.option.seed = random.randrange(10**6)
    return seed, cells


def pytest_report_header(config: pytest.Config) -> str | None:
    asked = drawn(config)
    if asked is None:
        return None
    seed, cells = asked
    return f"conformance: {cells} cells from seed {seed} (one again: make conformance CELLS=1 SEED=<its seed>)"
