#!/usr/bin/env python3
"""tidal.ray.DataLoader: readers as Ray actors against local DataLoader workers, and Ray Data beside them.

The pipeline is tokenize + pack into (``--batch``, ``--seq-len``) rows, (8, 2048) by default, over the texts
of bench_tokenize.py (the shared corpus generator, a 32k byte-level BPE; cached under ``--data``):

    Dataset(texts, columns=["text"]).shuffle(seed).repeat().tokenize(tokenizer).pack(seq_len).batch(batch)

Every measurement runs in a fresh process whose training loop is held to one core (the first this process
may use): the loader is made, and its workers, Ray and its readers started, on the other cores; then
every thread of the training process is pinned to the first core, as on a GPU node whose cores are taken.

- ``local N``: ``tidal.DataLoader(ds, num_workers=N)``, for N in ``--workers``;
- ``ray N``: ``tidal.ray.DataLoader(ds, readers=N, reader_options={"num_cpus": 1})`` on a local Ray of the
  other cores (``--address``: a cluster's), for N in ``--readers``;
- ``ray_data N``: Ray Data on the same texts: ``read_json`` -> ``map_batches`` (tokenize, then pack the
  documents of each batch into rows: the rows a block leaves over are dropped) with N tokenizing tasks ->
  ``streaming_split(1)`` -> ``iter_torch_batches``: what a team runs today to tokenize on Ray.

Figures, in steady state (after ``--warmup`` batches, over ``--seconds``): batches/s and tokens/s (non-padding
token slots); the training process's CPU milliseconds per batch (what the loader costs the loop: the overhead
of Ray readers against local workers at equal counts is the difference); the time to the first batch. And
what a restart costs, at batch ``--restart-at``: tidal (either loader) saves ``state_dict()`` there, and a new
process loads it: the time to its first batch; Ray Data's ``streaming_split`` has no iterator checkpoint
(ray-project/ray#37633, #48224), so a restarted job reads again from the start: the time to batch
``--restart-at`` + 1 in a new process, or it skips or repeats data.

    .venv/bin/python bench/bench_ray.py                             # local 1,2,4 / ray 1,2,4 / ray_data 2
    .venv/bin/python bench/bench_ray.py --readers 1,2,4,8,12 --workers 1,2,4,8,12   # scaling, 16 cores
    .venv/bin/python bench/bench_ray.py --tiny                      # seconds: that it runs, no figures
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench_tokenize import REPO, prepare
from common import EOS, log

RESULT = "RESULT "


# ----------------------------------------------------------------------------------------------------------------
# in the child: one measurement


def _pin(cores: set[int]) -> None:
    """Every thread of this process on ``cores`` (``sched_setaffinity`` sets one thread's)."""
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(tid), cores)


def _tidal_loader(spec: dict) -> Any:
    import tidal

    ds = tidal.Dataset(spec["texts"], columns=["text"]).shuffle(seed=0).repeat()
    ds = ds.tokenize(spec["tokenizer"]).pack(spec["seq_len"]).batch(spec["batch"])
    if spec["kind"] == "local":
        return tidal.DataLoader(ds, num_workers=spec["n"])
    import tidal.ray

    return tidal.ray.DataLoader(ds, readers=spec["n"], reader_options={"num_cpus": 1})


class _Pack:
    """Ray Data's map_batches: tokenize the batch's documents, each followed by EOS, and cut the ids into rows."""

    def __init__(self, tokenizer: str, seq_len: int):
        from tokenizers import Tokenizer

        self.tok, self.seq_len = Tokenizer.from_file(tokenizer), seq_len
        self.eos = self.tok.token_to_id(EOS)

    def __call__(self, batch: dict) -> dict:
        import numpy as np

        ids = [[*e.ids, self.eos] for e in self.tok.encode_batch_fast(list(batch["text"]))]
        flat = np.fromiter((i for doc in ids for i in doc), dtype=np.int64)
        rows = len(flat) // self.seq_len
        return {"input_ids": flat[: rows * self.seq_len].reshape(rows, self.seq_len)}


def _ray_data_batches(spec: dict) -> Any:
    import ray

    files = sorted(str(p) for p in Path(spec["texts"]).glob("*.jsonl"))
    # a CPU per tokenizing actor, as per tidal reader; where the cores are fewer, shares (else the
    # actors hold them all and the reads never run)
    cpus = 1.0 if spec["cpus"] > spec["n"] else spec["cpus"] / (spec["n"] + 1)
    ds = ray.data.read_json(files, ray_remote_args={"num_cpus": min(1.0, cpus)}).randomize_block_order(seed=0)
    ds = ds.map_batches(
        _Pack,
        fn_constructor_args=(spec["tokenizer"], spec["seq_len"]),
        batch_size=256,
        concurrency=spec["n"],
        num_cpus=cpus,
    )
    (split,) = ds.streaming_split(1)
    return split.iter_torch_batches(batch_size=spec["batch"], drop_last=True)


def _tokens(batch: dict) -> int:
    segments = batch.get("segment_ids")
    return int((segments != 0).sum()) if segments is not None else int(batch["input_ids"].numel())


def child(spec: dict) -> dict:
    cores = sorted(os.sched_getaffinity(0))
    loop, others = {cores[0]}, set(cores[1:]) or {cores[0]}
    spec["cpus"] = len(others)
    _pin(others)  # what starts now (workers, Ray, its readers) runs on the other cores
    import torch  # noqa: F401  (imported before the clock)

    out: dict[str, Any] = {}
    if spec["kind"] != "local":  # a cluster is up before a job starts: not the loader's time
        import ray

        t0 = time.perf_counter()
        ray.init(address=spec["address"] or None, num_cpus=None if spec["address"] else spec["cpus"])
        out["ray_init_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    if spec["kind"] == "ray_data":
        batches = iter(_ray_data_batches(spec))
    else:
        loader = _tidal_loader(spec)
        if spec.get("state"):
            loader.load_state_dict(json.loads(Path(spec["state"]).read_text()))
        batches = iter(loader)
    out["made_s"] = time.perf_counter() - t0
    if spec.get("skip"):  # Ray Data's restart: read again from the start up to where it was
        for _ in range(spec["skip"]):
            next(batches)
    next(batches)
    out["first_batch_s"] = time.perf_counter() - t0
    if spec.get("state") or spec.get("skip"):
        return out
    _pin(loop)
    for _ in range(spec["warmup"]):
        next(batches)
    n = tokens = 0
    cpu0, t1 = time.process_time(), time.perf_counter()
    while time.perf_counter() - t1 < spec["seconds"]:
        try:
            batch = next(batches)
        except StopIteration:
            break
        n += 1
        tokens += _tokens(batch)
    seconds = time.perf_counter() - t1
    out.update(batches=n, tokens=tokens, seconds=seconds, loop_cpu_ms=1e3 * (time.process_time() - cpu0) / max(1, n))
    if spec.get("save_at") and spec["kind"] != "ray_data":  # the state a restart loads
        for _ in range(max(0, spec["save_at"] - spec["warmup"] - 1 - n)):
            next(batches)
        Path(spec["save"]).write_text(json.dumps(loader.state_dict()))
    return out


# ----------------------------------------------------------------------------------------------------------------
# in the parent: the plan, the runs, the table


def measure(spec: dict, timeout: float) -> dict:
    cmd = [sys.executable, __file__, "--child", json.dumps(spec)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:g} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT)]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        return {"error": f"exit {proc.returncode}: " + " | ".join(tail)}
    return dict(json.loads(lines[-1][len(RESULT) :]))


def _counts(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--data", default=str(REPO / "bench-data" / "tokenize"), help="bench_tokenize.py's cache")
    ap.add_argument("--corpus-script", default=str(REPO.parent / "shared" / "bench" / "gen_corpus.py"))
    ap.add_argument("--total-gb", type=float, default=0.2)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--train-mb", type=float, default=50.0)
    ap.add_argument("--mb", type=float, default=50.0, help="MB of text the pipelines read (Ray Data: once)")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--workers", default="1,2,4", help="local DataLoader worker counts")
    ap.add_argument("--readers", default="1,2,4", help="tidal.ray reader counts")
    ap.add_argument("--ray-data", default="2", help="Ray Data tokenizing task counts (empty: none)")
    ap.add_argument("--address", default="", help="a Ray cluster to run on (default: a local Ray in each run)")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--warmup", type=int, default=20, help="batches before the clock")
    ap.add_argument("--restart-at", type=int, default=200, help="the batch a restart resumes after (0: none)")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--tiny", action="store_true", help="a tiny corpus and 1-count runs of a second: that it runs")
    ap.add_argument("--json", help="also write every figure to this file")
    args = ap.parse_args()
    if args.child:
        print(RESULT + json.dumps(child(json.loads(args.child))), flush=True)
        return
    if args.tiny:
        args.total_gb, args.train_mb, args.mb, args.vocab = 0.002, 0.5, 0.5, 1000
        args.seq_len, args.seconds, args.warmup, args.restart_at = 256, 1.0, 2, 5
        for name in ("workers", "readers", "ray_data"):  # one of each, unless given
            if getattr(args, name) == ap.get_default(name):
                setattr(args, name, "1")
    prep = prepare(args)
    base = {
        "texts": prep["texts"],
        "tokenizer": prep["tokenizer"],
        "seq_len": args.seq_len,
        "batch": args.batch,
        "address": args.address,
        "seconds": args.seconds,
        "warmup": args.warmup,
    }
    print(
        f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; texts {prep['texts']}, batches ({args.batch}, {args.seq_len})"
    )
    print("the training process on one core; local workers, Ray and its readers on the others\n")
    print(
        f"{'loader':<14} {'batches/s':>10} {'Mtokens/s':>10} {'loop CPU ms/batch':>18} {'first batch s':>14} {'restart s':>10}"
    )
    results = []
    plan = [("local", n) for n in _counts(args.workers)] + [("ray", n) for n in _counts(args.readers)]
    plan += [("ray_data", n) for n in _counts(args.ray_data)]
    for kind, n in plan:
        state = Path(args.data) / f"bench-ray-state-{kind}-{n}.json"
        spec = {**base, "kind": kind, "n": n}
        if args.restart_at and kind != "ray_data":
            spec.update(save_at=args.restart_at, save=str(state))
        log(f"{kind} {n} ...")
        r = measure(spec, args.timeout)
        if "error" not in r and args.restart_at:
            again = {**base, "kind": kind, "n": n}
            again.update({"state": str(state)} if kind != "ray_data" else {"skip": args.restart_at})
            restart = measure(again, args.timeout)
            r["restart_first_batch_s"] = restart.get("first_batch_s")
            r["restart_error"] = restart.get("error")
        results.append({"kind": kind, "n": n, **r})
        if "error" in r:
            print(f"{kind + ' ' + str(n):<14} failed: {r['error']}")
            continue
        rate = r["batches"] / r["seconds"] if r["seconds"] else 0.0
        restart_s = r.get("restart_first_batch_s")
        print(
            f"{kind + ' ' + str(n):<14} {rate:>10.2f} {r['tokens'] / r['seconds'] / 1e6 if r['seconds'] else 0:>10.3f} "
            f"{r['loop_cpu_ms']:>18.2f} {r['first_batch_s']:>14.2f} "
            f"{restart_s if restart_s is not None else float('nan'):>10.2f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=1))


if __name__ == "__main__":
    main()
