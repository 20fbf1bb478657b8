"""loader.metrics(): exact counts of what the training loop received, with 0 or 2 workers (fork and
spawn), per mixed stream, across passes and resumes; the time the loop waited; the JAX loader too."""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from makers import EOS, word_tokenizer, write_docs

import tidal

WORKERS = [(0, None), (2, "fork"), (2, "spawn")]
IDS = ["0-workers", "2-fork", "2-spawn"]


def loader(ds: tidal.Dataset, workers: int, context: str | None) -> tidal.DataLoader:
    options = {"multiprocessing_context": context} if context else {}
    return tidal.DataLoader(ds, num_workers=workers, **options)


@pytest.fixture(scope="module")
def docs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 500, rng.integers(3, 40)).tolist() for _ in range(90)]
    return write_docs(tmp_path_factory.mktemp("metrics") / "docs", docs, shards=3)


def packed(docs: Path) -> tidal.Dataset:
    """Best-fit packing pads its rows: the padding must not count as tokens."""
    return (
        tidal.Dataset(docs)
        .shuffle(seed=1, block_size=20)
        .tokenize(word_tokenizer(), eos="<eos>")
        .pack(32, strategy="best_fit", pad_id=EOS + 1, buffer_size=8)
        .batch(3, drop_last=False)
    )


@pytest.mark.parametrize(("workers", "context"), WORKERS, ids=IDS)
def test_counts_are_those_of_the_batches_the_loop_received(docs: Path, workers: int, context: str | None) -> None:
    ld = loader(packed(docs), workers, context)
    got = list(ld)
    m = ld.metrics()
    assert m["batches"] == len(got) > 5
    assert m["records"] == sum(len(b["input_ids"]) for b in got)
    non_padding = sum(int((b["segment_ids"] != 0).sum()) for b in got)
    assert non_padding < sum(b["input_ids"].numel() for b in got)  # there was padding to leave out
    assert m["tokens"] == non_padding
    every = sum(len(d.split()) + 1 for f in docs.glob("*.jsonl") for d in _texts(f))  # each document, EOS included
    assert m["tokens"] == every
    assert m["rows_read"] >= 90 and m["bytes_read"] >= sum(f.stat().st_size for f in docs.glob("*.jsonl"))
    assert m["skipped"] == m["retries"] == m["cache_hits"] == 0
    assert 0 < m["data_wait_s"] <= m["seconds"] and 0 < m["data_wait_share"] <= 1
    assert all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in m.values())


def _texts(path: Path) -> list[str]:
    return [json.loads(line)["text"] for line in path.read_text().splitlines()]


@pytest.mark.parametrize(("workers", "context"), WORKERS, ids=IDS)
def test_counts_stop_at_what_was_received_though_readers_ran_ahead(
    docs: Path, workers: int, context: str | None
) -> None:
    ld = loader(packed(docs), workers, context)
    head = list(itertools.islice(ld, 4))
    m = ld.metrics()
    assert (m["batches"], m["records"]) == (4, sum(len(b["input_ids"]) for b in head))
    assert m["tokens"] == sum(int((b["segment_ids"] != 0).sum()) for b in head)
    assert ld.metrics()["records"] == m["records"]  # reading resets nothing


def mixture(docs: Path, low: Path) -> tidal.Dataset:
    tok = word_tokenizer()
    web = tidal.Dataset(docs).shuffle(seed=2, block_size=20).repeat().tokenize(tok, eos="<eos>")
    code = tidal.Dataset(low).repeat().tokenize(tok, eos="<eos>")
    return tidal.mix({"web": web, "code": code}, weights={"web": 0.7, "code": 0.3}, seed=0).batch(4)


@pytest.mark.parametrize(("workers", "context"), WORKERS[:2], ids=IDS[:2])
def test_tokens_per_stream_are_those_the_loop_received_from_each(
    docs: Path, tmp_path: Path, workers: int, context: str | None
) -> None:
    # the code stream's documents are ids 600-699, the web's below 500: each token tells its stream
    rng = np.random.default_rng(1)
    low = write_docs(tmp_path / "code", [rng.integers(600, 700, rng.integers(3, 20)).tolist() for _ in range(40)], 2)
    ld = loader(mixture(docs, low), workers, context)
    got = list(itertools.islice(ld, 30))
    m = ld.metrics()
    rows = [r for b in got for r in b["input_ids"]]
    code = [r for r in rows if int(r[0]) >= 600]
    assert m["records"] == len(rows) == 120
    assert (m["records/web"], m["records/code"]) == (len(rows) - len(code), len(code))
    assert m["tokens/code"] == sum(len(r) for r in code)
    assert m["tokens/web"] + m["tokens/code"] == m["tokens"] == sum(len(r) for r in rows)
    assert m["weight/web"] == pytest.approx(0.7) and m["weight/code"] == pytest.approx(0.3)


def add_up(m: dict) -> tuple[int, int]:
    """Σ records/<stream> and Σ tokens/<stream>."""
    return sum(m[f"records/{n}"] for n in ("web", "code")), sum(m[f"tokens/{n}"] for n in ("web", "code"))


@pytest.mark.parametrize("kind", ["0-workers", "2-fork", "jax-2-threads"])
def test_streams_add_up_to_what_the_loop_got_across_set_weights_and_loaded_states(
    docs: Path, tmp_path: Path, kind: str
) -> None:
    """records == Σ records/<stream> and tokens == Σ tokens/<stream>, whatever restarts the readers."""
    rng = np.random.default_rng(1)
    low = write_docs(tmp_path / "code", [rng.integers(600, 700, rng.integers(3, 20)).tolist() for _ in range(40)], 2)
    ds = mixture(docs, low)
    if kind.startswith("jax"):
        pytest.importorskip("jax")
        import tidal.jax

        ld: Any = tidal.jax.Loader(ds, num_workers=2)
    else:
        ld = loader(ds, *WORKERS[IDS.index(kind)])
    it = iter(ld)
    rows = []
    for step in range(1, 31):
        rows += [r for r in next(it)["input_ids"]]
        if step in (9, 20):
            ld.set_weights({"web": 0.2, "code": 0.8} if step == 9 else {"web": 0.5, "code": 0.5})
        m = ld.metrics()
        assert m["records"] == len(rows) == add_up(m)[0], f"after step {step}"
        assert m["tokens"] == sum(len(r) for r in rows) == add_up(m)[1], f"after step {step}"
    read = m["rows_read"]
    ld.load_state_dict(ld.state_dict())  # the readers start again where the loop is
    it = iter(ld)
    for _ in range(5):
        rows += [r for r in next(it)["input_ids"]]
    m = ld.metrics()
    assert m["records"] == len(rows) == add_up(m)[0] and m["tokens"] == add_up(m)[1]
    assert m["records/code"] == sum(int(r[0]) >= 600 for r in rows)
    assert m["rows_read"] >= read  # the readers' counters go on too


def test_a_schedule_reports_the_weights_the_mixture_draws_with(docs: Path, tmp_path: Path) -> None:
    tok = word_tokenizer()
    a = tidal.Dataset(docs).repeat().tokenize(tok, eos="<eos>")
    b = tidal.Dataset(write_docs(tmp_path / "b", [[600 + i] for i in range(50)], 1)).repeat().tokenize(tok, eos="<eos>")
    schedule = tidal.Piecewise([(0, {"a": 1.0, "b": 0.0}), (1000, {"a": 0.25, "b": 0.75})])
    ld = tidal.DataLoader(tidal.mix({"a": a, "b": b}, weights=schedule).batch(4))
    assert (ld.metrics()["weight/a"], ld.metrics()["weight/b"]) == (1.0, 0.0)  # before any batch
    batches = iter(ld)
    head = [next(batches) for _ in range(255)]  # 1,020 draws, all in the mixture's first block of 1,024
    assert (ld.metrics()["weight/a"], ld.metrics()["weight/b"]) == (1.0, 0.0)
    assert ld.metrics()["records/b"] == 0 == sum(int(r[0]) >= 600 for h in head for r in h["input_ids"])
    next(batches)  # the block's last 4 draws: the next block draws at the schedule's second point
    assert (ld.metrics()["weight/a"], ld.metrics()["weight/b"]) == (0.25, 0.75)
    later = [next(batches) for _ in range(50)]
    from_b = sum(int(r[0]) >= 600 for h in later for r in h["input_ids"])
    assert 100 < from_b < 200 and ld.metrics()["records/b"] == from_b


def slow(record: dict) -> dict:
    time.sleep(0.01)
    return record


def test_data_wait_is_the_time_the_loop_spent_in_next(docs: Path) -> None:
    ds = tidal.Dataset(docs).map(slow).batch(3)
    ld = tidal.DataLoader(ds, start_early=False)  # no workers, nothing read before: every record's 10 ms is in next()
    for _ in itertools.islice(ld, 5):
        time.sleep(0.05)  # a training step: not waiting on data
    m = ld.metrics()
    assert m["data_wait_s"] >= 15 * 0.01
    assert m["seconds"] >= m["data_wait_s"] + 4 * 0.05
    assert 0.2 < m["data_wait_share"] < 0.8


def test_metrics_go_on_over_passes_and_count_this_process_from_a_resume(docs: Path) -> None:
    ds = tidal.Dataset(docs).shuffle(seed=1, block_size=20).batch(5)
    ld = tidal.DataLoader(ds, num_workers=2)
    first = len(list(ld))
    m1 = ld.metrics()
    second = len(list(ld))  # the next epoch
    m2 = ld.metrics()
    assert (m1["batches"], m2["batches"]) == (first, first + second) and m2["records"] == 2 * 90
    assert m2["rows_read"] >= 2 * m1["rows_read"] > 0  # the readers' counters of both passes
    head = tidal.DataLoader(ds, num_workers=2)
    list(itertools.islice(head, 7))
    resumed = tidal.DataLoader(ds, num_workers=2)
    resumed.load_state_dict(json.loads(json.dumps(head.state_dict())))
    rest = list(resumed)
    m = resumed.metrics()
    assert (m["batches"], m["records"]) == (len(rest), 90 - 35)  # what this process received


def test_skipped_records_are_counted(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"id": 1}\nnot json\n{"id": 3}\n{"id": 4}\n')
    ld = tidal.DataLoader(tidal.Dataset(tmp_path / "a.jsonl", errors="skip").batch(1), num_workers=2)
    assert len(list(ld)) == 3
    assert ld.metrics()["skipped"] == 1 and ld.metrics()["records"] == 3


def test_stats_and_metrics_agree(docs: Path) -> None:
    ld = tidal.DataLoader(packed(docs), num_workers=2)
    list(ld)
    s, m = ld.stats(), ld.metrics()
    assert (s["batches"], s["tokens"], s["rows_read"]) == (m["batches"], m["tokens"], m["rows_read"])


@pytest.mark.parametrize(("workers", "worker_type"), [(0, "thread"), (2, "thread")])
def test_the_jax_loader_counts_as_the_torch_loader(docs: Path, workers: int, worker_type: str) -> None:
    pytest.importorskip("jax")
    import tidal.jax

    ds = (
        tidal.Dataset(docs)
        .shuffle(seed=1, block_size=20)
        .tokenize(word_tokenizer(), eos="<eos>")
        .pack(32, strategy="best_fit", pad_id=EOS + 1, buffer_size=8)
        .batch(3)
    )
    ld = tidal.jax.Loader(ds, num_workers=workers, worker_type=worker_type)  # type: ignore[arg-type]
    got = list(ld)
    m = ld.metrics()
    assert m["batches"] == len(got) and m["records"] == 3 * len(got)
    assert m["tokens"] == sum(int((np.asarray(b["segment_ids"]) != 0).sum()) for b in got)
    assert 0 < m["data_wait_s"] <= m["seconds"]
    torch_loader = tidal.DataLoader(ds, num_workers=workers)
    list(torch_loader)
    assert {k: torch_loader.metrics()[k] for k in ("batches", "records", "tokens")} == {
        k: m[k] for k in ("batches", "records", "tokens")
    }


def test_remote_reads_count_downloads_then_cache_hits(tmp_path: Path) -> None:
    import functools
    import http.server
    import shutil
    import threading

    from conftest import make_shards

    from tidal.storage import Retry, Storage

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

    data = make_shards(tmp_path / "data", [10, 20, 5, 17])
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(data)))
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        settings = Storage(cache_dir=str(tmp_path / "cache"), retry=Retry(backoff=0.01), timeout=5)
        ds = tidal.Dataset(f"http://127.0.0.1:{server.server_address[1]}/", storage=settings).batch(4, drop_last=False)
        shutil.rmtree(tmp_path / "cache" / "shards")  # the shards come over the network once
        cold = tidal.DataLoader(ds, num_workers=2)
        assert sum(len(b["id"]) for b in cold) == 52
        warm = tidal.DataLoader(ds, num_workers=2)
        list(warm)
    finally:
        server.shutdown()
        server.server_close()
    files = sum(f.stat().st_size for f in data.glob("part-*"))
    c, w = cold.metrics(), warm.metrics()
    assert c["records"] == w["records"] == 52 and c["retries"] == 0
    # the files came twice: opening the dataset downloaded them to count them (counted by the first
    # loader made of it), then the cold loader's readers, the cache emptied
    assert c["bytes_downloaded"] == 2 * files and c["cache_hits"] < 4 <= c["cache_misses"] + c["cache_hits"]
    assert w["bytes_downloaded"] == 0 and w["cache_hits"] >= 4  # every shard, from the cache
    assert c["bytes_read"] == w["bytes_read"] > 0


def test_continuous_rows_over_two_workers_count_every_row_once(docs: Path) -> None:
    ds = tidal.Dataset(docs).tokenize(word_tokenizer(), eos="<eos>").pack(8).batch(4, continuous=True)
    ld = tidal.DataLoader(ds, num_workers=2)  # each batch: 2 rows of each worker, side by side
    got = list(itertools.islice(ld, 10))
    m = ld.metrics()
    assert (m["batches"], m["records"]) == (10, 40) and all(len(b["input_ids"]) == 4 for b in got)
    assert m["tokens"] == sum(int((b["segment_ids"] != 0).sum()) for b in got)
