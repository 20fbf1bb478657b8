"""The measurements, named: which ones the chosen loaders and workloads make, and running them, each repetition
every one once in a rotated order (interleaved), so that a busy spell of the machine spreads over all of them."""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from common import log

from peers import FORMAT_OF, RESUMABLE
from peers.harness import run_child, run_s3_child
from peers.s3 import s3_server
from peers.spec import Spec

WORKLOADS = ("text", "tokens", "first", "resume", "rss", "limits", "s3")
DEFAULT_WORKLOADS = WORKLOADS  # s3 included: the server holds every copy in memory (3.6 GB for the 0.6 GB corpus)
TEXT_RUNS = ((0, 8), (2, 8), (2, 256))  # (workers, batch)
S3_RUNS = ((0, 8), (2, 8))  # (workers, batch) of the s3 workload
FRACTIONS = (0.1, 0.9)
RAW_METHODS = ("encode_batch", "encode_batch_fast")
J = TypeVar("J")  # a job of a plan (this one's, or bench_shaped.py's)


@dataclass
class Job:
    name: str
    workload: str
    loader: str
    spec: Spec
    label: str = ""
    meta: dict[str, Any] = field(default_factory=dict)


def text_name(loader: str, workers: int, batch: int) -> str:
    return f"text {loader} w{workers} b{batch}"


def raw_name(method: str, threads: int) -> str:
    return f"raw {method} t{threads}"


def s3_name(loader: str, workers: int, batch: int) -> str:
    return f"s3 {loader} w{workers} b{batch}"


def subset(text: str, known: tuple[str, ...], what: str) -> list[str]:
    """The names of a comma-separated flag, in the order of ``known``; an unknown one ends the run."""
    got = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in got if x not in known]
    if bad:
        sys.exit(f"unknown {what} {bad[0]!r}; known: {', '.join(known)}")
    return [x for x in known if x in got]


def plan(
    args: argparse.Namespace,
    manifest: dict[str, Any],
    loaders: list[str],
    workloads: set[str],
    server: dict[str, Any] | None = None,
) -> list[Job]:
    """The measurements each repetition runs once, in this order, rotated from one repetition to the next.
    ``server``: the s3 workload's server (:func:`peers.s3.s3_server`)."""
    root = Path(manifest["root"])
    tok = str(root / manifest["tokenizer"]["file"]) if "tokenizer" in manifest else ""
    jobs: list[Job] = []

    def spec(loader: str, kind: str, **kw: Any) -> Spec:
        return Spec(kind=kind, loader=loader, root=str(root / FORMAT_OF[loader]), seed=args.shuffle_seed, **kw)

    text_runs = set(TEXT_RUNS) if "text" in workloads else set()
    if "rss" in workloads:
        text_runs |= {(0, 8), (2, 8)}
    for loader in loaders:
        for w, b in sorted(text_runs):
            s = spec(loader, "text", workers=w, batch=b, seconds=args.seconds)
            jobs.append(Job(text_name(loader, w, b), "text", loader, s, meta={"workers": w, "batch": b}))
    if "tokens" in workloads:
        for loader in loaders:
            for w in (0, 2):
                threads = max(1, args.threads // max(1, w))
                s = spec(loader, "tokens", workers=w, batch=8, seconds=args.seconds, tokenizer=tok, threads=threads)
                jobs.append(Job(f"tokens {loader} w{w}", "tokens", loader, s, meta={"workers": w, "threads": threads}))
    if "tokens" in workloads or "limits" in workloads:
        for method in RAW_METHODS:
            for t in sorted({1, args.threads}):
                s = Spec(kind="raw", root=str(root / "jsonl"), seconds=args.seconds, tokenizer=tok, threads=t)
                s.raw_mb, s.method = args.raw_mb, method
                jobs.append(Job(raw_name(method, t), "raw", "", s, meta={"threads": t, "method": method}))
    if "first" in workloads:
        jobs.append(Job("first import", "first", "import", Spec(kind="import")))
        for loader in loaders:
            s = spec(loader, "text", workers=2, batch=8, seconds=0.0)
            jobs.append(Job(f"first {loader}", "first", loader, s))
    if "limits" in workloads:
        jobs.append(Job("cache", "limits", "", Spec(kind="cache", root=str(root))))
    if "s3" in workloads and server is not None:
        for loader in loaders:
            for w, b in S3_RUNS:
                url, endpoint = server["urls"][FORMAT_OF[loader]], server["endpoint"]
                s = spec(loader, "text", workers=w, batch=b, seconds=args.seconds, url=url, endpoint=endpoint)
                jobs.append(Job(s3_name(loader, w, b), "s3", loader, s, meta={"workers": w, "batch": b}))
    return jobs


def resume_jobs(args: argparse.Namespace, manifest: dict[str, Any], loaders: list[str]) -> dict[str, Spec]:
    """One state-saving run per loader with ``state_dict()``, before the repetitions."""
    root = Path(manifest["root"])
    out = {}
    for loader in loaders:
        if loader in RESUMABLE:
            out[loader] = Spec(
                kind="resume-save", loader=loader, root=str(root / FORMAT_OF[loader]), workers=2, batch=8,
                seed=args.shuffle_seed, records=manifest["records"], fractions=FRACTIONS,
                state_file=str(root / f"resume-{loader}.pickle"),
            )  # fmt: skip
    return out


def rotated(jobs: list[J], rep: int, repeats: int) -> list[J]:
    """Repetition ``rep`` starts ``rep / repeats`` of the way down the list, so that no configuration always
    runs first, or right after the same one, when the machine's load changes over the run."""
    k = (rep * len(jobs)) // max(1, repeats)
    return jobs[k:] + jobs[:k]


def run_all(args: argparse.Namespace, manifest: dict[str, Any], loaders: list[str], workloads: set[str]) -> dict:
    with contextlib.ExitStack() as stack:
        server = None
        if "s3" in workloads:
            log("s3: starting moto's S3 server on 127.0.0.1 and uploading every loader's copy ...")
            fmts = (FORMAT_OF[x] for x in loaders)
            server = stack.enter_context(s3_server(Path(manifest["root"]), fmts))
        return _run_all(args, manifest, loaders, workloads, server)


def _run_all(
    args: argparse.Namespace,
    manifest: dict[str, Any],
    loaders: list[str],
    workloads: set[str],
    server: dict[str, Any] | None,
) -> dict:
    jobs = plan(args, manifest, loaders, workloads, server)
    caches = Path(manifest["root"]) / "s3-cache"  # the s3 runs' fresh cache directories, one at a time
    shutil.rmtree(caches, ignore_errors=True)
    saves: dict[str, Any] = {}
    if "resume" in workloads:
        for loader, s in resume_jobs(args, manifest, loaders).items():
            log(f"resume {loader}: consuming {' and '.join(f'{f:.0%}' for f in FRACTIONS)} of an epoch ...")
            saves[loader] = run_child(s, args.resume_timeout)
            if "error" in saves[loader]:
                continue
            for at in FRACTIONS:
                load = Spec(**{**asdict(s), "kind": "resume-load", "at": at, "fractions": ()})
                jobs.append(Job(f"resume {loader} {at}", "resume", loader, load, meta={"at": at}))
    runs: dict[str, list[dict[str, Any]]] = {j.name: [] for j in jobs}
    timeout = args.timeout + args.seconds
    for rep in range(args.repeats):
        order = rotated(jobs, rep, args.repeats)
        for i, job in enumerate(order):
            log(f"[{rep + 1}/{args.repeats} {i + 1}/{len(order)}] {job.name} ...")
            if job.workload == "s3" and server is not None:
                runs[job.name].append(run_s3_child(job.spec, timeout, server, caches))
            else:
                runs[job.name].append(run_child(job.spec, timeout))
    shutil.rmtree(caches, ignore_errors=True)
    out = {
        "jobs": {j.name: {"workload": j.workload, "loader": j.loader, **j.meta, "spec": asdict(j.spec)} for j in jobs},
        "runs": runs,
        "resume_save": saves,
    }
    if server is not None:
        out["s3"] = {k: v for k, v in server.items() if k != "log"}
    return out
