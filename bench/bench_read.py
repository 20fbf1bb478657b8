#!/usr/bin/env python3
"""Read throughput, time to the first batch and resume cost of tidal, next to plain readers of the same files.

The corpus comes from the shared generator (``gen_corpus.py``, the one PEERS.md was measured on) and is
cached under ``--data``: the generator's JSONL shards, a ``.jsonl.zst`` copy and a Parquet copy (columns
``id`` and ``text``). Every measurement runs in a fresh Python process, so peak RSS and the time to the first
batch after process start are per measurement. Each run is bounded by ``--seconds`` and ``--max-records``.

    .venv/bin/python bench/bench_read.py                  # 0.5 GB corpus, ~10 s per measurement
    .venv/bin/python bench/bench_read.py --quick          # ~3 s per measurement, fewer rows
    .venv/bin/python bench/bench_read.py --json out.json  # also write every figure as JSON

Rates are steady-state: records (and text bytes) after the first batch divided by the time after it.
MB/s counts the characters of the ``text`` column (the corpus is ASCII, so they are its UTF-8 bytes), 1 MB = 1e6.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import math
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from common import batch_ids, log, resume_points, sha1

REPO = Path(__file__).resolve().parent.parent
COLUMNS = ["id", "text"]
# format name -> sub-directory of --data holding that copy of the corpus
FORMATS = {"parquet": "parquet", "jsonl.zst": "jsonl_zst"}
DATA_VERSION = 1


# ----------------------------------------------------------------------------------------------------------------
# the corpus


def prepare(args: argparse.Namespace) -> dict[str, Any]:
    """Generate the JSONL corpus and its two copies once; reuse them while the parameters are unchanged."""
    import orjson
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    data = Path(args.data)
    script = Path(args.corpus_script)
    if not script.is_file():
        sys.exit(f"corpus generator not found: {script} (pass --corpus-script)")
    wanted = {
        "version": DATA_VERSION,
        "generator_sha1": sha1(script),
        "total_gb": args.total_gb,
        "shards": args.shards,
        "seed": args.seed,
        "row_group": args.row_group,
        "parquet_compression": args.parquet_compression,
        "zstd_level": args.zstd_level,
    }
    manifest = data / "manifest.json"
    with contextlib.suppress(OSError, ValueError):
        saved = json.loads(manifest.read_text())
        if saved.get("params") == wanted and all((data / d).is_dir() for d in [*FORMATS.values(), "jsonl"]):
            return dict(saved["facts"])

    for sub in [*FORMATS.values(), "jsonl"]:
        shutil.rmtree(data / sub, ignore_errors=True)
    manifest.unlink(missing_ok=True)
    data.mkdir(parents=True, exist_ok=True)
    log(f"generating the corpus into {data / 'jsonl'} ({args.total_gb} GB, {args.shards} shards, seed {args.seed})")
    t0 = time.perf_counter()
    cmd = [sys.executable, str(script), str(data / "jsonl"), "--total-gb", str(args.total_gb)]
    cmd += ["--shards", str(args.shards), "--seed", str(args.seed)]
    subprocess.run(cmd, check=True, stdout=sys.stderr)
    t_gen = time.perf_counter() - t0

    log("writing the .jsonl.zst and Parquet copies")
    t0 = time.perf_counter()
    (data / FORMATS["jsonl.zst"]).mkdir()
    (data / FORMATS["parquet"]).mkdir()
    records = text_bytes = text_chars = jsonl_bytes = zst_bytes = pq_bytes = 0
    compressor = zstandard.ZstdCompressor(level=args.zstd_level)
    for src in sorted((data / "jsonl").glob("*.jsonl")):
        raw = src.read_bytes()
        jsonl_bytes += len(raw)
        zst = data / FORMATS["jsonl.zst"] / (src.name + ".zst")
        zst.write_bytes(compressor.compress(raw))
        zst_bytes += zst.stat().st_size
        ids: list[int] = []
        texts: list[str] = []
        for line in raw.splitlines():
            if line:
                rec = orjson.loads(line)
                ids.append(rec["id"])
                texts.append(rec["text"])
        del raw
        records += len(texts)
        text_chars += sum(map(len, texts))
        text_bytes += sum(len(t.encode()) for t in texts)
        table = pa.table({"id": pa.array(ids, pa.int64()), "text": pa.array(texts, pa.string())})
        out = data / FORMATS["parquet"] / src.name.replace(".jsonl", ".parquet")
        pq.write_table(table, out, row_group_size=args.row_group, compression=args.parquet_compression)
        pq_bytes += out.stat().st_size
    facts = {
        "records": records,
        "text_bytes": text_bytes,
        "ascii": text_bytes == text_chars,
        "jsonl_bytes": jsonl_bytes,
        "zst_bytes": zst_bytes,
        "parquet_bytes": pq_bytes,
        "generate_s": round(t_gen, 1),
        "convert_s": round(time.perf_counter() - t0, 1),
    }
    manifest.write_text(json.dumps({"params": wanted, "facts": facts}, indent=1))
    return facts


def index_times(formats: list[str], data: Path) -> dict[str, dict[str, float]]:
    """Opening each copy with tidal: cold (the files are scanned: a temporary directory of links to them, so that
    no index exists yet) and warm (the cached ``.tidal-index.json`` beside the data)."""
    import tidal

    out: dict[str, dict[str, float]] = {}
    for fmt in formats:
        root = data / FORMATS[fmt]
        with tempfile.TemporaryDirectory(prefix="tidal-bench-") as tmp:
            for f in root.iterdir():
                if not f.name.startswith("."):
                    os.symlink(f.resolve(), Path(tmp) / f.name)
            t0 = time.perf_counter()
            tidal.Dataset(tmp, columns=COLUMNS, follow_links=True)
            cold = time.perf_counter() - t0
        tidal.Dataset(str(root), columns=COLUMNS)  # make sure the cached index exists
        t0 = time.perf_counter()
        ds = tidal.Dataset(str(root), columns=COLUMNS)
        out[fmt] = {"cold_open_s": cold, "warm_open_s": time.perf_counter() - t0, "records": ds.num_records}
    return out


# ----------------------------------------------------------------------------------------------------------------
# measurements, each in a child process (``--child SPEC``)


@dataclass
class Spec:
    kind: str  # "tidal" | "parquet-arrow" | "parquet-python" | "jsonl-python" | "resume-save" | "resume-load"
    fmt: str
    root: str
    seconds: float
    max_records: int
    shuffle: bool = False
    seed: int = 0
    workers: int | None = None  # None: iterate the tidal Dataset itself, no torch DataLoader
    batch: int = 8
    second_iter: bool = False  # also time the first batch of a new iter() on the same loader
    state_file: str = ""
    fractions: tuple[float, ...] = ()
    at: float = 0.0
    t_spawn: float = 0.0  # wall clock in the parent just before the child was started


class WorkerMemory(threading.Thread):
    """Samples the memory of this process's children (DataLoader workers): RSS and private (USS) bytes."""

    def __init__(self, interval: float = 0.25):
        super().__init__(daemon=True)
        self.interval = interval
        self.rss = 0
        self.uss = 0
        self.pids: set[int] = set()
        self._done = threading.Event()

    @staticmethod
    def children() -> list[int]:
        pids: list[int] = []
        with contextlib.suppress(OSError):
            for tid in os.listdir("/proc/self/task"):
                with contextlib.suppress(OSError), open(f"/proc/self/task/{tid}/children") as f:
                    pids.extend(int(p) for p in f.read().split())
        return pids

    def sample(self) -> None:
        for pid in self.children():
            fields: dict[str, int] = {}
            with contextlib.suppress(OSError), open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    parts = line.split()
                    if len(parts) >= 2 and parts[0].endswith(":") and parts[1].isdigit():
                        fields[parts[0][:-1]] = int(parts[1]) * 1024
            if fields:
                self.pids.add(pid)
                self.rss = max(self.rss, fields.get("Rss", 0))
                self.uss = max(self.uss, fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0))

    def run(self) -> None:
        while not self._done.wait(self.interval):
            self.sample()

    def stop(self) -> None:
        self._done.set()
        self.join()


def _cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of this process and of ``pids`` (its live children) so far."""
    total = time.process_time()
    tick = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError), open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime: fields 14 and 15 of stat(5)
    return total


def _machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy (all processes, all CPUs), from /proc/stat."""
    with contextlib.suppress(OSError, ValueError), open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
        busy = sum(ticks[:8]) - ticks[3] - ticks[4]  # user nice system idle iowait irq softirq steal
        return busy / os.sysconf("SC_CLK_TCK")
    return math.nan


def _cpu_figures(cpu: float, machine: float, elapsed: float, records: int) -> dict[str, float]:
    """CPUs this measurement kept busy, CPUs the rest of the machine kept busy meanwhile, records per CPU second."""
    if elapsed <= 0:
        return {"cores_busy": math.nan, "other_cores_busy": math.nan, "records_per_cpu_s": math.nan}
    return {
        "cores_busy": cpu / elapsed,
        "other_cores_busy": max(0.0, (machine - cpu) / elapsed),
        "records_per_cpu_s": records / cpu if cpu > 0 else math.nan,
    }


def _peak_rss_mb() -> float:
    """Peak RSS of this process: VmHWM. Not ``ru_maxrss``: Linux carries that over fork and exec, so a child
    started by a large parent reports the parent's size."""
    with contextlib.suppress(OSError), open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _dataset(spec: Spec) -> Any:
    import tidal

    ds = tidal.Dataset(spec.root, columns=COLUMNS)
    if spec.shuffle:
        ds = ds.shuffle(seed=spec.seed)
    return ds.repeat().batch(spec.batch)


def _close(it: Iterator[Any]) -> None:
    close = getattr(it, "close", None)
    if close is not None:
        close()
    gc.collect()


def child_tidal(spec: Spec) -> dict[str, Any]:
    t_start = time.perf_counter()
    ds = _dataset(spec)
    source: Any = ds
    loader: Any = None
    if spec.workers is not None:
        import tidal

        loader = source = tidal.DataLoader(ds, num_workers=spec.workers)
    memory = WorkerMemory()
    memory.start()
    t0 = time.perf_counter()
    it = iter(source)
    first = next(it)
    t1 = time.perf_counter()
    first_wall = time.time()
    workers = WorkerMemory.children()
    cpu0, machine0 = _cpu_seconds(workers), _machine_busy_s()
    n = nbytes = 0
    deadline = t1 + spec.seconds
    now = t1
    for batch in it if spec.seconds > 0 else ():
        texts = batch["text"]
        n += len(texts)
        nbytes += sum(map(len, texts))
        now = time.perf_counter()
        if now >= deadline or n >= spec.max_records:
            break
    elapsed = now - t1
    cpu, machine = _cpu_seconds(workers) - cpu0, _machine_busy_s() - machine0
    _close(it)
    del it, first
    out: dict[str, Any] = {
        "records": n,
        "seconds": elapsed,
        "cpu_seconds": cpu,
        **_cpu_figures(cpu, machine, elapsed, n),
        "records_per_s": n / elapsed if elapsed > 0 else math.nan,
        "mb_per_s": nbytes / elapsed / 1e6 if elapsed > 0 else math.nan,
        "first_batch_from_iter_s": t1 - t0,
        "first_batch_from_start_s": first_wall - spec.t_spawn,
        "setup_s": t0 - t_start,
    }
    if spec.second_iter and loader is not None:
        t0 = time.perf_counter()
        it = iter(loader)
        next(it)
        out["first_batch_second_iter_s"] = time.perf_counter() - t0
        _close(it)
        del it
    memory.stop()
    memory.sample()
    out["rss_main_mb"] = _peak_rss_mb()
    out["worker_rss_sampled_mb"] = memory.rss / 2**20 if memory.pids else math.nan
    out["worker_uss_sampled_mb"] = memory.uss / 2**20 if memory.pids else math.nan
    return out


def child_baseline(spec: Spec) -> dict[str, Any]:
    """Plain readers of the same files, in file order, cycling over the files until the bounds are hit."""
    import orjson
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    import zstandard

    suffix = ".parquet" if spec.fmt == "parquet" else ".jsonl.zst"
    files = sorted(str(p) for p in Path(spec.root).iterdir() if p.name.endswith(suffix))
    n = nbytes = 0
    t0 = time.perf_counter()
    cpu0, machine0 = time.process_time(), _machine_busy_s()
    deadline = t0 + spec.seconds
    done = False
    passes = 0
    while not done:
        for path in files:
            if spec.kind == "parquet-arrow":  # whole file into Arrow, no Python objects
                table = pq.read_table(path, columns=COLUMNS)
                n += table.num_rows
                nbytes += pc.sum(pc.binary_length(table["text"])).as_py() or 0
                del table
            elif spec.kind == "parquet-python":  # row group by row group, text into Python str
                pf = pq.ParquetFile(path)
                for g in range(pf.num_row_groups):
                    table = pf.read_row_group(g, columns=COLUMNS)
                    table["id"].to_numpy()
                    texts = table["text"].to_pylist()
                    n += len(texts)
                    nbytes += sum(map(len, texts))
                    if time.perf_counter() >= deadline or n >= spec.max_records:
                        break
                pf.close()
            else:  # jsonl-python: zstandard stream, one orjson.loads per line
                with open(path, "rb") as fh:
                    reader = io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(fh), 1 << 20)
                    for line in reader:
                        if line.strip():
                            rec = orjson.loads(line)
                            n += 1
                            nbytes += len(rec["text"])
                            if n & 1023 == 0 and (time.perf_counter() >= deadline or n >= spec.max_records):
                                break
            if time.perf_counter() >= deadline or n >= spec.max_records:
                done = True
                break
        passes += 1
    elapsed = time.perf_counter() - t0
    cpu, machine = time.process_time() - cpu0, _machine_busy_s() - machine0
    return {
        "records": n,
        "seconds": elapsed,
        "cpu_seconds": cpu,
        **_cpu_figures(cpu, machine, elapsed, n),
        "records_per_s": n / elapsed,
        "mb_per_s": nbytes / elapsed / 1e6,
        "rss_main_mb": _peak_rss_mb(),
    }


def child_resume_save(spec: Spec) -> dict[str, Any]:
    """Consume a given fraction of an epoch, save loader.state_dict(), and note the batch that comes next."""
    import tidal

    ds = _dataset(spec)
    loader = tidal.DataLoader(ds, num_workers=spec.workers or 0)
    epoch = ds.num_records
    saved, it = resume_points(loader, epoch, spec.batch, spec.fractions, batch_ids, json.dumps)
    _close(it)
    Path(spec.state_file).write_text(json.dumps(saved))
    return {"epoch_records": epoch, "points": {k: {**v, "state": None} for k, v in saved.items()}}


def child_resume_load(spec: Spec) -> dict[str, Any]:
    """A new loader in a new process: load the saved state and time the first batch."""
    import tidal

    ds = _dataset(spec)
    loader = tidal.DataLoader(ds, num_workers=spec.workers or 0)
    point = json.loads(Path(spec.state_file).read_text())[str(spec.at)]
    memory = WorkerMemory()
    memory.start()
    t0 = time.perf_counter()
    loader.load_state_dict(point["state"])
    it = iter(loader)
    first = next(it)
    t1 = time.perf_counter()
    first_wall = time.time()
    exact = batch_ids(first) == point["expected_ids"]
    _close(it)
    memory.stop()
    return {
        "first_batch_after_load_s": t1 - t0,
        "first_batch_from_start_s": first_wall - spec.t_spawn,
        "exact": exact,
        "consumed_records": point["consumed_records"],
        "state_bytes": point["state_bytes"],
        "rss_main_mb": _peak_rss_mb(),
        "worker_rss_sampled_mb": memory.rss / 2**20 if memory.pids else math.nan,
    }


CHILDREN = {
    "tidal": child_tidal,
    "parquet-arrow": child_baseline,
    "parquet-python": child_baseline,
    "jsonl-python": child_baseline,
    "resume-save": child_resume_save,
    "resume-load": child_resume_load,
}


def run_child(spec: Spec, timeout: float) -> dict[str, Any]:
    spec.t_spawn = time.time()
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(asdict(spec))]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        log(f"  {spec.kind} {spec.fmt}: timed out after {timeout:.0f} s")
        return {"error": f"timed out after {timeout:.0f} s"}
    if proc.returncode != 0:
        log(f"  {spec.kind} {spec.fmt} failed:\n{proc.stderr[-3000:]}")
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


# ----------------------------------------------------------------------------------------------------------------
# peers


def read_peers(path: Path) -> tuple[list[str], dict[str, list[str]]]:
    """The table of PEERS.md: its peer names and, per workload (first cell), the peer cells."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return [], {}
    rows = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in lines if ln.lstrip().startswith("|")]
    rows = [r for r in rows if not all(set(c) <= set("-: ") for c in r)]
    if not rows:
        return [], {}
    header, body = rows[0], rows[1:]
    return header[1:], {r[0].lower(): r[1:] for r in body}


def peer_row(peers: dict[str, list[str]], prefix: str, width: int) -> list[str]:
    for label, cells in peers.items():
        if label.startswith(prefix.lower()):
            return (cells + [""] * width)[:width]
    return ["n/a"] * width


# ----------------------------------------------------------------------------------------------------------------
# output


def _num(x: Any, digits: int = 0) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "NO"
    if isinstance(x, int) or digits == 0:
        return f"{x:,.0f}"
    return f"{x:,.{digits}f}"


def _ratio(a: Any, b: Any) -> str:
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)) or not b or math.isnan(a) or math.isnan(b):
        return "-"
    return f"{a / b:.2f}x"


def table(title: str, headers: list[str], rows: list[list[str]], notes: Sequence[str] = ()) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    right = [i > 0 and all(r[i][:1].isdigit() or r[i][:1] in "-~" for r in rows) for i in range(len(headers))]

    def fmt(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right, strict=True))

    out = [f"\n== {title} ==", fmt(headers), "  ".join("-" * w for w in widths)]
    out += [fmt(r) for r in rows]
    out += [f"   {n}" for n in notes]
    return "\n".join(out)


# ----------------------------------------------------------------------------------------------------------------
# the run


def git_describe() -> str:
    """The commit tidal was measured at, and whether its sources differ from it."""
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "src"], capture_output=True, text=True)
    except OSError:
        return "unknown"
    if head.returncode != 0:
        return "unknown"
    return head.stdout.strip() + (" + uncommitted changes in src/" if dirty.stdout.strip() else "")


def loader_label(workers: int | None) -> str:
    return "Dataset, no torch" if workers is None else f"DataLoader, {workers} workers"


def _median(values: list[float]) -> float:
    values = [v for v in values if isinstance(v, (int, float)) and not math.isnan(v)]
    return statistics.median(values) if values else math.nan


def _spread(values: list[float], digits: int = 2) -> str:
    """``median (min-max)`` of repeated timings."""
    values = [v for v in values if isinstance(v, (int, float)) and not math.isnan(v)]
    if not values:
        return "-"
    if len(values) == 1:
        return _num(values[0], digits)
    return f"{_num(statistics.median(values), digits)} ({_num(min(values), digits)}-{_num(max(values), digits)})"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--data", default=str(REPO / "bench-data"), help="corpus cache directory (default: bench-data/)")
    ap.add_argument(
        "--corpus-script",
        default=str(REPO.parent / "shared" / "bench" / "gen_corpus.py"),
        help="the shared corpus generator (default: ../shared/bench/gen_corpus.py from the repository root)",
    )
    ap.add_argument("--peers", default=None, help="PEERS.md (default: beside the corpus script)")
    ap.add_argument("--total-gb", type=float, default=0.5, help="corpus size in JSONL GB (default 0.5)")
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1234, help="corpus seed (default 1234, as in PEERS.md)")
    ap.add_argument("--shuffle-seed", type=int, default=0)
    ap.add_argument("--row-group", type=int, default=10_000, help="Parquet rows per row group (default 10,000)")
    ap.add_argument("--parquet-compression", default="snappy")
    ap.add_argument("--zstd-level", type=int, default=3)
    ap.add_argument("--formats", default=",".join(FORMATS), help="comma-separated subset of: parquet,jsonl.zst")
    ap.add_argument("--seconds", type=float, default=None, help="bound per measurement (default 10; 3 with --quick)")
    ap.add_argument("--max-records", type=int, default=2_000_000, help="bound per measurement (default 2,000,000)")
    ap.add_argument("--repeats", type=int, default=None, help="runs of each first-batch timing (default 3; 1 --quick)")
    ap.add_argument("--quick", action="store_true", help="3 s per measurement, shuffled rows only, no repeats")
    ap.add_argument("--no-resume", action="store_true", help="skip the resume measurements")
    ap.add_argument("--json", default=None, help="also write every figure to this file")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main() -> None:
    args = parse_args()
    if args.child is not None:
        raw = json.loads(args.child)
        raw["fractions"] = tuple(raw.get("fractions", ()))
        spec = Spec(**raw)
        print(json.dumps(CHILDREN[spec.kind](spec)))
        return

    seconds = args.seconds if args.seconds is not None else (3.0 if args.quick else 10.0)
    repeats = max(1, args.repeats if args.repeats is not None else (1 if args.quick else 3))
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        sys.exit(f"unknown format {unknown[0]!r}; known: {', '.join(FORMATS)}")
    data = Path(args.data)
    timeout = seconds + 300

    import pyarrow
    import torch

    import tidal

    t_all = time.perf_counter()
    facts = prepare(args)
    results: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "tidal_source": git_describe(),
        "loadavg_start": os.getloadavg(),
        "machine": {
            "usable_cpus": len(os.sched_getaffinity(0)),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "pyarrow": pyarrow.__version__,
            "tidal": tidal.__version__,
        },
        "corpus": facts,
        "index": index_times(formats, data),
        "seconds_per_measurement": seconds,
        "max_records": args.max_records,
        "baselines": {},
        "throughput": [],
        "first_batch": {},
        "resume": {},
    }

    runs: list[tuple[bool, int | None, int]] = [(True, None, 8), (True, 0, 8), (True, 2, 8), (True, 2, 256)]
    if not args.quick:
        runs += [(False, None, 8), (False, 0, 8), (False, 2, 8), (False, 2, 256)]
    for fmt in formats:
        root = str(data / FORMATS[fmt])
        bounds = {"fmt": fmt, "root": root, "seconds": seconds, "max_records": args.max_records}
        for kind in BASELINES[fmt]:
            log(f"baseline {kind} ...")
            results["baselines"][kind] = run_child(Spec(kind=kind, **bounds), timeout)
        for shuffle, workers, batch in runs:
            log(f"tidal {fmt}, {'shuffled' if shuffle else 'in order'}, {loader_label(workers)}, batch {batch} ...")
            spec = Spec(kind="tidal", shuffle=shuffle, seed=args.shuffle_seed, workers=workers, batch=batch, **bounds)
            res = run_child(spec, timeout)
            results["throughput"].append({"format": fmt, "shuffle": shuffle, "workers": workers, "batch": batch, **res})

    # the first batch, 2 workers shuffled: fresh processes that stop after it
    for fmt in formats:
        log(f"first batch {fmt} x{repeats} ...")
        spec = Spec(
            kind="tidal", fmt=fmt, root=str(data / FORMATS[fmt]), seconds=0, max_records=0, shuffle=True,
            seed=args.shuffle_seed, workers=2, batch=8, second_iter=True,
        )  # fmt: skip
        results["first_batch"][fmt] = [run_child(spec, timeout) for _ in range(repeats)]

    fractions = (0.1, 0.9)
    if not args.no_resume:
        for fmt in formats:
            common = {
                "fmt": fmt, "root": str(data / FORMATS[fmt]), "seconds": seconds, "max_records": args.max_records,
                "shuffle": True, "seed": args.shuffle_seed, "workers": 2, "batch": 8,
                "state_file": str(data / f"resume-state-{FORMATS[fmt]}.json"),
            }  # fmt: skip
            log(f"resume {fmt}: consuming {', '.join(f'{f:.0%}' for f in fractions)} of an epoch ...")
            saved = run_child(Spec(kind="resume-save", fractions=fractions, **common), timeout + 900)
            loads: dict[str, list[dict[str, Any]]] = {}
            if "error" not in saved:
                for f in fractions:
                    log(f"resume {fmt} at {f:.0%} x{repeats}: first batch in a new process ...")
                    loads[str(f)] = [
                        run_child(Spec(kind="resume-load", at=f, **common), timeout) for _ in range(repeats)
                    ]
            results["resume"][fmt] = {"save": saved, "load": loads}
    results["total_s"] = time.perf_counter() - t_all
    results["loadavg_end"] = os.getloadavg()

    peers_path = Path(args.peers) if args.peers else Path(args.corpus_script).parent / "PEERS.md"
    print(report(results, formats, peers_path, args))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
        print(f"\nall figures: {args.json}")


BASELINES = {"parquet": ["parquet-arrow", "parquet-python"], "jsonl.zst": ["jsonl-python"]}
BASELINE_LABELS = {
    "parquet-arrow": "baseline: pq.read_table, Arrow only",
    "parquet-python": "baseline: pq row groups -> Python str",
    "jsonl-python": "baseline: zstandard + orjson per line",
}
REFERENCE = {"parquet": "parquet-python", "jsonl.zst": "jsonl-python"}  # what "vs baseline" divides by


def report(results: dict[str, Any], formats: list[str], peers_path: Path, args: argparse.Namespace) -> str:
    m, facts = results["machine"], results["corpus"]
    out = [
        f"tidal {m['tidal']} ({results['tidal_source']}) read benchmark: {results['command']}",
        f"machine: {m['usable_cpus']} usable CPUs, Python {m['python']}, torch {m['torch']}, pyarrow {m['pyarrow']}; "
        f"whole run {results['total_s']:.0f} s; load average {results['loadavg_start'][0]:.2f} at the start, "
        f"{results['loadavg_end'][0]:.2f} at the end",
        f"corpus: gen_corpus.py --total-gb {args.total_gb:g} --shards {args.shards} --seed {args.seed}: "
        f"{facts['records']:,} records, text {facts['text_bytes'] / 1e6:,.0f} MB{' (ASCII)' if facts['ascii'] else ''}; "
        f"JSONL {facts['jsonl_bytes'] / 1e6:,.0f} MB, .jsonl.zst {facts['zst_bytes'] / 1e6:,.0f} MB "
        f"(level {args.zstd_level}), Parquet {facts['parquet_bytes'] / 1e6:,.0f} MB "
        f"({args.parquet_compression}, {args.row_group:,} rows per row group)",
        "tidal.Dataset() open: "
        + "; ".join(
            f"{fmt} {v['cold_open_s']:.2f} s cold (scans the files), {v['warm_open_s'] * 1e3:.0f} ms with the index"
            for fmt, v in results["index"].items()
        ),
    ]
    errors: list[str] = []

    # -- throughput
    rows: list[list[str]] = []
    for fmt in formats:
        for kind in BASELINES[fmt]:
            b = results["baselines"].get(kind, {})
            if "error" in b:
                errors.append(f"{kind}: {b['error']}")
            rows.append([fmt, "in order", BASELINE_LABELS[kind], "-", _num(b.get("records_per_s")),
                         _num(b.get("mb_per_s"), 1), "", _num(b.get("cores_busy"), 2),
                         _num(b.get("other_cores_busy"), 2),
                         _num(b.get("records_per_cpu_s")), _num(b.get("rss_main_mb")), "", ""])  # fmt: skip
        ref = results["baselines"].get(REFERENCE[fmt], {}).get("records_per_s")
        for r in results["throughput"]:
            if r["format"] != fmt:
                continue
            if "error" in r:
                errors.append(f"{fmt} {loader_label(r['workers'])} batch {r['batch']}: {r['error']}")
            rows.append([
                fmt, "shuffled" if r["shuffle"] else "in order", "tidal " + loader_label(r["workers"]),
                str(r["batch"]), _num(r.get("records_per_s")), _num(r.get("mb_per_s"), 1),
                _ratio(r.get("records_per_s"), ref), _num(r.get("cores_busy"), 2),
                _num(r.get("other_cores_busy"), 2),
                _num(r.get("records_per_cpu_s")), _num(r.get("rss_main_mb")),
                _num(r.get("worker_rss_sampled_mb")), _num(r.get("worker_uss_sampled_mb")),
            ])  # fmt: skip
    bound = f"each run <= {results['seconds_per_measurement']:g} s or {results['max_records']:,} records"
    out.append(table(
        f"throughput: steady state after the first batch; {bound}, in a fresh process",
        ["format", "order", "reader", "batch", "records/s", "MB/s", "vs baseline", "CPUs busy", "other load",
         "records/CPU-s",
         "RSS main MB",
         "RSS worker MB", "USS worker MB"],
        rows,
        [
            "MB/s: characters of the text column per second (= UTF-8 bytes: the corpus is ASCII); 1 MB = 1e6.",
            "vs baseline: tidal records/s / the plain Python reader of the same files, in file order",
            "(Parquet: row groups -> Python str; .jsonl.zst: zstandard stream + orjson per line).",
            "CPUs busy: CPU seconds (main process + workers) per second of the run; other load: CPUs the rest of",
            "the machine kept busy meanwhile (/proc/stat); records/CPU-s: records per CPU second of this run,",
            "less sensitive than records/s to other load.",
            "RSS main: peak RSS (VmHWM) of the measuring process. RSS / USS worker: largest DataLoader worker, sampled",
            "from /proc every 0.25 s; RSS counts pages shared with the parent after fork, USS only private ones.",
        ],
    ))  # fmt: skip

    # -- first batch
    rows = []
    for fmt in formats:
        runs = [r for r in results["first_batch"].get(fmt, []) if "error" not in r]
        errors += [f"first batch {fmt}: {r['error']}" for r in results["first_batch"].get(fmt, []) if "error" in r]
        rows.append([
            fmt, _spread([r["first_batch_from_start_s"] for r in runs]),
            _spread([r["first_batch_from_iter_s"] for r in runs]),
            _spread([r.get("first_batch_second_iter_s", math.nan) for r in runs]),
            _spread([r["setup_s"] for r in runs]),
        ])  # fmt: skip
    out.append(table(
        "time to the first batch, 2 workers, shuffled, batch 8 (seconds, median (min-max) of "
        f"{len(results['first_batch'].get(formats[0], []))} fresh processes)",
        ["format", "from process start", "from iter()", "new iter(), same loader", "in-process setup"],
        rows,
        [
            "from process start: from just before the parent starts the Python process (torch import included);",
            "in-process setup: imports, Dataset (cached index), DataLoader; from iter(): workers start, first block.",
        ],
    ))  # fmt: skip

    # -- resume
    rows = []
    for fmt in formats:
        res = results["resume"].get(fmt)
        if not res:
            continue
        if "error" in res["save"]:
            errors.append(f"resume {fmt}: {res['save']['error']}")
            continue
        for at, loads in res["load"].items():
            point = res["save"]["points"][at]
            ok = [r for r in loads if "error" not in r]
            errors += [f"resume {fmt} at {at}: {r['error']}" for r in loads if "error" in r]
            exact = all(r["exact"] for r in ok) if ok else None
            rows.append([
                fmt, f"{float(at):.0%}", _num(point["consumed_records"]), _num(point["reached_after_s"], 1),
                _spread([r["first_batch_after_load_s"] for r in ok]),
                _spread([r["first_batch_from_start_s"] for r in ok]), _num(exact), _num(point["state_bytes"]),
            ])  # fmt: skip
    if rows:
        out.append(table(
            "resume: state_dict() saved after a fraction of an epoch, loaded into a new DataLoader in a new process "
            "(2 workers, shuffled, batch 8; seconds, median (min-max))",
            ["format", "at", "records consumed", "reached after s", "load_state_dict -> 1st batch",
             "from process start", "exact", "state bytes"],
            rows,
            [
                "exact: the first batch after resuming has the ids of the batch the original loader yielded next.",
                "Compare 'load_state_dict -> 1st batch' with 'from iter()' of a fresh start above.",
            ],
        ))  # fmt: skip

    out.append(peer_table(results, formats, peers_path))
    if errors:
        out.append("\nERRORS:\n" + "\n".join(f"  {e}" for e in errors))
    return "\n".join(out)


def peer_table(results: dict[str, Any], formats: list[str], peers_path: Path) -> str:
    names, peers = read_peers(peers_path)
    if not names:
        return f"\n(no peer table found at {peers_path})"

    def ours(shuffle: bool, workers: int, batch: int) -> list[str]:
        found = {
            r["format"]: r
            for r in results["throughput"]
            if (r["shuffle"], r["workers"], r["batch"]) == (shuffle, workers, batch)
        }
        return [_num(found.get(f, {}).get("records_per_s")) for f in formats]

    def first_batch() -> list[str]:
        runs = results["first_batch"]
        return [
            _num(_median([r.get("first_batch_from_start_s", math.nan) for r in runs.get(f, [])]), 1) for f in formats
        ]

    def resumed() -> list[str]:
        cells = []
        for f in formats:
            loads = [r for r in results["resume"].get(f, {}).get("load", {}).get("0.9", []) if "error" not in r]
            t = _median([r["first_batch_from_start_s"] for r in loads])
            cells.append(f"{_num(all(r['exact'] for r in loads))}, {_num(t, 1)} s" if loads else "-")
        return cells

    def rss() -> list[str]:
        found = {
            r["format"]: r for r in results["throughput"] if (r["shuffle"], r["workers"], r["batch"]) == (True, 2, 8)
        }
        return [_num(found.get(f, {}).get("rss_main_mb", math.nan) / 1024, 2) for f in formats]

    at90 = math.ceil(0.9 * results["corpus"]["records"])
    rows = [
        [
            "records/s, shuffled, 1 process (ours: 0 workers)",
            *ours(True, 0, 8),
            "raw text records/s, shuffled, 1 process",
        ],
        ["same, 2 DataLoader workers", *ours(True, 2, 8), "same, 2 dataloader workers"],
        ["same, 2 workers, batch 256", *ours(True, 2, 256), "same, 2 workers, batch 256"],
        ["first batch after process start, 2 workers, shuffled, s", *first_batch(), "first batch after process start"],
        [f"resume, exact? first batch after (ours: at 90% = {at90:,} records)", *resumed(), "resume after"],
        ["peak RSS main process, GB (ours: 2 workers, batch 8)", *rss(), "peak rss, main process"],
    ]
    rows = [[*r[:-1], *peer_row(peers, r[-1], len(names))] for r in rows]
    return table(
        "tidal (this run) next to peer figures from PEERS.md, measured on another run",
        ["workload (batch 8 unless said)", *[f"tidal {f}" for f in formats], *[f"{n} (PEERS.md)" for n in names]],
        rows,
        [
            "Peer figures are copied from PEERS.md: another run, the 2 GB corpus, each peer in its own format,",
            "medians of 3 runs. Absolute figures drift 15-25% between runs on these machines, so compare ratios",
            f"taken within one run (the baselines above). Ours: this run, {results['corpus']['records']:,} records.",
        ],
    )


if __name__ == "__main__":
    main()
