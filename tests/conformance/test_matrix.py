"""The conformance matrix: tidal's promises checked where features meet (see docs/conformance.md).

``make test`` runs the fixed sample below: drawn cells chosen to cover every axis, and the
named cases, each the minimal cell that once showed a defect. ``make conformance CELLS=N
SEED=S`` runs N cells drawn from seeds S, S+1, ...; a failing cell prints the command that
runs it alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conformance.cells import Cell, draw
from conformance.conftest import drawn
from conformance.matrix import run_cell

pytest_plugins = ["s3_fixtures"]

# Drawn cells of the fixed sample, by seed: every format, shape, stage, errors policy, loader and
# resume at least once, the cheapest cells that do it (a few seconds each; those that start spawned
# workers or use the S3 server are marked slow: they still run in CI).
FIXED: list[int] = [
    1006, 1007, 1008, 1022, 1030, 1036, 1037, 1043, 1050, 1051, 1056, 1057, 1071, 1084, 1092,
    1098, 1103, 1104, 1113, 1122, 1129, 1131, 1147, 1148, 1150, 1174, 1176, 1186, 3408,
]  # fmt: skip

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
    # pack(eos=...) over a mixture of token files: the EOS it appends to each document was no stream's,
    # so Σ tokens/<stream> fell short of tokens by one a document
    "packed_token_files_streams_add_up_to_tokens": Cell(
        seed=4, fmt="megatron", mix="files", pack="concat", loader="torch0"
    ),
    "packed_token_files_streams_add_up_to_tokens_best_fit": Cell(
        seed=5, fmt="tokens", mix="small", pack="best_fit", loader="fork2"
    ),
    # an elastic restore of pack("concat") over a stream that is not one document per record (a filter, a
    # mixture) read the chunk in progress again from its start: Pack.used() could count documents within it
    # only when each was one record of one source; it counts them now through the locator (Locator.used)
    "elastic_pack_over_a_filter": Cell(
        seed=6,
        fmt="tokens",
        shape="large",
        filter=True,
        pack="concat",
        seq_len=32,
        batch=1,
        loader="fork2",
        resume="elastic",
        at=0.3,
    ),
    "elastic_pack_over_a_mixture": Cell(
        seed=8,
        fmt="tokens",
        shape="large",
        mix="large",
        pack="concat",
        seq_len=32,
        batch=1,
        resume="elastic",
        loader_after="fork2",
        at=0.3,
    ),
    # pack("best_fit") pulled chunk_docs (256) documents at a time whatever buffer_size: its buffer held
    # hundreds of documents, not about buffer_size sequences' worth, and an elastic restore repeated them all
    "elastic_best_fit_small_buffer": Cell(
        seed=7,
        fmt="megatron",
        shape="large",
        size=190,
        pack="best_fit",
        seq_len=32,
        loader="fork2",
        resume="elastic",
        at=0.45,
    ),
    # a chunk pulled at the end of a reader's share of an epoch holds the next epoch's first records: the
    # records used counted on from the old epoch's end (past its share), so an elastic restore read the new
    # epoch's again; packed (drawn: seed 11, continuous rows on JAX, 1 -> 2 ranks) and unbatched records
    "elastic_pack_across_an_epoch_end": Cell(
        seed=9,
        fmt="tokens",
        shape="large",
        size=159,
        epochs=2,
        pack="concat",
        seq_len=32,
        batch=1,
        resume="elastic",
        loader_after="fork2",
        at=0.83,
    ),
    "elastic_records_across_an_epoch_end": Cell(
        seed=13, shape="large", size=159, epochs=2, batch=None, resume="elastic", loader_after="fork2", at=0.55
    ),
    # set_weights restarted the readers at the last batch received: the bad records they had met reading
    # ahead reached the errors function again, and metrics()['skipped'] counted them twice
    "set_weights_reports_no_bad_record_twice": Cell(
        seed=2728,
        shape="bad",
        size=162,
        mix="bad",
        weights=(2.0, 1.0),
        set_weights=(1, (3.0, 1.0)),
        shuffle=23,
        block_size=8,
        map=True,
        batch=5,
        errors="function",
        loader="fork2",
    ),
    "set_weights_counts_no_bad_record_twice": Cell(
        seed=10, fmt="csv", mix="bad", set_weights=(4, (1.0, 2.0)), shuffle=78, batch=4, errors="skip"
    ),
    # stop="all_exhausted" reopens a stream that ended: the counters of its ended readers were dropped, so
    # metrics()['skipped'] counted only the reopened readers' bad records (drawn: seed 347, "skipped 6, calls
    # 17"); with JAX threads (or 0 workers) the reopened readers also recorded no report for set_weights
    "reopened_stream_counts_its_skipped": Cell(
        seed=17, shape="bad", size=80, mix="files", stop="all_exhausted", errors="function"
    ),
    "reopened_stream_counts_its_skipped_after_set_weights": Cell(
        seed=15,
        shape="bad",
        size=80,
        mix="files",
        stop="all_exhausted",
        set_weights=(2, (3.0, 1.0)),
        drop_last=True,
        errors="function",
        loader="jax",
    ),
}


@dataclasses.dataclass(frozen=True)
class Known:
    """A defect the matrix found that is not fixed yet: ``shows`` says which cells can show it."""

    why: str
    shows: Callable[[Cell], bool]


# Drawn cells that can show a known defect are expected to fail (not strictly: a cell may miss it);
# the named case of each is expected to fail strictly: fixed, it passes, and moves to NAMED.
KNOWN: dict[str, Known] = {}

KNOWN_CASES: dict[str, tuple[str, Cell]] = {}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "seed" not in metafunc.fixturenames:
        return
    asked = drawn(metafunc.config)
    seeds = list(range(asked[0], asked[0] + asked[1])) if asked is not None else FIXED
    metafunc.parametrize("seed", [pytest.param(s, marks=_marks(draw(s)), id=f"seed={s}") for s in seeds])


def _marks(cell: Cell) -> list[Any]:
    costly = cell.loader == "spawn2" or cell.storage == "s3" or "spawn2" in (cell.loader_after,)
    marks: list[Any] = [pytest.mark.slow] if costly else []
    known = [name for name, k in KNOWN.items() if k.shows(cell)]
    if known:
        marks.append(pytest.mark.xfail(reason="can show " + ", ".join(known), strict=False))
    return marks


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


@pytest.mark.parametrize("name", sorted(KNOWN_CASES))
def test_known_defect(name: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    defect, cell = KNOWN_CASES[name]
    request.applymarker(pytest.mark.xfail(reason=KNOWN[defect].why, strict=True))
    check(cell, tmp_path, request, f".venv/bin/python -m pytest tests/conformance -k {name}")


def test_a_cell_is_its_seed() -> None:
    """The same seed draws the same cell: a failing cell runs again from its seed alone."""
    assert draw(17) == draw(17)
    assert dataclasses.replace(draw(17), seed=18) != draw(18)
