"""The conformance matrix: tidal's promises checked where features meet (see docs/conformance.md).

``make test`` runs the fixed sample below: drawn cells chosen to cover every axis, and the
named cases, each the minimal cell that once showed a defect. ``make conformance CELLS=N
SEED=S`` runs N cells drawn from seeds S, S+1, ...; a failing cell prints the command that
runs it alone.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from conformance.cells import Cell, draw
from conformance.conftest import drawn
from conformance.matrix import run_cell

pytest_plugins = ["s3_fixtures"]

# Drawn cells of the fixed sample, by seed; those that start spawned workers or the S3 server
# are the costly ones (marked slow: they still run in CI).
FIXED: list[int] = []

# Named cases: the minimal cell of each defect the matrix found, fixed since.
NAMED: dict[str, Cell] = {
    # a reader restored mid-block reads its block again: it gave the errors function (and counted in
    # metrics()["skipped"]) the bad records before its position once more (text, CSV, WebDataset)
    "resume_mid_block_reports_no_bad_record_twice": Cell(
        seed=1, fmt="text", shape="bad", errors="function", loader="torch0", resume="same", at=0.1
    ),
    "resume_mid_block_reports_no_bad_record_twice_csv": Cell(
        seed=2, fmt="csv", shape="bad", errors="function", loader="none", resume="same", at=0.1
    ),
    # load_state_dict opened each reader to check its position, and a packer read its chunk there: the
    # errors function got the chunk's bad records then, and again when the loop read them; trace and
    # verify, which replay the run, gave them to it again too
    "load_state_dict_and_replays_report_no_bad_record": Cell(
        seed=3,
        fmt="jsonl",
        shape="bad",
        shuffle=0,
        tokenize=True,
        pack="concat",
        errors="function",
        loader="torch0",
        resume="same",
    ),
}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "seed" not in metafunc.fixturenames:
        return
    asked = drawn(metafunc.config)
    seeds = list(range(asked[0], asked[0] + asked[1])) if asked is not None else FIXED
    metafunc.parametrize("seed", [pytest.param(s, marks=_marks(draw(s)), id=f"seed={s}") for s in seeds])


def _marks(cell: Cell) -> list[Any]:
    costly = cell.loader == "spawn2" or cell.storage == "s3" or "spawn2" in (cell.loader_after,)
    return [pytest.mark.slow] if costly else []


def check(cell: Cell, tmp: Path, request: pytest.FixtureRequest, again: str) -> None:
    s3 = request.getfixturevalue("s3") if cell.storage == "s3" else None
    findings = run_cell(cell, tmp, s3)
    assert not findings, "\n".join([cell.describe(), *findings, f"again: {again}"])


def test_cell(seed: int, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    cell = draw(seed)
    check(cell, tmp_path, request, cell.command())


@pytest.mark.parametrize("name", sorted(NAMED))
def test_named_case(name: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    cell = NAMED[name]
    check(cell, tmp_path, request, f".venv/bin/python -m pytest tests/conformance -k {name}")


def test_a_cell_is_its_seed() -> None:
    """The same seed draws the same cell: a failing cell runs again from its seed alone."""
    assert draw(17) == draw(17)
    assert dataclasses.replace(draw(17), seed=18) != draw(18)
