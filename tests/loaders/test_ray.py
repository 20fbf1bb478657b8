"""tidal.ray.DataLoader on a real Ray cluster of several nodes on 127.0.0.1 (``ray.cluster_utils.Cluster``).

A reader is a DataLoader worker that lives elsewhere: each test holds the Ray loader to
``tidal.DataLoader(ds, num_workers=N)`` on the same dataset, batch for batch (types included),
and then does to the readers what happens on a cluster (an actor killed, a whole node removed,
a process that stops answering) or moves the state between the two loaders: the batches stay
the local loader's, so no record is lost or repeated. Under torchrun, 2 ranks x 2 readers read
what 2 ranks x 2 workers read (tests/distributed/run_ray.py).

The cluster is small (two nodes of one CPU and 80 MB of object store; readers ask for a
quarter of a CPU each), started once for the module and stopped after it.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import itertools
import json
import os
import signal
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import procs
import pytest
from conftest import make_shards, write_jsonl
from makers import train_tokenizer

import tidal
from tidal.testing import same

pytestmark = pytest.mark.slow

ray = pytest.importorskip("ray")
pytest.importorskip("torch")

import tidal.ray  # noqa: E402  (after the skips: it needs torch and Ray)

NODE = {"num_cpus": 1, "object_store_memory": 80 << 20}
SMALL = {"num_cpus": 0.25}  # four readers on a node of one CPU
SIZES = [137, 23, 151, 9, 130, 44, 118]  # 612 records
SCRIPT = Path(__file__).parents[1] / "distributed" / "run_ray.py"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    from ray.cluster_utils import Cluster

    made = Cluster(initialize_head=True, head_node_args={**NODE, "include_dashboard": False})
    try:
        made.add_node(**NODE)
        made.wait_for_nodes()
        path = os.pathsep.join(p for p in sys.path if p)  # the readers import tidal and tests/ as this process
        ray.init(address=made.address, runtime_env={"env_vars": {"PYTHONPATH": path}})
        yield made
    finally:
        ray.shutdown()
        made.shutdown()


@pytest.fixture(autouse=True)
def readers_let_go() -> Iterator[None]:
    """A loader's readers live as long as it does: after each test, those of its loaders go."""
    yield
    gc.collect()


def local(ds: tidal.Dataset, workers: int) -> tidal.DataLoader:
    """The local loader the Ray readers are held to: its workers come from a fork server, never
    forked from this process, whose Ray client runs threads."""
    return tidal.DataLoader(ds, num_workers=workers, multiprocessing_context="forkserver")


def on_ray(ds: tidal.Dataset, readers: int, **kwargs: Any) -> Any:
    """Ray readers of a quarter CPU; a reader that does not answer in 60 s fails the test, not hangs it."""
    return tidal.ray.DataLoader(
        ds, readers=readers, reader_options=kwargs.pop("reader_options", SMALL), **{"reader_timeout": 60, **kwargs}
    )


def plain(tmp_path: Path) -> tidal.Dataset:
    root = make_shards(tmp_path / "data", SIZES)
    return tidal.Dataset(root).shuffle(5, block_size=40, shards_per_block=2).batch(4, drop_last=False)


def packed(tmp_path: Path) -> tidal.Dataset:
    """Tokenized and packed: token ids, labels, positions and document bounds as tensors."""
    root = make_shards(tmp_path / "data", SIZES)
    train_tokenizer(tmp_path / "tokenizer.json")
    ds = tidal.Dataset(root, columns=["text"]).shuffle(5, block_size=40).tokenize(tmp_path / "tokenizer.json")
    return ds.pack(seq_len=24).batch(4)


def ids(batches: list[dict]) -> list[int]:
    return [i for b in batches for i in b["id"].tolist()]


def assert_same_batches(got: list[Any], want: list[Any]) -> None:
    assert len(got) == len(want)
    for step, (a, b) in enumerate(zip(got, want, strict=True)):
        assert same(a, b), f"batch {step} differs"


def actor_id(handle: Any) -> str:
    return handle._actor_id.hex()


def test_the_batches_are_the_local_workers_and_a_killed_reader_changes_none(tmp_path: Path, cluster: Any) -> None:
    ds = packed(tmp_path)
    reference = local(ds, 2)
    want = list(reference)
    loader = on_ray(ds, 2)
    early = [actor_id(h) for h in loader.readers]  # started when the loader was built (start_early)
    got = []
    for step, batch in enumerate(loader):
        got.append(batch)
        if step == 6:  # reader 1 has sent 3 batches and read up to 8 ahead
            killed = loader.readers[1]
            ray.kill(killed)
    assert_same_batches(got, want)
    assert got[0]["input_ids"].dtype == want[0]["input_ids"].dtype
    assert len(early) == 2 and actor_id(loader.readers[0]) == early[0] != actor_id(loader.readers[1])
    assert actor_id(killed) == early[1]
    assert loader.stats()["readers_replaced"] == 1
    metrics = loader.metrics()
    assert metrics["batches"] == len(want)
    assert metrics["tokens"] == sum(int((b["segment_ids"] != 0).sum()) for b in want)
    # the next pass (the next epoch) on the same actors, opened again where they are
    readers = [actor_id(h) for h in loader.readers]
    assert_same_batches(list(loader), list(reference))
    assert [actor_id(h) for h in loader.readers] == readers
    loader.close()


def test_a_node_removed_with_its_readers_changes_nothing(tmp_path: Path, cluster: Any) -> None:
    """Both readers placed on one node (near the data, as reader_options can), and the node
    removed mid-epoch: the replacements start on the nodes left and the epoch is the local one."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    node = cluster.add_node(**NODE)
    cluster.wait_for_nodes()
    ds = plain(tmp_path)
    want = list(local(ds, 2))
    near = NodeAffinitySchedulingStrategy(node.node_id, soft=True)
    loader = on_ray(ds, 2, reader_options={**SMALL, "scheduling_strategy": near}, prefetch=2)
    got = []
    for step, batch in enumerate(loader):
        got.append(batch)
        if step == 0:
            assert {ray.get(h.where.remote())[0] for h in loader.readers} == {node.node_id}
        if step == 9:
            cluster.remove_node(node)
    assert_same_batches(got, want)
    assert Counter(ids(got)) == Counter(ids(want))
    assert loader.stats()["readers_replaced"] == 2
    assert loader.metrics()["records"] == len(ids(want))


def test_a_reader_that_stops_answering_is_replaced(tmp_path: Path, cluster: Any) -> None:
    ds = plain(tmp_path)
    want = list(local(ds, 2))
    loader = on_ray(ds, 2, prefetch=2, reader_timeout=10)
    got, stopped = [], None
    try:
        for step, batch in enumerate(loader):
            got.append(batch)
            if step == 4:
                silent = actor_id(loader.readers[1])
                _, stopped = ray.get(loader.readers[1].where.remote())
                os.kill(stopped, signal.SIGSTOP)  # alive, and silent: as a hung node
        assert_same_batches(got, want)
        assert actor_id(loader.readers[1]) != silent
        assert loader.stats()["readers_replaced"] >= 1  # (a reader slowed past 10 s by a busy machine is replaced too)
    finally:
        if stopped is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(stopped, signal.SIGKILL)


def test_a_state_moves_between_ray_readers_and_local_workers(tmp_path: Path, cluster: Any) -> None:
    ds = plain(tmp_path)
    want = list(local(ds, 2))

    ray_loader = on_ray(ds, 2)
    built = [actor_id(h) for h in ray_loader.readers]
    head = list(itertools.islice(ray_loader, 7))
    saved = json.loads(json.dumps(ray_loader.state_dict()))
    ray_loader.load_state_dict(saved)  # its readers opened again at the state, not started again
    assert [actor_id(h) for h in ray_loader.readers] == built
    ray_loader.close()
    local_loader = local(ds, 2)
    local_loader.load_state_dict(saved)
    assert_same_batches(head + list(local_loader), want)  # Ray readers -> local workers, batch for batch

    local_loader = local(ds, 2)
    head = list(itertools.islice(local_loader, 9))
    back = on_ray(ds, 2)
    back.load_state_dict(json.loads(json.dumps(local_loader.state_dict())))
    early = [actor_id(h) for h in back.readers]  # restarted from the state as it was given
    assert_same_batches(head + list(back), want)  # and back
    assert [actor_id(h) for h in back.readers] == early

    # elastic: 2 readers -> 3 local workers -> 1 reader, every record of the epoch once
    elastic = local(ds, 3)
    elastic.load_state_dict(saved)
    middle = list(itertools.islice(elastic, 11))
    last = on_ray(ds, 1)
    last.load_state_dict(elastic.state_dict())
    counts = Counter(ids(want[:7]) + ids(middle) + ids(list(last)))
    assert max(counts.values()) == 1, "a record was read twice"
    assert 0 <= sum(SIZES) - len(counts) < 3, "records never read"


def test_mixture_weights_set_live_and_a_reader_killed_keep_the_local_batches_and_counts(
    tmp_path: Path, cluster: Any
) -> None:
    web = tidal.Dataset(make_shards(tmp_path / "web", [120, 80])).shuffle(1, block_size=30)
    code = tidal.Dataset(make_shards(tmp_path / "code", [90, 70])).shuffle(2, block_size=30)
    ds = tidal.mix({"web": web, "code": code}, weights={"web": 0.5, "code": 0.5}, seed=3).batch(4)

    def run(loader: Any, kill: bool) -> list[Any]:
        got = []
        for step, batch in enumerate(loader):
            got.append(batch)
            if step == 5:
                loader.set_weights({"web": 0.2, "code": 0.8})
            if kill and step == 8:
                ray.kill(loader.readers[0])
        return got

    local_loader = local(ds, 2)
    want = run(local_loader, kill=False)
    loader = on_ray(ds, 2)
    assert_same_batches(run(loader, kill=True), want)
    metrics, expected = loader.metrics(), local_loader.metrics()
    for key in ("batches", "records", "records/web", "records/code", "weight/web", "weight/code"):
        assert metrics[key] == expected[key], key
    assert metrics["records"] == metrics["records/web"] + metrics["records/code"]
    assert loader.state_dict() == local_loader.state_dict()


def _report(path: Path, error: Exception) -> None:
    """An errors= function whose calls outlive the readers (Ray actors, workers): a line each, in ``path``."""
    with open(path, "a") as f:
        f.write(f"{Path(getattr(error, 'path', '')).name} {getattr(error, 'row', None)}\n")


def test_set_weights_reports_each_bad_record_as_often_as_the_local_workers(tmp_path: Path, cluster: Any) -> None:
    """set_weights reopens the actors behind where they had read ahead: the bad records they had met
    reach the errors function (and metrics()['skipped']) as often as with tidal.DataLoader's workers:
    once each. (Only "web" has bad records and is read to its end, which ends the pass: how far
    readers read ahead of the last batch, which differs between runs, decides no report.)"""
    streams = {}
    for name, n in (("web", 300), ("code", 200)):
        root = tmp_path / name
        root.mkdir()
        for s in range(2):
            lines = [
                "{not json" if i % 7 == 3 and name == "web" else json.dumps({"id": i + (1000 if name == "code" else 0)})
                for i in range(s, n, 2)
            ]
            (root / f"{name}-{s}.jsonl").write_text("\n".join(lines) + "\n")
        streams[name] = root

    def run(make: Any, report: Path) -> tuple[Counter, Any]:
        errors = functools.partial(_report, report)
        mixed = {
            n: tidal.Dataset(str(r / f"{n}-*.jsonl"), errors=errors).shuffle(3, block_size=16)
            for n, r in streams.items()
        }
        loader = make(tidal.mix(mixed, weights={"web": 0.5, "code": 0.5}, seed=0).batch(4))
        changes = {3: {"web": 0.9, "code": 0.1}, 8: {"web": 1.0, "code": 0.0}}
        for step, _ in enumerate(loader):
            if step in changes:
                loader.set_weights(changes[step])
        return Counter(report.read_text().splitlines() if report.exists() else []), loader

    want, _ = run(lambda ds: local(ds, 2), tmp_path / "local.txt")
    got, loader = run(lambda ds: on_ray(ds, 2), tmp_path / "ray.txt")
    assert want == Counter(f"web-{i % 2}.jsonl {i // 2}" for i in range(300) if i % 7 == 3)
    assert got == want
    assert loader.metrics()["skipped"] == sum(got.values())


def test_two_ranks_under_torchrun_with_two_readers_each_read_as_two_workers_each(
    tmp_path: Path, cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each rank's readers read the shares its workers would, batch for batch (rank 1 loses a
    reader on the way); the state both ranks gathered resumes in one process of 3 workers."""
    ds = plain(tmp_path)
    config = tmp_path / "ray.json"
    out = tmp_path / "out"
    out.mkdir()
    jobs = {"address": cluster.address, "dataset": ds.to_config(), "save_at": 6, "kill_at": 4, "kill_rank": 1}
    config.write_text(json.dumps({**jobs, "out": str(out)}))
    procs.torchrun(SCRIPT, str(config), nproc=2, env=procs.child_env(tmp_path / "cache"), timeout=300)
    ranks = [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(2)]
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        assert ranks[rank]["batches"] == [b["id"].tolist() for b in local(ds, 2)]
    assert [r["replaced"] for r in ranks] == [0, 1]
    state = ranks[0]["state"]
    assert state == ranks[1]["state"] and state["topology"] == [2, 2]
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    resumed = local(ds, 3)
    resumed.load_state_dict(state)
    head = [i for r in ranks for batch in r["batches"][:6] for i in batch]
    counts = Counter(head + ids(list(resumed)))
    assert max(counts.values()) == 1, "a record was read twice"
    assert 0 <= sum(SIZES) - len(counts) < 3, "records never read"


def note(folder: str, record: dict) -> dict:
    """Writes a file per record read (in the reader, wherever it runs): what the readers made, and
    the tokenizer threads a reader runs (those of its CPUs)."""
    Path(folder, str(record["id"])).write_text(os.environ.get("RAYON_NUM_THREADS", "unset"))
    return record


def test_a_reader_makes_at_most_prefetch_batches_ahead(tmp_path: Path, cluster: Any) -> None:
    made = tmp_path / "made"
    made.mkdir()
    root = make_shards(tmp_path / "data", SIZES)
    ds = tidal.Dataset(root).shuffle(5, block_size=40).map(functools.partial(note, str(made))).batch(4)
    loader = on_ray(ds, 2, prefetch=4)
    for handle in loader.readers:  # started with the loader, and opened: they read when iterated
        ray.get(handle.where.remote())
    assert not list(made.iterdir())
    running = iter(loader)
    taken = [next(running) for _ in range(4)]  # 2 batches of each reader, the second in a bundle of 2
    for handle in loader.readers:  # a reader answers in order: once this returns, it has made what it was asked
        ray.get(handle.where.remote())
    assert 4 * 4 < len(list(made.iterdir())) <= (4 + 2 * 4) * 4  # each at most 4 batches ahead, of 75
    assert {f.read_text() for f in made.iterdir()} == {"1"}  # a quarter of a CPU: one thread
    again = iter(loader)  # a new pass takes the readers: the old one cannot read on as if it had them
    assert len(taken) == 4 and next(again) is not None
    with pytest.raises(tidal.StateError, match="superseded: a newer iter"):
        list(running)
    loader.close()


def test_an_error_in_a_reader_is_raised_as_it_is(tmp_path: Path, cluster: Any) -> None:
    """A bad record is the data's error, raised in the training process naming its file and line;
    not a lost reader (a replacement would read the same line)."""
    root = make_shards(tmp_path / "data", [20, 20], kinds=("jsonl",))
    with (root / "part-001.jsonl").open("a") as f:
        f.write("{not json\n")
    loader = on_ray(tidal.Dataset(root).batch(4), 2)
    with pytest.raises(tidal.RecordError, match=r"part-001\.jsonl.*line 21"):
        list(loader)


def test_options_that_cannot_hold_are_refused_when_the_loader_is_made(tmp_path: Path) -> None:
    ds = tidal.Dataset(write_jsonl(tmp_path / "a.jsonl", [{"id": 1}])).batch(1)
    with pytest.raises(tidal.ArgumentError, match=r"reader_options\['max_restarts'\]: tidal sets it"):
        tidal.ray.DataLoader(ds, readers=2, reader_options={"max_restarts": 3})
    with pytest.raises(tidal.ArgumentError, match=r"reader_options: .*num_cpu"):
        tidal.ray.DataLoader(ds, reader_options={"num_cpu": 2})
    with pytest.raises(tidal.ArgumentError, match="readers=, not num_workers="):
        tidal.ray.DataLoader(ds, num_workers=2)
    with pytest.raises(tidal.ArgumentError, match="persistent_workers= does not apply"):
        tidal.ray.DataLoader(ds, persistent_workers=True)
    for bad in ({"readers": 0}, {"prefetch": 0}, {"reader_timeout": -1}):
        with pytest.raises(tidal.ArgumentError):
            tidal.ray.DataLoader(ds, **bad)
    # a config's loader section serves both loaders: its workers are the readers (nothing starts here)
    config = {**ds.to_config(), "loader": {"num_workers": 3, "persistent_workers": True, "timeout": 5}}
    made = tidal.ray.DataLoader.from_config(config, start_early=False)
    assert made.state_dict()["topology"] == [1, 3] and made.readers == []


def test_readers_the_cluster_cannot_hold_are_an_error_naming_what_they_need(
    tmp_path: Path, cluster: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Three readers of a whole CPU on a cluster of two CPUs: a warning as the pass starts and, at
    the first reader_timeout, an error that names what they need and what the cluster has, not
    the readers replaced again and again for LOST + 1 timeouts."""
    import time

    ds = plain(tmp_path)
    loader = on_ray(ds, 3, reader_options={"num_cpus": 1}, reader_timeout=5)
    started = time.monotonic()
    with pytest.raises(tidal.ArgumentError, match=r"3 readers \(1 ranks x 3\) .* need 3 CPU; the cluster has 2 CPU"):
        list(loader)
    assert time.monotonic() - started < 60
    assert any("need 3 CPU" in r.getMessage() for r in caplog.records if r.name == "tidal")
    del loader
    gc.collect()  # its readers go, the one never placed included: the cluster serves what fits it
    assert sorted(ids(list(on_ray(ds, 2)))) == list(range(sum(SIZES)))
