#!/usr/bin/env python3
"""Remote reads through tidal's shard cache, next to plain clients of the same S3 server.

moto's S3 server runs in its own process on 127.0.0.1 (loopback: no network in the way, so
the figures are about client overhead and the server, not bandwidth). The corpus comes from
the shared generator (``gen_corpus.py``) as ``.jsonl.zst`` and Parquet copies, cached under
``--data``, and is uploaded to the server at the start of every run.

    .venv/bin/python bench/bench_s3.py                  # ~0.25 GB corpus, a few minutes
    .venv/bin/python bench/bench_s3.py --quick          # smaller, one repeat
    .venv/bin/python bench/bench_s3.py --json out.json  # also write every figure

What it measures (MB = 1e6 bytes of shard files as stored):

1. The ceiling: a plain parallel GET of every shard with boto3 (``--parallel`` threads).
2. The two S3 clients tidal can use, through fsspec: s3fs and obstore; whole shards
   (``cat_file``, parallel) and 1 MiB range reads (parallel, with their latency).
3. tidal's download path: every shard fetched into an empty shard cache (ranged parts,
   checked against the index's hash, placed atomically), per client: with the xxh3-128
   hashes tidal records, with SHA-256 (as a published index may carry), and with none. The
   ratio to the plain GET is the target (>= 0.8x); the plain GET with each body written to a
   file is the least any disk cache does, the fairer baseline. Every way runs once per
   round, the rounds ``--repeats`` times; ratios are taken within a round.
4. tidal end to end: a shuffled epoch with a cold cache (records/s, MB/s, the time the reader
   waited on I/O), the same epoch with a warm cache (the parsing ceiling), and the time to
   the first batch with a cold cache, iterated directly and through a DataLoader with 2 workers.
5. Peers reading the same objects from the same server: HF ``datasets`` streaming (Parquet
   and JSON lines, through fsspec). Mosaic ``streaming`` (imported as ``streaming.base``) and
   LitData read only their own formats (MDS shards, optimized chunks), not these objects: they
   are measured by ``bench_peers.py --workloads s3``, which puts every peer's native copy of
   one corpus on moto's S3 server and reads each from there, tidal beside them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from common import log

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # the S3 server helper the tests use
sys.path.insert(0, str(REPO / "src"))

from s3_server import S3Server  # noqa: E402

FORMATS = {"jsonl.zst": "jsonl_zst", "parquet": "parquet"}


# ----------------------------------------------------------------------------------------------------------------
# the corpus


def prepare(args: argparse.Namespace) -> Path:
    """The corpus as .jsonl.zst and Parquet shards under ``--data``; made once per set of parameters."""
    import orjson
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    data = Path(args.data)
    wanted = {"total_gb": args.total_gb, "shards": args.shards, "seed": 1234, "version": 1}
    manifest = data / "manifest.json"
    with contextlib.suppress(OSError, ValueError):
        if json.loads(manifest.read_text()) == wanted:
            return data
    shutil.rmtree(data, ignore_errors=True)
    script = Path(args.corpus_script)
    if not script.is_file():
        sys.exit(f"corpus generator not found: {script} (pass --corpus-script)")
    log(f"generating {args.total_gb} GB in {args.shards} shards into {data}")
    raw = data / "jsonl"
    cmd = [sys.executable, str(script), str(raw), "--total-gb", str(args.total_gb), "--shards", str(args.shards)]
    subprocess.run(cmd, check=True, stdout=sys.stderr)
    for d in FORMATS.values():
        (data / d).mkdir(parents=True)
    zstd = zstandard.ZstdCompressor(level=3)
    for src in sorted(raw.glob("*.jsonl")):
        body = src.read_bytes()
        (data / FORMATS["jsonl.zst"] / f"{src.name}.zst").write_bytes(zstd.compress(body))
        recs = [orjson.loads(line) for line in body.splitlines() if line]
        table = pa.table({"id": [r["id"] for r in recs], "text": [r["text"] for r in recs]})
        pq.write_table(table, data / FORMATS["parquet"] / f"{src.stem}.parquet", row_group_size=10_000)
    shutil.rmtree(raw)
    manifest.write_text(json.dumps(wanted))
    return data


def upload(s3: S3Server, data: Path) -> dict[str, str]:
    """Every copy of the corpus to the server; ``{format: URL of its prefix}``."""
    bucket = s3.bucket("bench")
    urls = {}
    for fmt, sub in FORMATS.items():
        urls[fmt] = s3.upload(data / sub, bucket, sub)
    return urls


def objects(s3: S3Server, url: str) -> list[tuple[str, int]]:
    bucket, prefix = url[len("s3://") :].split("/", 1)
    listing = s3.client.list_objects_v2(Bucket=bucket, Prefix=prefix + "/")
    return [(f"s3://{bucket}/{o['Key']}", int(o["Size"])) for o in listing["Contents"]]


# ----------------------------------------------------------------------------------------------------------------
# measurements


Moved = tuple[int, float]  # bytes moved, seconds it took (set-up and clean-up not counted)


def in_pool(parallel: int, fn: Callable[[Any], int], items: list[Any]) -> Moved:
    with ThreadPoolExecutor(parallel) as pool:
        list(pool.map(lambda _: None, range(parallel)))  # threads started before the clock
        t0 = time.perf_counter()
        n = sum(pool.map(fn, items))
        return n, time.perf_counter() - t0


def plain_get(s3: S3Server, objs: list[tuple[str, int]], parallel: int) -> Moved:
    def get(o: tuple[str, int]) -> int:
        bucket, key = o[0][len("s3://") :].split("/", 1)
        return len(s3.client.get_object(Bucket=bucket, Key=key)["Body"].read())

    return in_pool(parallel, get, objs)


def filesystem(backend: str, s3: S3Server) -> Any:
    from tidal.storage import Storage
    from tidal.storage.fs import Remote

    return Remote("s3", Storage(options=s3.options(), backend=backend), data=True)


def client_whole(remote: Any, objs: list[tuple[str, int]], parallel: int) -> Moved:
    fs = remote.fs
    return in_pool(parallel, lambda o: len(fs.cat_file(remote.path(o[0]))), objs)


def client_ranges(remote: Any, objs: list[tuple[str, int]], parallel: int, count: int) -> tuple[Moved, list[float]]:
    fs, rng, size = remote.fs, random.Random(0), 1 << 20
    ranges = []
    for _ in range(count):
        url, n = objs[rng.randrange(len(objs))]
        start = rng.randrange(max(1, n - size))
        ranges.append((remote.path(url), start, min(n, start + size)))
    latencies: list[float] = []

    def get(r: tuple[str, int, int]) -> int:
        t0 = time.perf_counter()
        data = fs.cat_file(r[0], start=r[1], end=r[2])
        latencies.append(time.perf_counter() - t0)
        return len(data)

    return in_pool(parallel, get, ranges), latencies


def tidal_fill(s3: S3Server, backend: str, objs: list[tuple[str, int]], parallel: int, hashes: dict[str, str]) -> Moved:
    """Every shard into an empty cache through tidal's download path: ranged parts, the hash the
    index has checked, preallocated and placed atomically, under the cache's locks."""
    from tidal.storage import Storage
    from tidal.storage.cache import Entry
    from tidal.storage.fetch import Fetcher

    with tempfile.TemporaryDirectory() as tmp:
        fetcher = Fetcher(Storage(options=s3.options(), cache_dir=tmp, backend=backend, parallel=4))
        try:

            def one(o: tuple[str, int, int]) -> int:
                with fetcher.acquire(Entry(o[0], o[1], f"bench-{o[2]}", hashes.get(o[0]))) as h:
                    return h.path.stat().st_size

            return in_pool(parallel, one, [(u, n, i) for i, (u, n) in enumerate(objs)])  # as wide as the plain GET
        finally:
            fetcher.close()


def plain_get_to_files(s3: S3Server, objs: list[tuple[str, int]], parallel: int) -> Moved:
    """The plain GET, each body written to a file: the least any disk cache must do."""
    with tempfile.TemporaryDirectory() as tmp:

        def get(o: tuple[str, int, int]) -> int:
            bucket, key = o[0][len("s3://") :].split("/", 1)
            body = s3.client.get_object(Bucket=bucket, Key=key)["Body"].read()
            Path(tmp, str(o[2])).write_bytes(body)
            return len(body)

        return in_pool(parallel, get, [(u, n, i) for i, (u, n) in enumerate(objs)])


def index_hashes(data: Path, objs: list[tuple[str, int]], algorithm: str) -> dict[str, str]:
    """The hashes an index would carry for these objects: computed from the local copies."""
    from tidal.storage.digests import file_digest

    return {u: file_digest(data.joinpath(*u.split("/")[-2:]), algorithm) for u, _ in objs}


def rounds(
    s3: S3Server, objs: list[tuple[str, int]], hashes: dict[str, dict[str, str]], args: argparse.Namespace
) -> dict:
    """Each way of moving the same bytes, one after the other, ``--repeats`` times over.

    Ratios are taken within a round (the plain GET of that round), so drift between rounds
    (another process on a 2-core machine) cancels out; the medians over rounds are reported."""
    ways: dict[str, Callable[[], Moved]] = {"plain_get": lambda: plain_get(s3, objs, args.parallel)}
    ways["plain_get_to_files"] = lambda: plain_get_to_files(s3, objs, args.parallel)
    for backend in ("s3fs", "obstore"):
        remote = filesystem(backend, s3)
        ways[f"{backend}_whole"] = lambda r=remote: client_whole(r, objs, args.parallel)
        ways[f"{backend}_tidal_fill"] = lambda b=backend: tidal_fill(s3, b, objs, args.parallel, hashes["xxh3_128"])
    ways["obstore_tidal_fill_sha256"] = lambda: tidal_fill(s3, "obstore", objs, args.parallel, hashes["sha256"])
    ways["obstore_tidal_fill_unhashed"] = lambda: tidal_fill(s3, "obstore", objs, args.parallel, {})
    for fn in ways.values():  # connections and clients up before anything is timed
        fn()
    rates: dict[str, list[float]] = {k: [] for k in ways}
    for _ in range(args.repeats):
        for name, fn in ways.items():
            n, seconds = fn()
            rates[name].append(n / 1e6 / seconds)
    out: dict[str, Any] = {k: {"mb_s": statistics.median(v), "all": v} for k, v in rates.items()}
    for k in rates:
        out[k]["vs_plain_get"] = statistics.median(a / b for a, b in zip(rates[k], rates["plain_get"], strict=True))
    return out


def clear_shards(cache: Path) -> None:
    shutil.rmtree(cache / "shards", ignore_errors=True)


def epoch(ds: Any, seconds: float) -> dict[str, float]:
    """Records/s of a shuffled epoch (up to ``seconds``), and the reader's I/O counters."""
    it = ds.iterator()
    t0 = time.perf_counter()
    n = 0
    for batch in it:
        n += len(batch["id"])
        if time.perf_counter() - t0 > seconds:
            break
    dt = time.perf_counter() - t0
    stats = it.stats()
    it.close()
    return {"records_s": n / dt, "records": n, "seconds": dt, "io_wait_s": stats.get("io_wait_s", 0.0), **stats}


def first_batch(ds: Any, workers: int | None) -> float:
    t0 = time.perf_counter()
    if workers is None:
        it = iter(ds)
        next(it)
        it.close()
    else:
        import tidal

        loader = tidal.DataLoader(ds, num_workers=workers)
        it = iter(loader)
        next(it)
        del it
    return time.perf_counter() - t0


def hf_streaming(s3: S3Server, url: str, fmt: str, seconds: float) -> dict[str, float] | str:
    """HF ``datasets`` streaming of the same objects (its own shuffle buffer of 1000), records/s."""
    try:
        import datasets
    except ImportError:
        return "not installed"
    opts = {"key": s3.options()["key"], "secret": s3.options()["secret"], "endpoint_url": s3.endpoint}
    files = [u for u, _ in objects(s3, url)]
    try:
        ds = datasets.load_dataset(fmt, data_files=files, split="train", streaming=True, storage_options=opts)
        ds = ds.shuffle(seed=0, buffer_size=1000)
        t0 = time.perf_counter()
        n = 0
        for _ in ds:
            n += 1
            if time.perf_counter() - t0 > seconds:
                break
        return {"records_s": n / (time.perf_counter() - t0), "records": n}
    except Exception as exc:  # a peer's failure is a finding, not a crash of the benchmark
        return f"failed: {type(exc).__name__}: {str(exc)[:200]}"


# ----------------------------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(REPO / "bench-data" / "s3"))
    ap.add_argument("--corpus-script", default=str(REPO.parent / "shared" / "bench" / "gen_corpus.py"))
    ap.add_argument("--total-gb", type=float, default=0.25)
    ap.add_argument("--shards", type=int, default=16)
    ap.add_argument("--parallel", type=int, default=8, help="threads of the plain GET and the clients")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--pass-mb", type=float, default=400, help="bytes one throughput measurement moves")
    ap.add_argument("--seconds", type=float, default=20.0, help="at most this long per epoch measured")
    ap.add_argument("--quick", action="store_true", help="--total-gb 0.1 --repeats 1 --seconds 8")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.quick:
        args.total_gb, args.repeats, args.seconds, args.pass_mb = min(args.total_gb, 0.1), 1, 8.0, 200
        args.data = str(Path(args.data).with_name("s3-quick"))

    import tidal
    from tidal.storage import Storage

    data = prepare(args)
    out: dict[str, Any] = {"params": vars(args), "load": os.getloadavg()}
    with S3Server() as s3:
        log(f"moto S3 server at {s3.endpoint}; uploading")
        urls = upload(s3, data)
        for fmt, url in urls.items():
            objs = objects(s3, url)
            total = sum(n for _, n in objs)
            res: dict[str, Any] = {"shards": len(objs), "mb": total / 1e6}
            log(f"[{fmt}] {len(objs)} shards, {total / 1e6:.1f} MB")
            many = objs * max(1, int(args.pass_mb * 1e6 // total))  # each measurement moves ~pass_mb
            hashes = {a: index_hashes(data, objs, a) for a in ("xxh3_128", "sha256")}
            res["rounds"] = rounds(s3, many, hashes, args)
            res["ranges_1mib"] = {}
            for backend in ("s3fs", "obstore"):
                remote = filesystem(backend, s3)
                client_ranges(remote, objs, args.parallel, count=16)  # connections up, before the clock
                (moved, seconds), lat = client_ranges(remote, objs, args.parallel, count=256)
                res["ranges_1mib"][backend] = {"mb_s": moved / 1e6 / seconds, "p50_ms": 1e3 * statistics.median(lat)}
            # end to end, with the default client
            with tempfile.TemporaryDirectory() as tmp:
                settings = Storage(options=s3.options(), cache_dir=tmp)
                ds = tidal.Dataset(url, columns=["id", "text"], storage=settings).shuffle(seed=0).repeat().batch(8)
                cold_runs, first = [], []
                for _ in range(args.repeats):
                    clear_shards(Path(tmp))
                    cold_runs.append(epoch(ds, args.seconds))
                warm = epoch(ds, args.seconds)
                for workers in (None, 2):
                    times = []
                    for _ in range(args.repeats):
                        clear_shards(Path(tmp))
                        times.append(first_batch(ds, workers))
                    first.append(statistics.median(times))
            cold = sorted(cold_runs, key=lambda r: r["records_s"])[len(cold_runs) // 2]
            mb_per_record = total / 1e6 / ds.num_records
            res["tidal_cold_epoch"] = {**cold, "mb_s": cold["records_s"] * mb_per_record}
            res["tidal_warm_epoch"] = {**warm, "mb_s": warm["records_s"] * mb_per_record}
            res["first_batch_cold_s"] = {"iterate": first[0], "dataloader_2_workers": first[1]}
            out[fmt] = res
        out["peers"] = {
            "hf_datasets_streaming_parquet": hf_streaming(s3, urls["parquet"], "parquet", args.seconds),
            "hf_datasets_streaming_jsonl_zst": hf_streaming(s3, urls["jsonl.zst"], "json", args.seconds),
            "mosaic_streaming": "not here (reads only MDS shards): bench_peers.py --workloads s3",
            "litdata": "not here (reads only its optimized chunks): bench_peers.py --workloads s3",
        }
    out["load_end"] = os.getloadavg()
    report(out)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2, default=str))


def report(out: dict[str, Any]) -> None:
    print(f"load average at start {out['load'][0]:.2f}, at end {out['load_end'][0]:.2f}")
    names = {
        "plain_get": "plain parallel GET (boto3), in memory",
        "plain_get_to_files": "plain parallel GET, written to files",
        "s3fs_whole": "s3fs cat_file of whole shards",
        "obstore_whole": "obstore cat_file of whole shards",
        "s3fs_tidal_fill": "tidal into its cache, s3fs",
        "obstore_tidal_fill": "tidal into its cache, obstore",
        "obstore_tidal_fill_sha256": "same, checking SHA-256, not xxh3-128",
        "obstore_tidal_fill_unhashed": "same, no hash in the index to check",
    }
    for fmt in FORMATS:
        r = out[fmt]
        print(f"\n## {fmt}: {r['shards']} shards, {r['mb']:.1f} MB on moto (loopback); medians of rounds")
        for key, label in names.items():
            v = r["rounds"][key]
            files = v["mb_s"] / r["rounds"]["plain_get_to_files"]["mb_s"]
            print(f"{label:40} {v['mb_s']:8.1f} MB/s  {v['vs_plain_get']:5.2f}x plain GET  {files:5.2f}x GET to files")
        for backend, v in r["ranges_1mib"].items():
            print(f"{backend + ' 1 MiB ranges':40} {v['mb_s']:8.1f} MB/s  p50 {v['p50_ms']:.1f} ms")
        c, w = r["tidal_cold_epoch"], r["tidal_warm_epoch"]
        print(
            f"{'tidal shuffled epoch, cold cache':40} {c['mb_s']:8.1f} MB/s  {c['records_s']:9,.0f} rec/s  "
            f"{c['records_s'] / w['records_s']:.2f}x warm; waited on I/O {c['io_wait_s']:.2f} of {c['seconds']:.1f} s"
        )
        print(f"{'tidal shuffled epoch, warm cache':40} {w['mb_s']:8.1f} MB/s  {w['records_s']:9,.0f} rec/s")
        f = r["first_batch_cold_s"]
        print(
            f"first batch, cold cache: iterate {f['iterate']:.2f} s, DataLoader(2 workers) {f['dataloader_2_workers']:.2f} s"
        )
    print("\n## peers on the same server")
    for name, v in out["peers"].items():
        print(f"{name:34} {v if isinstance(v, str) else format(v['records_s'], ',.0f') + ' rec/s'}")


if __name__ == "__main__":
    main()
