#!/usr/bin/env python3
"""The first batch from remote data: the bytes over the link before it, and how long it takes.

Two shapes of issue 39, each against moto's S3 server on 127.0.0.1 behind the tests' shaping
proxy (``tests/fault_proxy.py`` with ``tests/shaping.py``: ``--latency-ms`` before every answer's
first byte, ``--conn-mb`` MB/s per connection), every measurement a fresh process with an empty
cache, the source trees (``--trees``) interleaved repetition by repetition:

- ``large``: ``--files`` Parquet files of ``--file-mb`` MB (FineWeb's shape: an ``id`` and a ``text``
  column that is most of the bytes, row groups of ``--group-docs`` documents), the index published
  beside them; ``Dataset(url, columns=["text"]).shuffle(seed=1).batch(8)`` through
  ``tidal.DataLoader`` with 0 and 2 workers (``--workers``): the bytes the proxy sent between
  building the loader and the first batch, the seconds to it, and (0 workers) what the first
  block's slices need, from the index: one row group per file, ``needed``.
- ``start``: a job's start: ``--ranks`` ranks on 2 nodes (one cache directory and one proxy each)
  over ``--objects`` small ``.jsonl.zst`` objects, the index published, each rank a process
  (``RANK``/``WORLD_SIZE``) taking its first batch of ``--batch``: per node, the bytes its proxy
  sent before the last of its ranks had its first batch (the published index included), and what
  its ranks' readers downloaded before their first batches (``read``: the data alone), also in
  files (``--objects`` files are the dataset).

    PYTHONPATH=src python bench/bench_instant.py                          # 8 x 137 MB, and the job's start
    PYTHONPATH=src python bench/bench_instant.py --quick                  # tiny: only checks that it runs
    PYTHONPATH=src python bench/bench_instant.py --files 16 --file-mb 512 --shapes large --repeats 1
    PYTHONPATH=src python bench/bench_instant.py --trees before=/work/wt-base/src,after=src

Prints a median (min-max) per configuration and the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # the S3 server and the proxy the tests use

from fault_proxy import FaultProxy  # noqa: E402
from s3_server import S3Server  # noqa: E402
from shaping import Link  # noqa: E402

BUCKET = "instant"

# one measurement of the large shape: prints a line "first", waits for the parent to read the
# proxy's counters, then exits
LARGE = r"""
import json, os, sys, time
import torch, tidal
url, options, cache, workers = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4])
ds = tidal.Dataset(url, columns=["text"], storage_options=options, cache_dir=cache).shuffle(seed=1).batch(8)
print("built", flush=True)
sys.stdin.readline()  # the parent has read the proxy's counters: what opening the dataset cost
t0 = time.perf_counter()
loader = tidal.DataLoader(ds, num_workers=workers)
it = iter(loader)  # kept: a dropped iterator's workers finish the batch each is making first
next(it)
print("first", time.perf_counter() - t0, flush=True)
sys.stdin.readline()
os._exit(0)
"""

# one rank of the start shape: its first batch, then waits for the parent
RANK = r"""
import json, os, sys, time
import tidal
url, options, cache, batch = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4])
ds = tidal.Dataset(url, storage_options=options, cache_dir=cache).shuffle(seed=1, block_size=400, shards_per_block=4)
it = iter(ds.batch(batch))
next(it)
print("first", it.stats()["bytes_downloaded"], flush=True)
sys.stdin.readline()
os._exit(0)
"""

INDEX = r"""
import json, sys
import tidal
tidal.index(sys.argv[1], storage_options=json.loads(sys.argv[2]), cache_dir=sys.argv[3])
"""


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def words(rng: random.Random, n: int) -> str:
    vocab = ["tide", "shore", "wave", "salt", "moon", "drift", "current", "reef", "gull", "swell", "ebb", "flow"]
    return " ".join(rng.choice(vocab) + str(rng.randrange(1000)) for _ in range(n))


def large_corpus(root: Path, files: int, file_mb: float, group_docs: int) -> Path:
    """Parquet files of about ``file_mb`` MB, the text most of them, ``group_docs`` documents a row group."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root.mkdir(parents=True)
    rng = random.Random(39)
    doc_words = 400  # ~3.5 KB a document
    docs = max(group_docs, int(file_mb * 1e6 / (doc_words * 8.5)))
    for f in range(files):
        texts = [words(rng, doc_words) for _ in range(min(docs, 2000))]
        text = [texts[i % len(texts)] + f" {f}-{i}" for i in range(docs)]
        table = pa.table({"id": list(range(f * docs, (f + 1) * docs)), "text": text})
        pq.write_table(table, root / f"part-{f:03d}.parquet", row_group_size=group_docs, compression="NONE")
    return root


def start_corpus(root: Path, objects: int, per_object: int) -> Path:
    import zstandard

    root.mkdir(parents=True)
    rng = random.Random(4)
    for k in range(objects):
        records = [{"id": k * per_object + i, "text": words(rng, 60)} for i in range(per_object)]
        lines = "".join(json.dumps(r) + "\n" for r in records)
        (root / f"part-{k:04d}.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(lines.encode()))
    return root


def env_for(tree: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env |= {"PYTHONPATH": tree, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    env |= {"AWS_DEFAULT_REGION": "us-east-1", "PYTHONWARNINGS": "ignore"}
    return env


def child(code: str, args: list[Any], tree: str, extra: dict[str, str] | None = None) -> subprocess.Popen:
    argv = [sys.executable, "-c", code, *[str(a) for a in args]]
    env = env_for(tree) | (extra or {})
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=REPO)


def line(proc: subprocess.Popen, word: str) -> list[str]:
    assert proc.stdout is not None
    out = proc.stdout.readline().split()
    if not out or out[0] != word:
        proc.wait()
        raise RuntimeError(f"the measured process ended without {word!r} (exit {proc.returncode})")
    return out[1:]


def go_on(proc: subprocess.Popen) -> None:
    assert proc.stdin is not None
    proc.stdin.write("\n")
    proc.stdin.flush()


def publish(s3: S3Server, url: str, tree: str, tmp: Path) -> None:
    subprocess.run(
        [sys.executable, "-c", INDEX, url, json.dumps(s3.options()), str(tmp / "indexer")],
        env=env_for(tree), check=True, cwd=REPO,
    )  # fmt: skip


def needed(root: Path) -> int:
    """The bytes of the first block's slices of a shuffle of these files at the defaults: a row group of each."""
    import pyarrow.parquet as pq

    total = 0
    for path in sorted(root.glob("*.parquet")):
        meta = pq.ParquetFile(path).metadata
        total += max(meta.row_group(g).total_byte_size for g in range(meta.num_row_groups))
    return total


def measure_large(s3: S3Server, url: str, link: Link, tree: str, workers: int, tmp: Path) -> dict[str, float]:
    with FaultProxy(("127.0.0.1", s3.port), every=0, link=link) as proxy, tempfile.TemporaryDirectory(dir=tmp) as cache:
        proc = child(LARGE, [url, json.dumps(s3.options(proxy.endpoint)), cache, workers], tree)
        try:
            line(proc, "built")
            opened = proxy.traffic.snapshot()["bytes_out"]
            go_on(proc)
            (seconds,) = line(proc, "first")
            before = proxy.traffic.snapshot()["bytes_out"] - opened
            go_on(proc)
        finally:
            proc.wait(timeout=600)
    return {"open MB": opened / 1e6, "first MB": before / 1e6, "first s": float(seconds)}


def measure_start(s3: S3Server, url: str, link: Link, tree: str, ranks: int, batch: int, tmp: Path) -> dict[str, float]:
    """Per node, the bytes its proxy sent until the last of its ranks had its first batch."""
    import threading

    nodes = 2
    per_node = ranks // nodes
    out: dict[str, float] = {}
    lock = threading.Lock()
    with tempfile.TemporaryDirectory(dir=tmp) as caches:
        proxies = [FaultProxy(("127.0.0.1", s3.port), every=0, link=link) for _ in range(nodes)]
        procs: list[subprocess.Popen] = []
        left = [per_node] * nodes

        def first(rank: int) -> None:
            (read,) = line(procs[rank], "first")
            node = rank // per_node
            with lock:
                left[node] -= 1
                out[f"node {node} read MB"] = out.get(f"node {node} read MB", 0.0) + int(read) / 1e6
                if not left[node]:  # the node's last rank has its first batch: what came over its link
                    out[f"node {node} MB"] = proxies[node].traffic.snapshot()["bytes_out"] / 1e6

        try:
            for rank in range(ranks):
                node = rank // per_node
                env = {"RANK": str(rank), "WORLD_SIZE": str(ranks), "LOCAL_WORLD_SIZE": str(per_node)}
                options = json.dumps(s3.options(proxies[node].endpoint))
                procs.append(child(RANK, [url, options, f"{caches}/node{node}", batch], tree, env))
            waiting = [threading.Thread(target=first, args=(rank,)) for rank in range(ranks)]
            for t in waiting:
                t.start()
            for t in waiting:
                t.join()
            for proc in procs:
                go_on(proc)
        finally:
            for proc in procs:
                proc.wait(timeout=600)
            for p in proxies:
                p.stop()
    return dict(sorted(out.items()))


def summary(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="large,start")
    parser.add_argument("--trees", default="after=src", help="name=path/to/src, comma-separated")
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--file-mb", type=float, default=137)
    parser.add_argument("--group-docs", type=int, default=4000)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--objects", type=int, default=200)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--latency-ms", type=float, default=20)
    parser.add_argument("--conn-mb", type=float, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a tiny corpus, one repeat: only checks that it runs")
    args = parser.parse_args()
    if args.quick:
        args.files, args.file_mb, args.group_docs, args.objects, args.repeats = 2, 2, 200, 24, 1
    trees = dict(t.split("=", 1) for t in args.trees.split(","))
    trees = {name: str((REPO / path).resolve()) for name, path in trees.items()}
    shapes = args.shapes.split(",")
    link = Link(latency_s=args.latency_ms / 1e3, conn_bytes_s=args.conn_mb * 1e6)
    log(f"load average {os.getloadavg()}")
    results: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="tidal-instant-") as tmpdir, S3Server() as s3:
        tmp = Path(tmpdir)
        s3.bucket(BUCKET)
        urls: dict[str, dict[str, str]] = {name: {} for name in trees}
        if "large" in shapes:
            data = large_corpus(tmp / "large", args.files, args.file_mb, args.group_docs)
            size = sum(p.stat().st_size for p in data.iterdir())
            log(
                f"large: {args.files} files, {size / 1e6:.0f} MB; the first block's slices need {needed(data) / 1e6:.0f} MB"
            )
            for name, tree in trees.items():  # each tree's own copy and index: an index is the tree's format
                urls[name]["large"] = s3.upload(data, BUCKET, f"{name}/large")
                publish(s3, urls[name]["large"], tree, tmp)
        if "start" in shapes:
            data = start_corpus(tmp / "start", args.objects, 20)
            size = sum(p.stat().st_size for p in data.iterdir())
            log(f"start: {args.objects} objects, {size / 1e6:.2f} MB, {size / args.objects / 1e3:.1f} KB each")
            for name, tree in trees.items():
                urls[name]["start"] = s3.upload(data, BUCKET, f"{name}/start")
                publish(s3, urls[name]["start"], tree, tmp)
        for rep in range(args.repeats):
            order = list(trees)
            order = order[rep % len(order) :] + order[: rep % len(order)]
            for name in order:
                if "large" in shapes:
                    for workers in args.workers:
                        key = f"large {name} workers={workers}"
                        results.setdefault(key, []).append(
                            measure_large(s3, urls[name]["large"], link, trees[name], workers, tmp)
                        )
                        log(f"{key}: {results[key][-1]}")
                if "start" in shapes:
                    key = f"start {name} ranks={args.ranks} batch={args.batch}"
                    results.setdefault(key, []).append(
                        measure_start(s3, urls[name]["start"], link, trees[name], args.ranks, args.batch, tmp)
                    )
                    got = results[key][-1]
                    files = {k: round(v * 1e6 / (size / args.objects), 1) for k, v in got.items()}
                    log(f"{key}: {got} (files: {files})")
    for key, runs in results.items():
        print(f"{key}: " + ", ".join(f"{k} {summary([r[k] for r in runs])}" for k in runs[0]))
    log(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
