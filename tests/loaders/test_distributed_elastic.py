"""Elastic resume across real processes: a state saved under torchrun on 2 ranks, resumed on 3 ranks and on 1.

Each run starts ``torch.distributed.run`` (gloo, CPU, a free port) over
``tests/distributed/run_elastic.py``, which writes every batch each rank consumed (ids and the
DataLoader worker of each record) and the loader states it saved. The checks hold those
batches to what ``tidal.state.elastic`` and the README promise:

- ``loader.state_dict()`` under torch.distributed gathers every rank's state, so all ranks
  get the same dict, and its ``progress`` counts exactly the records the ranks consumed;
- restored on another topology (other world size or worker count), the ``ranks x workers``
  new readers each take an equal, consecutive part of what is left of the epoch, in position
  order: with a finite epoch, ``left // readers`` records each, so every rank yields as many
  batches and the last ``left % readers`` positions left (fewer than the readers) are not
  read; with ``repeat()`` nothing is dropped and whole epochs follow;
- together, the records consumed before the save and after the restore cover the epoch
  exactly once, apart from that remainder; this also holds for a state saved after an
  elastic restore (2 ranks -> 3 ranks -> 1 rank).

The position order of an epoch is taken from iterating the unsplit dataset in this process.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import procs
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

import tidal
from tidal.state.elastic import records_done

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).parents[1] / "distributed" / "run_elastic.py"
SIZES = [61, 17, 88, 45, 120, 9, 73, 30]  # 443 records, prime: no topology divides it
N = sum(SIZES)
KINDS = ("jsonl", "jsonl.zst", "parquet")
SHUFFLE = {"seed": 11, "block_size": 32, "shards_per_block": 2}  # many blocks per epoch, each mixing shards

FINITE = {**SHUFFLE, "batch": 4, "drop_last": False}
K = 23  # steps before the save on 2 ranks x 2 workers: odd, so the two workers stand at different offsets
J = 10  # steps before the second save, on 3 ranks x 1 worker
FOREVER = {**SHUFFLE, "repeat": "forever", "batch": 3, "drop_last": True}  # batches straddle epochs
KF = 17  # steps before the save of the infinite stream, on 2 ranks x 2 workers
END = 2 * -(-(N // 4) // FINITE["batch"])  # the last step of the epoch on 2 ranks x 2 workers, per rank


# -- data and processes ---------------------------------------------------------------------------------


def make_shards(root: Path) -> Path:
    """Shards of unequal sizes in three formats; records carry unique ids ``0 .. N``."""
    root.mkdir(parents=True)
    start = 0
    for k, n in enumerate(SIZES):
        records = [{"id": start + i, "text": f"record {start + i} of shard {k}"} for i in range(n)]
        kind = KINDS[k % len(KINDS)]
        path = root / f"part-{k:03d}.{kind}"
        if kind == "parquet":
            schema = pa.schema([("id", pa.int64()), ("text", pa.string())])
            pq.write_table(pa.Table.from_pylist(records, schema=schema), path, row_group_size=10)
        else:
            data = "".join(json.dumps(r) + "\n" for r in records).encode()
            path.write_bytes(zstandard.ZstdCompressor().compress(data) if kind.endswith(".zst") else data)
        start += n
    return root


def torchrun(root: Path, name: str, data: Path, jobs: list[dict], nproc: int) -> Path:
    """Run the jobs under ``torch.distributed.run`` with ``nproc`` ranks in a gloo group; returns the output dir."""
    out = root / name
    out.mkdir()
    config = root / f"{name}.json"
    config.write_text(json.dumps({"data": str(data), "out": str(out), "dist": True, "jobs": jobs}))
    procs.torchrun(SCRIPT, str(config), nproc=nproc, env=procs.child_env(root / "cache"))
    return out


def results(out: Path, job: str, ranks: int) -> list[list[dict]]:
    """Per rank, the batches it consumed: ``{"id": [...], "worker": [...]}``."""
    per_rank = [json.loads((out / f"{job}-rank{rank}.json").read_text()) for rank in range(ranks)]
    assert [r["rank"] for r in per_rank] == list(range(ranks))
    return [r["batches"] for r in per_rank]


def saved_state(out: Path, job: str, step: int, ranks: int) -> tuple[dict, Path]:
    """The state every rank saved after ``step`` batches: gathered over ranks, so the same on each."""
    paths = [out / f"{job}-rank{rank}-state-{step}.json" for rank in range(ranks)]
    states = [json.loads(p.read_text()) for p in paths]
    for rank, state in enumerate(states[1:], 1):
        assert state == states[0], f"{job}: rank {rank} saved another state than rank 0 after step {step}"
    state = states[0]
    assert len(state["ranks"]) == ranks and all(r is not None for r in state["ranks"]), "not every rank's state"
    assert state["progress"] is not None
    return state, paths[-1]  # resume from the last rank's file: any rank's file restores every rank


def ids(batches: list[dict]) -> list[int]:
    return [i for b in batches for i in b["id"]]


def reader_streams(per_rank: list[list[dict]], workers: int) -> list[list[int]]:
    """The records each reader (rank-major: rank x workers + worker) yielded, in the order consumed."""
    workers = max(1, workers)
    streams: list[list[int]] = [[] for _ in range(len(per_rank) * workers)]
    for rank, batches in enumerate(per_rank):
        for b in batches:
            assert len(set(b["worker"])) == 1, f"rank {rank}: a batch mixes records of several workers"
            assert 0 <= b["worker"][0] < workers, f"rank {rank}: worker {b['worker'][0]} of {workers}"
            streams[rank * workers + b["worker"][0]].extend(b["id"])
    return streams


def epoch_orders(data: Path, epochs: int) -> list[list[int]]:
    """The ids of each epoch in position order: the unsplit dataset, read in this process."""
    ds = tidal.Dataset(data).shuffle(
        SHUFFLE["seed"], block_size=SHUFFLE["block_size"], shards_per_block=SHUFFLE["shards_per_block"]
    )
    whole = [int(r["id"]) for r in ds.repeat(epochs)]
    assert len(whole) == N * epochs
    orders = [whole[e * N : (e + 1) * N] for e in range(epochs)]
    assert all(sorted(o) == list(range(N)) for o in orders)
    return orders


# -- the runs: 2 ranks save; 3 ranks and 1 rank resume ------------------------------------------------


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("elastic")
    data = make_shards(root / "data")
    orders = epoch_orders(data, 2)  # also writes the shard index before the ranks start
    a = torchrun(
        root,
        "a",
        data,
        [
            {**FINITE, "name": "finite", "workers": 2, "steps": K, "save_at": [K]},
            {**FOREVER, "name": "forever", "workers": 2, "steps": KF, "save_at": [KF]},
            {**FINITE, "name": "end", "workers": 2, "save_at": [END]},
        ],
        nproc=2,
    )
    finite, finite_file = saved_state(a, "finite", K, 2)
    forever, forever_file = saved_state(a, "forever", KF, 2)
    end, end_file = saved_state(a, "end", END, 2)
    forever_steps = {2: 2 * 46, 0: 264}  # per rank, by workers: past the rest of epoch 0 and all of epoch 1
    b = torchrun(
        root,
        "b",
        data,
        [
            {**FINITE, "name": "finite-w1", "workers": 1, "resume": str(finite_file), "save_at": [J]},
            {**FINITE, "name": "finite-w3", "workers": 3, "resume": str(finite_file)},
            {**FINITE, "name": "end-w1", "workers": 1, "resume": str(end_file)},
            {**FINITE, "name": "end-w3", "workers": 3, "resume": str(end_file)},
            {**FOREVER, "name": "forever-w2", "workers": 2, "resume": str(forever_file), "steps": forever_steps[2]},
        ],
        nproc=3,
    )
    chained, chained_file = saved_state(b, "finite-w1", J, 3)
    c = torchrun(
        root,
        "c",
        data,
        [
            {**FINITE, "name": "finite-w2", "workers": 2, "resume": str(finite_file)},
            {**FINITE, "name": "finite-w0", "workers": 0, "resume": str(finite_file)},
            {**FINITE, "name": "end-w0", "workers": 0, "resume": str(end_file)},
            {**FINITE, "name": "chained-w2", "workers": 2, "resume": str(chained_file)},
            {**FOREVER, "name": "forever-w0", "workers": 0, "resume": str(forever_file), "steps": forever_steps[0]},
        ],
        nproc=1,
    )
    return {
        "orders": orders,
        "a": a,
        "b": b,
        "c": c,
        "finite": finite,
        "forever": forever,
        "end": end,
        "chained": chained,
        "forever_steps": forever_steps,
    }


def assert_finite_rest(order: list[int], head: list[int], per_rank: list[list[dict]], workers: int, what: str) -> None:
    """The resumed readers took equal consecutive parts of what the head left, and nothing else."""
    assert len(set(head)) == len(head), f"{what}: the head read a record twice"
    done = set(head)
    left = [i for i in order if i not in done]  # what is left, in position order
    readers = len(per_rank) * max(1, workers)
    q, remainder = divmod(len(left), readers)
    assert remainder < readers
    batch = FINITE["batch"]
    per_worker = -(-q // batch)
    counts = [len(batches) for batches in per_rank]
    assert counts == [max(1, workers) * per_worker] * len(per_rank), f"{what}: batches per rank {counts}"
    for c, stream in enumerate(reader_streams(per_rank, workers)):
        assert stream == left[c * q : (c + 1) * q], (
            f"{what}: reader {c} did not read its equal part ({c * q}..{(c + 1) * q} of {len(left)} left records) "
            f"in position order; read {len(stream)} records (expected {q}), first {stream[:6]} (expected {left[c * q : c * q + 6]})"
        )
    for rank, batches in enumerate(per_rank):
        for w in range(max(1, workers)):
            sizes = [len(b["id"]) for b in batches if b["worker"][0] == w]
            assert sizes == [batch] * (q // batch) + ([q % batch] if q % batch else []), f"{what}: rank {rank} w {w}"
    seen = Counter(head + [i for batches in per_rank for i in ids(batches)])
    twice = sorted(i for i, n in seen.items() if n > 1)
    assert not twice, f"{what}: records read twice: {twice[:10]}"
    missing = [i for i in order if i not in seen]
    assert missing == left[len(left) - remainder :], (
        f"{what}: {len(missing)} records never read; expected the last {remainder} of the {len(left)} left"
    )


def test_the_state_is_gathered_over_ranks_and_counts_what_they_consumed(runs: dict) -> None:
    first = results(runs["a"], "finite", 2)
    assert [len(batches) for batches in first] == [K, K]
    head = [i for batches in first for i in ids(batches)]
    assert len(head) == len(set(head)) == 2 * K * FINITE["batch"]
    state = runs["finite"]
    assert state["topology"] == [2, 2]
    assert [r["counts"]["batches"] for r in state["ranks"]] == [K, K]
    assert [r["next_worker"] for r in state["ranks"]] == [K % 2, K % 2]
    assert records_done(state["progress"][""]) == len(head)
    assert state["sources"][""] == {"records": N, "finite": True, "epochs": 1}
    # the first topology reads from the start: each of its 4 readers a consecutive range of N // 4
    order = runs["orders"][0]
    q = N // 4
    for c, stream in enumerate(reader_streams(first, 2)):
        assert stream == order[c * q : c * q + len(stream)], f"reader {c} of the saving run"


def test_resume_on_three_ranks_one_worker(runs: dict) -> None:
    head = [i for batches in results(runs["a"], "finite", 2) for i in ids(batches)]
    resumed = results(runs["b"], "finite-w1", 3)
    assert_finite_rest(runs["orders"][0], head, resumed, 1, "3 ranks x 1 worker")


def test_resume_on_three_ranks_three_workers(runs: dict) -> None:
    head = [i for batches in results(runs["a"], "finite", 2) for i in ids(batches)]
    resumed = results(runs["b"], "finite-w3", 3)
    assert_finite_rest(runs["orders"][0], head, resumed, 3, "3 ranks x 3 workers")


@pytest.mark.parametrize("workers", [2, 0])
def test_resume_on_one_rank(runs: dict, workers: int) -> None:
    head = [i for batches in results(runs["a"], "finite", 2) for i in ids(batches)]
    resumed = results(runs["c"], f"finite-w{workers}", 1)
    assert_finite_rest(runs["orders"][0], head, resumed, workers, f"1 rank x {workers} workers")


def test_a_state_saved_after_an_elastic_resume_resumes_elastically_again(runs: dict) -> None:
    """2 ranks x 2 workers -> 3 ranks x 1 worker (saved after J steps) -> 1 rank x 2 workers."""
    head = [i for batches in results(runs["a"], "finite", 2) for i in ids(batches)]
    middle = [batches[:J] for batches in results(runs["b"], "finite-w1", 3)]
    state = runs["chained"]
    assert state["topology"] == [3, 1]
    assert state["origin"] == runs["finite"]["progress"], "the state does not carry the progress it resumed from"
    assert records_done(state["progress"][""]) == len(head) + sum(len(ids(b)) for b in middle)
    head += [i for batches in middle for i in ids(batches)]
    assert_finite_rest(runs["orders"][0], head, results(runs["c"], "chained-w2", 1), 2, "3 ranks -> 1 rank x 2")


@pytest.mark.parametrize("run,ranks,workers", [("b", 3, 2), ("c", 1, 0)])
def test_infinite_stream_resumes_elastically_without_dropping(runs: dict, run: str, ranks: int, workers: int) -> None:
    """repeat(): the new readers share all that is left of epoch 0 (nothing dropped), then whole epochs."""
    first = results(runs["a"], "forever", 2)
    assert [len(batches) for batches in first] == [KF, KF]
    head = [i for batches in first for i in ids(batches)]
    assert len(head) == len(set(head)) == 2 * KF * FOREVER["batch"]
    state = runs["forever"]
    assert state["sources"][""] == {"records": N, "finite": False, "epochs": None}
    assert records_done(state["progress"][""]) == len(head)

    order0, order1 = runs["orders"]
    done = set(head)
    left = [i for i in order0 if i not in done]
    per_rank = results(runs[run], f"forever-w{workers}", ranks)
    steps = runs["forever_steps"][workers]
    assert [len(batches) for batches in per_rank] == [steps] * ranks
    assert all(len(b["id"]) == FOREVER["batch"] for batches in per_rank for b in batches)
    readers = ranks * max(1, workers)
    rest0: list[int] = []
    for c, stream in enumerate(reader_streams(per_rank, workers)):
        a0, b0 = c * len(left) // readers, (c + 1) * len(left) // readers  # no remainder dropped
        a1, b1 = c * N // readers, (c + 1) * N // readers
        assert len(stream) >= (b0 - a0) + (b1 - a1), f"reader {c}: too few steps to check epoch 1"
        assert stream[: b0 - a0] == left[a0:b0], f"reader {c}: not its part of what epoch 0 left"
        assert stream[b0 - a0 : b0 - a0 + b1 - a1] == order1[a1:b1], f"reader {c}: not its range of epoch 1"
        rest0 += stream[: b0 - a0]
    assert sorted(head + rest0) == list(range(N)), "epoch 0 is not read exactly once"


@pytest.mark.parametrize("run,ranks,workers", [("b", 3, 1), ("b", 3, 3), ("c", 1, 0)])
def test_the_remainder_left_unread_by_the_old_topology_is_read_on_the_new_one(
    runs: dict, run: str, ranks: int, workers: int
) -> None:
    """Saved after the last batch of the epoch on 2 x 2: the N % 4 records the old readers never
    read are shared by the new ones (one each on 3 ranks x 1 worker; none on 9 readers, with no
    rank yielding a batch)."""
    first = results(runs["a"], "end", 2)
    assert [len(batches) for batches in first] == [END, END]
    head = [i for batches in first for i in ids(batches)]
    assert len(head) == N - N % 4
    assert records_done(runs["end"]["progress"][""]) == len(head)
    resumed = results(runs[run], f"end-w{workers}", ranks)
    assert_finite_rest(runs["orders"][0], head, resumed, workers, f"end -> {ranks} ranks x {workers} workers")
