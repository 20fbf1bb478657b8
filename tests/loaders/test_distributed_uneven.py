"""Finite epochs never hang DDP: ranks whose filtered shares differ still end each pass on the same step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import make_shards
from procs import child_env, torchrun

import tidal

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).parents[1] / "distributed" / "run_uneven.py"


def test_ranks_with_uneven_filtered_shares_end_each_pass_together(tmp_path: Path) -> None:
    data = make_shards(tmp_path / "data", [40, 75, 13, 60, 52, 33, 90, 17])
    out = tmp_path / "out"
    out.mkdir()
    torchrun(SCRIPT, str(data), str(out), nproc=2, env=child_env(tmp_path / "cache"))
    results = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    ranks = [r["batches"] for r in results]
    for r in results:  # a state saved after 1 batch on rank 0 and 2 on rank 1
        assert "different numbers of batches on different ranks ({0: 1, 1: 2})" in r["refused"]
    assert len(ranks[0]) == len(ranks[1]) > 0, "the ranks ran different numbers of steps"
    for p in (0, 1):
        ids = [i for r in ranks for b in r if b[0] == p for i in b[1:]]
        assert len(ids) == len(set(ids)), f"pass {p}: a record was read twice"
    # on its own, each reader's filtered share is what the loader would yield; the ranks
    # stopped at the shorter one's end, so rank 0 (which keeps more) was cut short
    whole = tidal.Dataset(data).filter(lambda r: r["id"] % 3 != 0 or r["id"] < 120)
    assert sum(1 for _ in whole) > sum(len(b) - 1 for r in ranks for b in r if b[0] == 0)
