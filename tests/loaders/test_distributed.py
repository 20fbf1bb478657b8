"""tidal.DataLoader across real processes: ranks x DataLoader workers, and resuming in a new process.

Every test here starts real processes (``torch.distributed.run`` with a gloo group on CPU, or
plain processes given RANK/WORLD_SIZE) that run ``tests/distributed/run_loader.py`` over real shards
in ``tmp_path``; each rank writes every batch it consumed to JSON, and the checks below hold
those batches to what the README promises in "Ranks and workers" and "State and resumption":

- every reader (rank x worker) reads exactly ``N // (ranks x workers)`` records of a finite
  epoch, a consecutive range of the epoch's positions, so every rank yields as many batches;
- the last ``N % (ranks x workers)`` positions of each finite epoch are not read, and with
  ``drop_last=True`` each worker also drops its last incomplete batch;
- with ``repeat()`` (forever) nothing is dropped: each epoch is read exactly once;
- a loader state saved to JSON continues batch for batch in a fresh process.

The order of an epoch's positions is taken from iterating the unsplit dataset in this process.
"""

from __future__ import annotations

import gzip
import itertools
import json
from collections import Counter
from pathlib import Path

import procs
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

import tidal

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).parents[1] / "distributed" / "run_loader.py"
SIZES = [37, 23, 0, 51, 9, 30, 17]  # 167 records: 167 % 6 == 5, 167 % 4 == 3, 167 // 6 == 27 (27 % 4 == 3)
KINDS = ("jsonl", "jsonl.zst", "parquet", "jsonl.gz")  # shard 2: an empty Parquet file
SEED = 7
SHUFFLE = {"block_size": 32, "shards_per_block": 2}  # several blocks per epoch, each mixing shards

Record = tuple[int, str]


# -- data and processes ---------------------------------------------------------------------------------


def make_shards(root: Path, sizes: list[int] = SIZES) -> Path:
    """Shards in four formats whose records carry unique ids ``0 .. sum(sizes)``; JSON lines files
    also hold blank lines, which are not records."""
    root.mkdir(parents=True)
    start = 0
    for k, n in enumerate(sizes):
        records = [{"id": start + i, "text": f"record {start + i} of shard {k}"} for i in range(n)]
        kind = KINDS[k % len(KINDS)]
        path = root / f"part-{k:03d}.{kind}"
        if kind == "parquet":
            schema = pa.schema([("id", pa.int64()), ("text", pa.string())])
            pq.write_table(pa.Table.from_pylist(records, schema=schema), path, row_group_size=7)
        else:
            lines = [json.dumps(r) + ("\n\n" if i % 10 == 3 else "\n") for i, r in enumerate(records)]
            data = "".join(lines).encode()
            if kind.endswith(".zst"):
                data = zstandard.ZstdCompressor().compress(data)
            elif kind.endswith(".gz"):
                data = gzip.compress(data)
            path.write_bytes(data)
        start += n
    return root


def write_config(tmp_path: Path, name: str, data: Path, jobs: list[dict], *, dist: bool) -> tuple[Path, Path]:
    out = tmp_path / name
    out.mkdir()
    config = tmp_path / f"{name}.json"
    config.write_text(json.dumps({"data": str(data), "out": str(out), "dist": dist, "jobs": jobs}))
    return config, out


def torchrun(tmp_path: Path, name: str, data: Path, jobs: list[dict], nproc: int = 2) -> Path:
    """Run the jobs under ``torch.distributed.run`` with ``nproc`` ranks in a gloo group; returns the output dir."""
    config, out = write_config(tmp_path, name, data, jobs, dist=True)
    procs.torchrun(SCRIPT, str(config), nproc=nproc, env=procs.child_env(tmp_path / "cache"))
    return out


def plain_ranks(tmp_path: Path, name: str, data: Path, jobs: list[dict], world_size: int) -> Path:
    """Run the jobs in ``world_size`` concurrent plain processes given RANK/WORLD_SIZE by hand."""
    config, out = write_config(tmp_path, name, data, jobs, dist=False)
    procs.plain_ranks(SCRIPT, str(config), world_size=world_size, env=procs.child_env(tmp_path / "cache"))
    return out


def single(tmp_path: Path, name: str, data: Path, jobs: list[dict]) -> Path:
    """Run the jobs in one fresh plain process (no ranks)."""
    config, out = write_config(tmp_path, name, data, jobs, dist=False)
    procs.single(SCRIPT, str(config), env=procs.child_env(tmp_path / "cache"))
    return out


def results(out: Path, job: str, ranks: int) -> list[dict]:
    return [json.loads((out / f"{job}-rank{rank}.json").read_text()) for rank in range(ranks)]


def reference_epochs(data: Path, epochs: int) -> list[list[Record]]:
    """The records of each epoch in position order: the unsplit dataset, read in this process."""
    ds = tidal.Dataset(data).shuffle(SEED, **SHUFFLE).repeat(epochs)
    whole = [(int(r["id"]), r["text"]) for r in ds]
    n = sum(SIZES)
    assert len(whole) == n * epochs
    return [whole[e * n : (e + 1) * n] for e in range(epochs)]


def reader_streams(result: dict) -> dict[int, list[Record]]:
    """One rank's records, split by the DataLoader worker that read them, in the order consumed."""
    streams: dict[int, list[Record]] = {}
    for batch in result["batches"]:
        assert len(set(batch["worker"])) == 1, f"a batch mixes records of several workers: {batch['worker']}"
        assert len(batch["id"]) == len(batch["text"]) == len(batch["worker"])
        streams.setdefault(batch["worker"][0], []).extend(zip(batch["id"], batch["text"], strict=True))
    return streams


def worker_batch_sizes(result: dict) -> dict[int, list[int]]:
    sizes: dict[int, list[int]] = {}
    for batch in result["batches"]:
        sizes.setdefault(batch["worker"][0], []).append(len(batch["id"]))
    return sizes


# -- what the README promises for finite epochs ----------------------------------------------------------


FINITE_JOBS = [
    {"name": "keep-last", "seed": SEED, **SHUFFLE, "batch": 4, "drop_last": False, "workers": 3},
    {"name": "drop-last", "seed": SEED, **SHUFFLE, "batch": 4, "drop_last": True, "workers": 3},
    {"name": "two-epochs", "seed": SEED, **SHUFFLE, "repeat": 2, "batch": 4, "drop_last": False, "workers": 3},
    {"name": "no-workers", "seed": SEED, **SHUFFLE, "batch": 5, "drop_last": False, "workers": 0},
]


def assert_finite_partition(
    per_rank: list[dict], ref_epochs: list[list[Record]], workers: int, batch: int, drop_last: bool
) -> None:
    ranks, epochs = len(per_rank), len(ref_epochs)
    tags = list(range(workers)) if workers else [-1]  # -1: read in the main process (num_workers=0)
    workers = max(1, workers)
    n = len(ref_epochs[0])
    readers = ranks * workers
    q, remainder = divmod(n, readers)
    per_reader = epochs * q  # README: every reader reads exactly N // (ranks x workers) records per epoch
    kept = per_reader - per_reader % batch if drop_last else per_reader  # drop_last: the last incomplete batch
    batches_per_worker = -(-kept // batch)

    counts = [len(r["batches"]) for r in per_rank]
    assert counts == [workers * batches_per_worker] * ranks, f"batches per rank: {counts}"

    position = [{rec: i for i, rec in enumerate(ref)} for ref in ref_epochs]
    seen: list[Counter[int]] = [Counter() for _ in range(epochs)]
    for rank, result in enumerate(per_rank):
        streams = reader_streams(result)
        assert sorted(streams) == tags, f"rank {rank}: batches came from workers {sorted(streams)}"
        for w, sizes in worker_batch_sizes(result).items():
            want = [batch] * (kept // batch) + ([kept % batch] if kept % batch else [])
            assert sizes == want, f"rank {rank} worker {w}: batch sizes {sizes}, expected {want}"
        for w, records in streams.items():
            assert len(records) == kept, f"rank {rank} worker {w} read {len(records)} records, expected {kept}"
            for e in range(epochs):
                part = records[e * q : (e + 1) * q]
                assert part, f"rank {rank} worker {w} read nothing of epoch {e}"
                assert part[0] in position[e], f"rank {rank} worker {w}: {part[0]} is not a record of epoch {e}"
                start = position[e][part[0]]
                # a consecutive range of the epoch's positions, read in position order
                assert part == ref_epochs[e][start : start + len(part)], (
                    f"rank {rank} worker {w}: epoch {e} is not a consecutive range of the epoch's order"
                )
                seen[e].update(i for i, _ in part)

    for e in range(epochs):
        twice = sorted(i for i, c in seen[e].items() if c > 1)
        assert not twice, f"epoch {e}: ids read more than once: {twice[:10]}"
        missing = {i for i, _ in ref_epochs[e]} - set(seen[e])
        if not drop_last:
            # README: the last N % (ranks x workers) positions of each epoch are not read
            assert missing == {i for i, _ in ref_epochs[e][n - remainder :]}, (
                f"epoch {e}: {len(missing)} records unread, expected the last {remainder} positions"
            )
        else:
            read = min(q, max(0, kept - e * q))  # per reader, of this epoch, after dropping the last batch
            assert len(missing) == n - readers * read, f"epoch {e}: {len(missing)} records unread"


def assert_finite_jobs(out: Path, data: Path, ranks: int) -> None:
    ref = {1: reference_epochs(data, 1), 2: reference_epochs(data, 2)}
    for job in FINITE_JOBS:
        per_rank = results(out, job["name"], ranks)
        assert_finite_partition(per_rank, ref[job.get("repeat", 1)], job["workers"], job["batch"], job["drop_last"])


def test_torchrun_two_ranks_three_workers_read_each_record_once(tmp_path: Path) -> None:
    data = make_shards(tmp_path / "data")
    out = torchrun(tmp_path, "run", data, FINITE_JOBS)
    assert_finite_jobs(out, data, ranks=2)


def test_rank_and_world_size_from_the_environment(tmp_path: Path) -> None:
    data = make_shards(tmp_path / "data")
    out = plain_ranks(tmp_path, "run", data, FINITE_JOBS, world_size=2)
    assert_finite_jobs(out, data, ranks=2)


# -- an infinite stream ---------------------------------------------------------------------------------


def test_infinite_stream_reads_every_epoch_exactly_once(tmp_path: Path) -> None:
    """repeat() forever over 2 ranks x 2 workers: nothing dropped, each epoch read exactly once.

    Each reader's range is the same positions every epoch, of ``N // 4`` or ``N // 4 + 1``
    records (N = 167 does not divide by 4); the sizes are found, not assumed, and must cut
    every reader's stream into three epochs that each cover all records exactly once.
    """
    n, ranks, workers, batch, epochs = sum(SIZES), 2, 2, 3, 3
    steps = -(-epochs * (n // (ranks * workers) + 1) // batch) * workers + 2 * workers  # > 3 epochs per reader
    data = make_shards(tmp_path / "data")
    job = {"name": "forever", "seed": SEED, **SHUFFLE, "repeat": "forever", "batch": batch, "drop_last": True}
    out = torchrun(tmp_path, "run", data, [{**job, "workers": workers, "steps": steps}])
    per_rank = results(out, "forever", ranks)
    assert [len(r["batches"]) for r in per_rank] == [steps] * ranks
    assert all(len(b["id"]) == batch for r in per_rank for b in r["batches"]), "an infinite stream drops nothing"

    streams = [s for r in per_rank for _, s in sorted(reader_streams(r).items())]
    assert len(streams) == ranks * workers
    ids = set(range(n))
    q = n // len(streams)

    def epochs_of(sizes: tuple[int, ...]) -> list[list[int]] | None:
        out: list[list[int]] = []
        for e in range(epochs):
            epoch = [i for s, size in zip(streams, sizes, strict=True) for i, _ in s[e * size : (e + 1) * size]]
            if len(epoch) != n or set(epoch) != ids:
                return None
            out.append(epoch)
        return out

    choices = itertools.product((q, q + 1), repeat=len(streams))
    found = {sizes: e for sizes in choices if sum(sizes) == n and (e := epochs_of(sizes)) is not None}
    assert found, (
        "no split of the readers' streams into ranges of N // readers (+1) records covers each epoch exactly once; "
        f"records per reader: {[len(s) for s in streams]}, first ids: {[[i for i, _ in s[:5]] for s in streams]}"
    )
    sizes, by_epoch = next(iter(found.items()))
    assert by_epoch[0] != by_epoch[1] != by_epoch[2], "the stream is not reshuffled each epoch"
    # each reader's share of an epoch is a consecutive range of the unsplit stream's epoch, in order
    ds = tidal.Dataset(data).shuffle(SEED, **SHUFFLE).repeat()
    reference: list[int] = []
    for record in ds:
        reference.append(int(record["id"]))
        if len(reference) == n * epochs:
            break
    for e in range(epochs):
        ref = reference[e * n : (e + 1) * n]
        for c, (s, size) in enumerate(zip(streams, sizes, strict=True)):
            part = [i for i, _ in s[e * size : (e + 1) * size]]
            start = ref.index(part[0])
            assert part == ref[start : start + size], f"epoch {e}, reader {c}: not a consecutive range of the epoch"


# -- resuming in a fresh process --------------------------------------------------------------------------


RESUME = {"seed": SEED, **SHUFFLE, "repeat": 2, "batch": 4, "drop_last": True, "workers": 2}


def resume_jobs(saved: Path, name: str, points: list[int], in_pass_one: int, passes: int) -> list[dict]:
    """One fresh loader per saved state; a state saved in pass one needs both passes to reach the end."""
    jobs = []
    for k in points:
        remaining = passes if k <= in_pass_one else 1
        state = str(saved / f"{name}-rank{{rank}}-state-{k}.json")
        jobs.append({**RESUME, "name": f"from-{k}", "resume": state, "passes": remaining})
    return jobs


def assert_resumed(first: dict, resumed: dict, k: int) -> None:
    want, got = first["batches"][k:], resumed["batches"]
    assert len(got) == len(want), f"resumed after batch {k}: {len(got)} batches, expected {len(want)}"
    for j, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g == w, f"resumed after batch {k}: batch {k + j} differs:\n{g}\n!=\n{w}"


def test_resume_from_json_state_in_a_fresh_process(tmp_path: Path) -> None:
    n = sum(SIZES)
    per_pass = 2 * ((2 * (n // 2)) // 4)  # 2 workers, each 2 epochs of N // 2 records, full batches of 4
    points = [0, 1, 2, 5, 20, 41, 42, 43, per_pass - 1, per_pass, per_pass + 1, per_pass + 37, 2 * per_pass]
    data = make_shards(tmp_path / "data")
    # process A: two passes (the second reshuffled, epochs 2 and 3), saving states along the way
    a = single(tmp_path, "a", data, [{**RESUME, "name": "a", "passes": 2, "save_at": points}])
    first = results(a, "a", 1)[0]
    assert first["pass_lengths"] == [per_pass, per_pass]
    assert first["batches"][:per_pass] != first["batches"][per_pass:], "the second pass repeats the first"
    # process B, fresh: a fresh loader from each saved state must produce exactly the rest of A's batches
    jobs = resume_jobs(a, "a", points, per_pass, passes=2)
    jobs.append({**RESUME, "name": "from-pass1", "resume": str(a / "a-rank{rank}-state-pass1.json"), "passes": 1})
    persistent = {**jobs[points.index(43)], "name": "persistent-from-43", "persistent": True}
    b = single(tmp_path, "b", data, [*jobs, persistent])
    for k in points:
        assert_resumed(first, results(b, f"from-{k}", 1)[0], k)
    assert_resumed(first, results(b, "from-pass1", 1)[0], per_pass)
    assert_resumed(first, results(b, "persistent-from-43", 1)[0], 43)


def test_a_new_iter_continues_where_the_last_one_stopped(tmp_path: Path) -> None:
    """README: a new iter(loader) continues where the last one stopped (workers restarted or persistent)."""
    n = sum(SIZES)
    per_pass = 2 * ((2 * (n // 2)) // 4)
    stops = [1, 4, 5, 30, 41, 42, per_pass - 1, per_pass, per_pass + 9]
    data = make_shards(tmp_path / "data")
    jobs = [
        {**RESUME, "name": "straight", "passes": 2},
        {**RESUME, "name": "stopped", "passes": 2, "interrupt_at": stops},
        {**RESUME, "name": "stopped-persistent", "passes": 2, "interrupt_at": stops, "persistent": True},
    ]
    out = single(tmp_path, "run", data, jobs)
    straight = results(out, "straight", 1)[0]
    assert len(straight["batches"]) == 2 * per_pass
    for name in ("stopped", "stopped-persistent"):
        assert_resumed(straight, {"batches": results(out, name, 1)[0]["batches"]}, 0)


def test_resume_under_torchrun_two_ranks(tmp_path: Path) -> None:
    n, ranks = sum(SIZES), 2
    per_pass = 2 * ((2 * (n // 4)) // 4)  # per rank: 2 workers, each 2 epochs of N // 4 records, batches of 4
    points = [0, 3, 17, per_pass - 1, per_pass]
    data = make_shards(tmp_path / "data")
    forever = {**RESUME, "name": "forever", "repeat": "forever", "batch": 3}  # batches straddle epochs
    a = torchrun(
        tmp_path,
        "a",
        data,
        [{**RESUME, "name": "a", "passes": 1, "save_at": points}, {**forever, "steps": 70, "save_at": [29]}],
    )
    first = results(a, "a", ranks)
    assert [r["pass_lengths"] for r in first] == [[per_pass]] * ranks
    jobs = resume_jobs(a, "a", points, per_pass, passes=1)
    swapped = str(a / f"a-rank{{other}}-state-{points[2]}.json")
    jobs.append({**RESUME, "name": "swapped", "resume": swapped})
    state = str(a / "forever-rank{rank}-state-29.json")
    jobs.append({**forever, "name": "forever-from-29", "resume": state, "steps": 70 - 29})
    b = torchrun(tmp_path, "b", data, jobs)
    for k in points:
        for rank, resumed in enumerate(results(b, f"from-{k}", ranks)):
            assert_resumed(first[rank], resumed, k)
    pairs = zip(results(a, "forever", ranks), results(b, "forever-from-29", ranks), strict=True)
    for rank, (whole, resumed) in enumerate(pairs):
        assert len(whole["batches"]) == 70, f"rank {rank}"
        assert_resumed(whole, resumed, 29)
    # the state is gathered over ranks: every rank saved the same one, so either file resumes every rank
    for k in points:
        saved = [json.loads((a / f"a-rank{rank}-state-{k}.json").read_text()) for rank in range(ranks)]
        assert saved[0] == saved[1]
    for rank, resumed in enumerate(results(b, "swapped", ranks)):
        assert_resumed(first[rank], resumed, points[2])
