#!/usr/bin/env python3
"""tidal next to LitData and Mosaic ``streaming``, reading from S3 over a realistic network.

Loopback has no latency and no bandwidth limit; a real store takes 10-100 ms to the first byte, gives each
connection 50-100 MB/s, and answers ``503 SlowDown`` above a request rate. Here moto's S3 server on 127.0.0.1
holds every loader's copy of the corpus (``bench_peers.py``'s copies, uploaded as its ``s3`` workload does), and
the tests' shaping proxy (``tests/fault_proxy.py`` with ``tests/shaping.py``) stands between it and the loaders,
one proxy per network:

- ``loopback``: the proxy shaping nothing: each loader as fast as this machine lets it (its own CPU is the limit);
- ``20ms``, ``80ms`` (``--latency-ms``): that long before the first byte of every answer; response bodies paced at
  ``--conn-mb`` MB/s per connection and ``--link-mb`` MB/s for all connections together, the link's capacity, which
  only ``link / conn`` requests in flight or more can fill;
- ``80ms throttled``: the same, and ``503 SlowDown`` (S3's XML error) above ``--throttle-rps`` requests a second
  per key prefix (each loader's copy is one prefix).

Every run is a fresh process with a fresh, empty cache directory: ``--workers`` DataLoader workers, batch
``--batch``, shuffled, the loaders built as in ``bench_peers.py``; the first batch, then ``--seconds`` of batches.
tidal's copies carry the index tidal publishes beside remote data (``.tidal-index.json``, as the peers' copies
carry theirs), so a job starts without reading the data; ``--index none`` leaves it out (tidal then fetches a
JSON lines copy whole before its first batch, to count its lines). Configurations are interleaved, each repetition
in a rotated order, and every figure is the median (range) of ``--repeats``, the load average beside it.

    .venv/bin/python bench/bench_shaped.py                 # 0.6 GB corpus, 4 networks x 4 loaders x 3 repeats
    .venv/bin/python bench/bench_shaped.py --quick         # ~0.03 GB, 1 repeat: only checks that it runs
    .venv/bin/python bench/bench_shaped.py --nets 80ms,80ms-throttled --loaders tidal-parquet,litdata --json out.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import peers
from common import log
from peers import corpus, harness, plan, s3, tables
from peers.report import tidal_commit, versions

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # the proxy and the S3 server the tests use

from fault_proxy import FaultProxy  # noqa: E402
from shaping import Link, Throttle, window  # noqa: E402

LOADERS = ("tidal-parquet", "tidal-jsonl", "litdata", "mosaic")
PLAIN = "plain GET"
TARGET_SHARE = 0.8
MIN_WINDOW_S = 1.0  # a sustained rate over less than this is not judged
PART = 16 << 20  # the plain GET's ranges, tidal's default part size


@dataclass(frozen=True)
class Net:
    """One network between the loaders and the store: a proxy of its own."""

    name: str
    link: Link | None
    rps: float | None = None  # 503 SlowDown above this many requests a second per prefix

    def describe(self) -> str:
        if self.link is None:
            return "no latency, no limit (the proxy only counts)"
        link = self.link
        text = f"{link.latency_s * 1e3:g} ms to the first byte, {(link.conn_bytes_s or 0) / 1e6:g} MB/s a connection, "
        text += f"{(link.link_bytes_s or 0) / 1e6:g} MB/s in all"
        return text + (f", 503 SlowDown above {self.rps:g} requests/s per prefix" if self.rps else "")

    def proxy(self, upstream: tuple[str, int]) -> FaultProxy:
        throttle = Throttle(rps=self.rps, per_prefix=1) if self.rps else None
        return FaultProxy(upstream, every=0, link=self.link, throttle=throttle)


def nets(args: argparse.Namespace) -> list[Net]:
    conn, link = args.conn_mb * 1e6, args.link_mb * 1e6
    out = [Net("loopback", None)]
    for ms in args.latency_ms:
        out.append(Net(f"{ms:g}ms", Link(latency_s=ms / 1e3, conn_bytes_s=conn, link_bytes_s=link)))
    ms = max(args.latency_ms)
    out.append(Net(f"{ms:g}ms-throttled", Link(ms / 1e3, conn, link), rps=args.throttle_rps))
    return out


# ----------------------------------------------------------------------------------------------------------------
# the store: bench_peers.py's server and copies, and tidal's index published beside its copies


def publish_indexes(server: dict[str, Any], root: Path, formats: list[str]) -> dict[str, int]:
    """tidal's index of each local copy, its versions made the objects' ETags, put beside the objects as
    ``.tidal-index.json``: what publishing an index of remote data leaves there. Entries by format."""
    import boto3

    from tidal.sources.index_file import INDEX_NAME, Entries, index_json

    client = boto3.client(
        "s3",
        endpoint_url=server["endpoint"],
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )
    out = {}
    for fmt in formats:
        local = root / fmt / INDEX_NAME
        table = Entries.parse(json.loads(local.read_bytes()))
        entries = {key: e for key in table.keys if (e := table.get(key)) is not None}
        listing = client.list_objects_v2(Bucket=s3.S3_BUCKET, Prefix=f"{fmt}/")["Contents"]
        etags = {o["Key"].removeprefix(f"{fmt}/"): o["ETag"].strip('"') for o in listing}
        published = {name: {**e, "version": etags[name]} for name, e in entries.items() if name in etags}
        client.put_object(Bucket=s3.S3_BUCKET, Key=f"{fmt}/{INDEX_NAME}", Body=index_json(published))
        out[fmt] = len(published)
    return out


# ----------------------------------------------------------------------------------------------------------------
# one measurement


class Sampler:
    """The proxy's counters every ``every`` seconds, with the wall clock, while a run lasts."""

    def __init__(self, proxy: FaultProxy, every: float = 0.05):
        self.proxy, self.every = proxy, every
        self.samples: list[tuple[float, dict[str, Any]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while True:
            self.samples.append((time.time(), self.proxy.traffic.snapshot()))
            if self._stop.wait(self.every):
                self.samples.append((time.time(), self.proxy.traffic.snapshot()))
                return

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def at(self, wall: float) -> dict[str, Any]:
        """The last sample taken at or before ``wall`` (the first one if none was)."""
        best = self.samples[0][1]
        for t, snap in self.samples:
            if t > wall:
                break
            best = snap
        return best


def figures(got: dict[str, Any], sampler: Sampler, copy_bytes: int, per_record: float) -> dict[str, Any]:
    """A run's figures from the child's result (its timeline of records) and the proxy's samples.

    fetch: the rate of the download while it runs, from 5% of the copy's bytes to 95% (or to the run's end
    for a loader that fetches as it goes); sustained: the records' rate over the batches after the first, up
    to 95% downloaded (after that the loader reads its cache, not the network)."""
    out = {k: v for k, v in got.items() if k != "timeline"}
    start, first = sampler.samples[0]
    last_t, last = sampler.samples[-1]
    whole = window(first, last)
    out.update(bytes_mb=whole["bytes_out"] / 1e6, requests=whole["requests"], throttled=whole["throttled"])
    out["gets"] = sum(v for k, v in whole["requests"].items() if k.startswith("GET"))

    def crossing(share: float) -> float | None:
        return next((t for t, s in sampler.samples if s["bytes_out"] - first["bytes_out"] >= share * copy_bytes), None)

    t5, t95 = crossing(0.05), crossing(0.95)
    out["downloaded_s"] = None if t95 is None else t95 - start  # 95% of the copy, from the run's start
    if t5 is not None and (t95 or last_t) - t5 >= MIN_WINDOW_S / 2:
        w = window(sampler.at(t5), sampler.at(t95 or last_t))
        out.update(fetch_mb_s=w["bytes_out_s"] / 1e6, in_flight=w["mean_in_flight"])
    marks = got.get("timeline")
    if not marks or "error" in got:
        return out
    t0 = marks[0][0]
    t1 = marks[-1][0] if t95 is None else min(marks[-1][0], t95)
    out["window_s"] = t1 - t0
    kept = [(t, n) for t, n in marks if t <= t1]
    if t1 - t0 < MIN_WINDOW_S or not kept or kept[-1][0] - t0 < MIN_WINDOW_S:
        return out  # its copy was on disk (almost) before its first batch: no network to measure
    tm, n = kept[-1]
    out["sustained_mb_s"] = n * per_record / (tm - t0) / 1e6
    return out


def run_loader(
    net: Net, proxy: FaultProxy, loader: str, server: dict[str, Any], manifest: dict[str, Any], args: argparse.Namespace
) -> dict[str, Any]:
    """One loader's run through ``proxy``, in a fresh process with a fresh cache."""
    fmt = peers.FORMAT_OF[loader]
    spec = harness.Spec(
        kind="text",
        loader=loader,
        root=str(Path(manifest["root"]) / fmt),
        workers=args.workers,
        batch=args.batch,
        seconds=args.seconds,
        seed=args.shuffle_seed,
        url=server["urls"][fmt],
        endpoint=proxy.endpoint,
    )
    copy_bytes = server["uploaded"][fmt]["bytes"]
    load = os.getloadavg()[0]
    with Sampler(proxy) as sampler:
        got = harness.run_s3_child(spec, args.timeout + args.seconds, server, Path(manifest["root"]) / "shaped-cache")
    out = figures(got, sampler, copy_bytes, copy_bytes / manifest["records"])
    out["load"] = load
    return shares(out, net)


def shares(out: dict[str, Any], net: Net) -> dict[str, Any]:
    """The rates of ``out`` as shares of the link's capacity."""
    capacity = net.link.link_bytes_s if net.link is not None else None
    for key in ("fetch", "sustained"):
        if capacity and out.get(f"{key}_mb_s") is not None:
            out[f"{key}_share"] = out[f"{key}_mb_s"] * 1e6 / capacity
    return out


def run_plain(net: Net, proxy: FaultProxy, server: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """boto3 GETs of 16 MiB ranges of the JSON lines copy, ``--plain-threads`` at a time, for ``--seconds``
    at most: what the link gives a client that keeps that many requests in flight."""
    import boto3
    from botocore.config import Config

    config = Config(max_pool_connections=args.plain_threads, retries={"total_max_attempts": 1})
    client = boto3.client(
        "s3",
        endpoint_url=proxy.endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
        config=config,
    )
    fmt = "jsonl"
    listing = client.list_objects_v2(Bucket=s3.S3_BUCKET, Prefix=f"{fmt}/")["Contents"]
    ranges = iter(
        [(o["Key"], a, min(a + PART, o["Size"]) - 1) for o in listing if o["Key"].endswith(".jsonl") for a in range(0, o["Size"], PART)]
    )  # fmt: skip
    lock = threading.Lock()
    load = os.getloadavg()[0]
    deadline = time.perf_counter() + args.seconds

    def worker() -> int:
        n = 0
        while time.perf_counter() < deadline:
            with lock:
                r = next(ranges, None)
            if r is None:
                break
            body = client.get_object(Bucket=s3.S3_BUCKET, Key=r[0], Range=f"bytes={r[1]}-{r[2]}")["Body"]
            n += len(body.read())
        return n

    before = proxy.traffic.snapshot()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.plain_threads) as pool:
        moved = sum(pool.map(lambda _: worker(), range(args.plain_threads)))
    elapsed = time.perf_counter() - t0
    w = window(before, proxy.traffic.snapshot())
    out: dict[str, Any] = {"fetch_mb_s": moved / elapsed / 1e6, "in_flight": w["mean_in_flight"]}
    out.update(bytes_mb=moved / 1e6, gets=w["requests"].get("GET range", 0), throttled=w["throttled"], load=load)
    return shares(out, net)


# ----------------------------------------------------------------------------------------------------------------
# the run


@dataclass(frozen=True)
class Job:
    net: Net
    loader: str

    @property
    def name(self) -> str:
        return f"{self.net.name} {self.loader}"


def jobs_of(net_list: list[Net], loaders: list[str]) -> list[Job]:
    out = []
    for net in net_list:
        out += [Job(net, x) for x in loaders]
        if net.rps is None:  # a plain client has no retries of its own here: not through the throttle
            out.append(Job(net, PLAIN))
    return out


def run_all(args: argparse.Namespace, manifest: dict[str, Any], loaders: list[str], net_list: list[Net]) -> dict:
    root = Path(manifest["root"])
    with contextlib.ExitStack() as stack:
        log("starting moto's S3 server on 127.0.0.1 and uploading every loader's copy ...")
        server = stack.enter_context(s3.s3_server(root, (peers.FORMAT_OF[x] for x in loaders)))
        tidal_formats = sorted({peers.FORMAT_OF[x] for x in loaders if x in peers.TIDAL})
        published = publish_indexes(server, root, tidal_formats) if args.index == "published" else {}
        port = int(server["endpoint"].rsplit(":", 1)[1])
        proxies = {n.name: stack.enter_context(n.proxy(("127.0.0.1", port))) for n in net_list}
        jobs = jobs_of(net_list, loaders)
        runs: dict[str, list[dict[str, Any]]] = {j.name: [] for j in jobs}
        for rep in range(args.repeats):
            order = plan.rotated(jobs, rep, args.repeats)
            for i, job in enumerate(order):
                log(f"[{rep + 1}/{args.repeats} {i + 1}/{len(order)}] {job.name} (load {os.getloadavg()[0]:.2f}) ...")
                proxy = proxies[job.net.name]
                if job.loader == PLAIN:
                    got = run_plain(job.net, proxy, server, args)
                else:
                    got = run_loader(job.net, proxy, job.loader, server, manifest, args)
                runs[job.name].append(got)
                log("    " + brief(got))
        shutil.rmtree(root / "shaped-cache", ignore_errors=True)
        return {
            "runs": runs,
            "nets": {n.name: n.describe() for n in net_list},
            "published_index_entries": published,
            "s3": {k: v for k, v in server.items() if k != "log"},
        }


def brief(got: dict[str, Any]) -> str:
    if "error" in got:
        return got["error"][:300]
    parts = []
    if got.get("first_batch_from_start_s") is not None:
        parts.append(f"first batch {got['first_batch_from_start_s']:.2f} s")
    if got.get("fetch_mb_s") is not None:
        parts.append(f"fetch {got['fetch_mb_s']:.1f} MB/s with {got['in_flight']:.1f} requests in flight")
    if got.get("sustained_mb_s") is not None:
        parts.append(f"sustained {got['sustained_mb_s']:.1f} MB/s")
    elif "window_s" in got:
        parts.append(f"no sustained figure ({got['window_s']:.2f} s of batches before 95% was downloaded)")
    parts.append(f"{got.get('gets', 0)} GETs, {got.get('throttled', 0)} answered 503, {got.get('bytes_mb', 0):.0f} MB")
    return "; ".join(parts)


# ----------------------------------------------------------------------------------------------------------------
# the report


def _median(runs: list[dict[str, Any]], key: str) -> dict[str, Any]:
    return tables.summary([r for r in runs if r.get(key) is not None] or runs, key)


def show(s: dict[str, Any]) -> str:
    return "-" if "error" in s else tables.cell(s, "s")


def report(res: dict[str, Any], loaders: list[str], net_list: list[Net], args: argparse.Namespace) -> tuple[str, list]:
    runs = res["runs"]
    lines, targets = [], []
    tidal = [x for x in peers.TIDAL if x in loaders]
    for net in net_list:
        names = [*loaders, *([PLAIN] if net.rps is None else [])]

        def of(x: str, key: str, net: Net = net) -> dict[str, Any]:
            return _median(runs[f"{net.name} {x}"], key)

        rows = []
        for x in names:
            got = runs[f"{net.name} {x}"]
            gets = statistics.median([g.get("gets", 0) for g in got])
            throttled = statistics.median([g.get("throttled", 0) for g in got])
            rows.append(
                [
                    x,
                    show(of(x, "first_batch_from_start_s")) if x != PLAIN else "",
                    show(of(x, "fetch_mb_s")),
                    show(of(x, "fetch_share")),
                    show(of(x, "in_flight")),
                    show(of(x, "sustained_mb_s")),
                    show(of(x, "sustained_share")),
                    "-" if "error" in of(x, "rate") else tables.cell(of(x, "rate"), "rate"),
                    f"{gets:.0f} / {throttled:.0f}",
                    show(of(x, "bytes_mb")),
                    f"{sum('error' in g for g in got)} of {len(got)}",
                    show(of(x, "load")),
                ]
            )
        first = {x: tables.med(of(x, "first_batch_from_start_s")) for x in loaders}
        fetch = {x: tables.med(of(x, "fetch_share")) for x in loaders}
        sustained = {x: tables.med(of(x, "sustained_share")) for x in loaders}
        for label, lower, col in (
            ("first batch", True, first),
            ("fetch", False, fetch),
            ("sustained", False, sustained),
        ):
            for t in tidal:
                b, mine = tables.best(col, lower), col.get(t)
                ratio = f"{mine / b[1]:.2f}x ({b[0]})" if b and mine is not None and b[1] else "-"
                rows.append([f"{t} ÷ best peer, {label}", ratio])
        table = tables.Table(
            f"from S3 over a shaped link: {net.name} ({net.describe()})",
            [
                "loader",
                "1st batch from start, s",
                "fetch MB/s",
                "÷ link",
                "in flight",
                "sustained MB/s",
                "÷ link",
                "records/s",
                "GETs / 503s per run",
                "MB downloaded",
                "failed",
                "load avg",
            ],
            rows,
            [
                f"{args.workers} DataLoader workers, batch {args.batch}, shuffled, a fresh process and an empty cache per run;",
                f"median (range) of {args.repeats}; load avg: the 1-minute load average as each run started.",
                "fetch: bytes the proxy sent per second while the loader downloaded (5% to 95% of its copy, or 5% to the run's",
                "end); in flight: the mean number of its requests meanwhile. sustained: records/s x the copy's bytes per record,",
                "over the batches after the first while 5% or more of the copy was still to come; ÷ link: over the link's capacity.",
                "records/s: over all the batches after the first, from the network or from the cache.",
                f"{PLAIN}: boto3 GETs of 16 MiB ranges of the JSON lines copy, {args.plain_threads} at a time.",
            ],
        )
        for x in names:  # why a run failed: its exception line, once per distinct one
            errors = Counter(g["error"].removeprefix("failed: ")[:200] for g in runs[f"{net.name} {x}"] if "error" in g)
            table.notes += [f"{x} failed {n} time{'s' if n > 1 else ''}: {e}" for e, n in errors.items()]
        if net.link is not None:
            for t in tidal:
                what = f"{net.name}: {t} fetch >= {TARGET_SHARE} of the link"
                table.targets.append(tables.check("shaped", what, fetch.get(t), TARGET_SHARE, False, "s"))
        b = tables.best(first, True)
        for t in tidal:
            what = f"{net.name}: {t} first batch no later than the best peer ({b[0] if b else '-'})"
            table.targets.append(tables.check("shaped", what, first.get(t), b and b[1], True, "s"))
        if net.rps is not None:
            for t in tidal:
                got = runs[f"{net.name} {t}"]
                failed = sum("error" in g for g in got)
                what = f"{net.name}: {t} no failed run under throttling"
                table.targets.append(tables.Target("shaped", what, f"{failed} of {len(got)} failed", failed == 0))
        targets += table.targets
        lines.append(table.text())
    return "\n".join(lines), targets


def header(res: dict[str, Any], manifest: dict[str, Any], args: argparse.Namespace) -> str:
    v = res["versions"]
    load0, load1 = res["loadavg_start"], res["loadavg_end"]
    up = res["s3"].get("uploaded", {})
    copies = ", ".join(f"{fmt} {u['bytes'] / 1e6:,.0f} MB in {u['objects']} objects" for fmt, u in up.items())
    index = (
        "tidal's copies carry a published .tidal-index.json ("
        + ", ".join(f"{f}: {n} entries" for f, n in res["published_index_entries"].items())
        + ")"
        if res["published_index_entries"]
        else "no published tidal index: tidal indexes each copy at the start of every run"
    )
    return "\n".join(
        [
            f"tidal {v['tidal']} at {res['commit']}; mosaicml-streaming {v['mosaicml-streaming']}, litdata {v['litdata']},"
            f" moto {v['moto']}, obstore {v['obstore']}, s3fs {v['s3fs']}",
            f"machine: {res['cpus']} CPUs; load average {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f} at the start, "
            f"{load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f} at the end; whole run {res['total_s']:.0f} s",
            f"corpus: gen_corpus.py --total-gb {args.total_gb:g} --shards {args.shards} --seed {args.seed}: "
            f"{manifest['records']:,} records; on moto: {copies}",
            index,
            *(f"net {name}: {text}" for name, text in res["nets"].items()),
        ]
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--data", default=str(REPO / "bench-data" / "peers"), help="bench_peers.py's corpus cache")
    ap.add_argument("--corpus-script", default=str(REPO.parent / "shared" / "bench" / "gen_corpus.py"))
    ap.add_argument("--total-gb", type=float, default=None, help="corpus size in GB of JSONL (default 0.6)")
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--shuffle-seed", type=int, default=1)
    ap.add_argument("--row-group", type=int, default=10_000)
    ap.add_argument("--shard-mb", type=float, default=None, help="LitData chunk and MDS shard size (default 32)")
    ap.add_argument("--loaders", default=",".join(LOADERS), help=f"subset of {','.join(LOADERS)}")
    ap.add_argument("--nets", default=None, help="subset of loopback,20ms,80ms,80ms-throttled (default: all)")
    ap.add_argument("--latency-ms", default="20,80", help="time to the first byte of each shaped net (default 20,80)")
    ap.add_argument("--conn-mb", type=float, default=12.5, help="MB/s of one connection (default 12.5)")
    ap.add_argument("--link-mb", type=float, default=50.0, help="MB/s of all connections together (default 50)")
    ap.add_argument("--throttle-rps", type=float, default=4.0, help="requests/s per prefix before 503 (default 4)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--seconds", type=float, default=None, help="batches after the first, per run (default 10)")
    ap.add_argument("--repeats", type=int, default=None, help="interleaved repetitions (default 3)")
    ap.add_argument("--plain-threads", type=int, default=8)
    ap.add_argument("--index", choices=("published", "none"), default="published")
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds before a run is abandoned (+ --seconds)")
    ap.add_argument("--quick", action="store_true", help="~0.03 GB corpus, 3 s, 1 repeat: checks that it runs")
    ap.add_argument("--json", default=None, help="also write every figure to this file")
    args = ap.parse_args(argv)
    defaults = {"total_gb": 0.03 if args.quick else 0.6, "shard_mb": 2.0 if args.quick else 32.0}
    defaults |= {"seconds": 3.0 if args.quick else 10.0, "repeats": 1 if args.quick else 3}
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    args.latency_ms = [float(x) for x in str(args.latency_ms).split(",") if x.strip()]
    args.vocab, args.train_mb = 32_000, 50.0  # what peers.corpus.prepare reads; no tokenizer is trained here
    return args


def main() -> None:
    args = parse_args()
    loaders = plan.subset(args.loaders, LOADERS, "loader")
    net_list = nets(args)
    if args.nets:
        wanted = plan.subset(args.nets, tuple(n.name for n in net_list), "net")
        net_list = [n for n in net_list if n.name in wanted]
    t0 = time.perf_counter()
    load0 = os.getloadavg()
    manifest = corpus.prepare(args, list(loaders), need_tokenizer=False)
    res: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "commit": tidal_commit(),
        "versions": versions(),
        "cpus": os.cpu_count(),
        "loadavg_start": load0,
        "args": vars(args),
        **run_all(args, manifest, list(loaders), net_list),
    }
    res["loadavg_end"] = os.getloadavg()
    res["total_s"] = time.perf_counter() - t0
    text, targets = report(res, list(loaders), net_list, args)
    res["targets"] = [t.__dict__ for t in targets]
    print(header(res, manifest, args) + "\n" + text + "\n\n" + tables.tally(targets))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(res, indent=1, default=str))
        print(f"\nall figures: {args.json}")


if __name__ == "__main__":
    main()
