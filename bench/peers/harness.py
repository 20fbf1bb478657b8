"""One measurement in a fresh process: the ``Spec`` that describes it, the parent that spawns it and samples its
memory, and the child's side (steady-state timing, the figures printed on one line). A fresh process per
measurement, so that peak memory and the time from process start belong to that measurement alone."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from common import log

from peers.s3 import s3_env, server_requests
from peers.spec import Spec

REPO = Path(__file__).resolve().parent.parent.parent
DRIVER = REPO / "bench" / "bench_peers.py"  # what a child runs: ``bench_peers.py --child SPEC`` or ``--convert``
RESULT = "RESULT "  # prefix of the line a child prints its figures on


# ----------------------------------------------------------------------------------------------------------------
# the child's side


def steady(
    it: Iterator[Any], seconds: float, count: Callable[[Any], int], marks: list[tuple[float, int]] | None = None
) -> tuple[int, float]:
    """Units counted over ``seconds`` of batches (the first one already taken), and the time it took.
    ``marks``: a list to append ``(wall clock, units so far)`` to every 0.1 s and at the end."""
    n = 0
    wall0, t0 = time.time(), time.perf_counter()
    now = last = t0
    while now - t0 < seconds:
        n += count(next(it))
        now = time.perf_counter()
        if marks is not None and now - last >= 0.1:
            marks.append((wall0 + now - t0, n))
            last = now
    if marks is not None:
        marks.append((wall0 + now - t0, n))
    return n, now - t0


def serve(spec_json: str, measures: dict[str, Callable[[Spec], dict[str, Any]]]) -> None:
    """Run one measurement and print its figures. Then leave: a loader's workers that do not stop within 20 s
    (some peers' shutdown waits on threads) are not this measurement's business, so the process exits anyway."""
    raw = json.loads(spec_json)
    raw["fractions"] = tuple(raw.get("fractions", ()))
    spec = Spec(**raw)
    out = measures[spec.kind](spec)
    keep = out.pop("_keep", None)  # the iterator, alive until the figures are out: its workers stop after
    print(RESULT + json.dumps(out), flush=True)
    watchdog = threading.Timer(20.0, os._exit, args=(0,))
    watchdog.daemon = True
    watchdog.start()
    del keep


def result(stdout: str) -> dict[str, Any] | None:
    """The figures a child printed (its last ``RESULT`` line), or None."""
    lines = [ln for ln in stdout.splitlines() if ln.startswith(RESULT)]
    return dict(json.loads(lines[-1][len(RESULT) :])) if lines else None


# ----------------------------------------------------------------------------------------------------------------
# the parent's side: the child's figures, and the memory of its process tree sampled from /proc


def tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (DataLoader workers, their helpers)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{p}/task"):
                with contextlib.suppress(OSError, ValueError), open(f"/proc/{p}/task/{tid}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
    return out


def tree_memory(pid: int) -> tuple[int, int]:
    """RSS and USS (private pages) of the process tree, summed over its processes, in bytes."""
    rss = uss = 0
    for p in tree(pid):
        with contextlib.suppress(OSError, ValueError), open(f"/proc/{p}/smaps_rollup") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name == "Rss":
                    rss += int(rest.split()[0]) * 1024
                elif name in ("Private_Clean", "Private_Dirty"):
                    uss += int(rest.split()[0]) * 1024
    return rss, uss


_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Failure|Timeout)\b")


def last_line(text: str) -> str:
    """The line that says why a child failed: the last exception line of a traceback (``Type: message`` at the start
    of a line; what follows it may be a multi-line message or a library's debug dump), else the last line."""
    lines = [ln.rstrip() for ln in text.strip().splitlines() if ln.strip()]
    raised = [ln for ln in lines if _EXCEPTION.match(ln)]
    return (raised or lines or [""])[-1].strip()[:400]


def run_child(spec: Spec, timeout: float) -> dict[str, Any]:
    """One measurement in a fresh process group; its tree's memory sampled every 0.2 s. A failure or a hang is
    returned as ``{"error": ...}``: one cell of the report, never the end of the run."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    env.pop("RAYON_NUM_THREADS", None)
    if spec.threads:
        env["RAYON_NUM_THREADS"] = str(spec.threads)
    if spec.url:
        env = s3_env(spec, env)
    if spec.kind == "import":
        code = f"import torch, tidal, json, time; print({RESULT!r} + json.dumps({{'t': time.time()}}))"
        cmd = [sys.executable, "-c", code]
    else:
        cmd = [sys.executable, str(DRIVER), "--child", ""]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        spec.t_spawn = time.time()
        if spec.kind != "import":
            cmd[-1] = json.dumps(asdict(spec))
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, text=True, start_new_session=True)
        peak_rss = peak_uss = 0
        timed_out = False
        while proc.poll() is None:
            rss, uss = tree_memory(proc.pid)
            peak_rss, peak_uss = max(peak_rss, rss), max(peak_uss, uss)
            if time.time() - spec.t_spawn > timeout:
                timed_out = True
                with contextlib.suppress(OSError):
                    os.killpg(proc.pid, 9)
                proc.wait()
                break
            time.sleep(0.2)
        with contextlib.suppress(OSError):  # workers the child left behind
            os.killpg(proc.pid, 9)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    got = result(stdout)
    if got is None:
        why = f"timed out after {timeout:.0f} s" if timed_out else f"exit {proc.returncode}"
        last = last_line(stderr)
        log(f"    failed ({why}): {stderr.strip()[-2000:]}")
        return {"error": f"failed: {last or why}" + (f" ({why})" if timed_out and last else "")}
    if spec.kind == "import":
        got = {"first_batch_from_start_s": got["t"] - spec.t_spawn}
    got["peak_rss_gb"], got["peak_uss_gb"] = peak_rss / 1e9, peak_uss / 1e9
    return got


def run_s3_child(spec: Spec, timeout: float, server: dict[str, Any], base: Path) -> dict[str, Any]:
    """One s3 measurement with a fresh, empty cache directory, which is removed after it: the run's figures, the
    requests the server logged meanwhile and how much the loader had downloaded into its cache by the end."""
    base.mkdir(parents=True, exist_ok=True)
    cache = tempfile.mkdtemp(prefix="run-", dir=base)
    start = os.path.getsize(server["log"])
    try:
        got = run_child(replace(spec, cache=cache), timeout)
        requests = server_requests(server["log"], start)
        cached = sum(p.stat().st_size for p in Path(cache).rglob("*") if p.is_file() and not p.is_symlink())
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    if "error" in got:  # the run's cache directory, a long path that says nothing, shortened
        got["error"] = got["error"].replace(cache, "<cache>")
    else:  # the cold set-up counted too: every record (the first batch's included) over the whole run
        got["rate_from_start"] = (got["units"] + spec.batch) / (got["first_batch_from_start_s"] + got["seconds"])
    return {**got, **requests, "cache_mb": cached / 1e6}
