#!/usr/bin/env python3
"""Tokenize + pack throughput of tidal, next to raw ``tokenizers`` and Hugging Face ``datasets`` streaming.

The corpus comes from the shared generator (``gen_corpus.py``, the one PEERS.md was measured on) and is
cached under ``--data`` with a 32k byte-level BPE tokenizer trained on its first ``--train-mb`` MB of text.
Every measurement reads the same texts: the first ``--mb`` MB of the corpus (``--mb / shards`` from the start
of each shard), written once as a small corpus of its own, and runs to the end of it in a fresh Python
process. The measurements run in rounds (``--repeats``), interleaved, and the table shows medians.

    .venv/bin/python bench/bench_tokenize.py                  # 0.2 GB corpus, 20 MB per measurement, 3 rounds
    .venv/bin/python bench/bench_tokenize.py --quick          # 10 MB per measurement, 1 round
    .venv/bin/python bench/bench_tokenize.py --json out.json  # also write every figure as JSON

tokens/s counts the tokens delivered, one EOS per document included: for raw ``tokenizers`` what
``encode_batch*`` returned plus one per document; for the pipelines the non-padding token slots of the
(batch, seq_len) batches they yield. Rates are steady-state: tokens after the first batch over the time after
it (for raw ``tokenizers``: all of it; the texts are in memory before the clock starts).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from common import EOS, corpus_texts, load_json, log, sha1, train_tokenizer

REPO = Path(__file__).resolve().parent.parent
DATA_VERSION = 1
RESULT = "RESULT "  # prefix of the line a child prints its figures on


# ----------------------------------------------------------------------------------------------------------------
# the corpus, the tokenizer and the measured texts


def prepare(args: argparse.Namespace) -> dict[str, Any]:
    """Generate the corpus, train the tokenizer and cut the measured texts, each once while its parameters hold."""
    data = Path(args.data)
    data.mkdir(parents=True, exist_ok=True)
    script = Path(args.corpus_script)
    if not script.is_file():
        sys.exit(f"corpus generator not found: {script} (pass --corpus-script)")
    manifest_path = data / "manifest.json"
    manifest = load_json(manifest_path)
    corpus = {
        "version": DATA_VERSION,
        "generator_sha1": sha1(script),
        "total_gb": args.total_gb,
        "shards": args.shards,
        "seed": args.seed,
    }
    jsonl = data / "jsonl"
    if manifest.get("corpus") != corpus or not jsonl.is_dir():
        manifest = {"corpus": corpus}
        log(f"generating the corpus into {jsonl} ({args.total_gb} GB, {args.shards} shards, seed {args.seed})")
        t0 = time.perf_counter()
        for old in [jsonl, *data.glob("texts-*"), *data.glob("tokenizer-*.json")]:  # all of them came from the old one
            if old.is_dir():
                shutil.rmtree(old)
            else:
                old.unlink(missing_ok=True)
        cmd = [sys.executable, str(script), str(jsonl), "--total-gb", str(args.total_gb)]
        cmd += ["--shards", str(args.shards), "--seed", str(args.seed)]
        subprocess.run(cmd, check=True, stdout=sys.stderr)
        manifest["generate_s"] = round(time.perf_counter() - t0, 1)
        manifest_path.write_text(json.dumps(manifest, indent=1))
    files = sorted(jsonl.glob("*.jsonl"))

    # the tokenizer and the texts are named by their parameters; an entry in the manifest says one is complete
    tok_file = data / f"tokenizer-{args.vocab}-{args.train_mb:g}mb.json"
    tokenizers = manifest.setdefault("tokenizers", {})
    if tok_file.name not in tokenizers or not tok_file.is_file():
        log(f"training a {args.vocab} byte-level BPE tokenizer on the first {args.train_mb:g} MB of text")
        t0 = time.perf_counter()
        train_tokenizer(files, tok_file, args.vocab, int(args.train_mb * 1e6))
        tokenizers[tok_file.name] = {"vocab": args.vocab, "train_mb": args.train_mb, "special": [EOS]}
        tokenizers[tok_file.name]["train_s"] = round(time.perf_counter() - t0, 1)
        manifest_path.write_text(json.dumps(manifest, indent=1))

    subset = data / f"texts-{args.mb:g}mb"
    texts = manifest.setdefault("texts", {})
    if subset.name not in texts or not subset.is_dir():
        log(f"cutting the measured texts: the first {args.mb / len(files):g} MB of each of {len(files)} shards")
        texts[subset.name] = {"mb": args.mb, **cut_texts(files, subset, int(args.mb * 1e6 / len(files)))}
        manifest_path.write_text(json.dumps(manifest, indent=1))
    return {"tokenizer": str(tok_file), "texts": str(subset), "texts_facts": texts[subset.name], "manifest": manifest}


def cut_texts(files: list[Path], out: Path, per_shard: int) -> dict[str, int]:
    """The first ``per_shard`` bytes of text of every shard, as JSONL shards of their own (whole lines)."""
    out.mkdir(parents=True, exist_ok=True)
    for old in out.iterdir():
        old.unlink()
    docs = chars = 0
    for path in files:
        n = 0
        with open(path, encoding="utf-8") as src, open(out / path.name, "w", encoding="utf-8") as dst:
            for line in src:
                if n >= per_shard:
                    break
                n += len(json.loads(line)["text"])
                dst.write(line)
                docs += 1
        chars += n
    return {"docs": docs, "text_bytes": chars}


# ----------------------------------------------------------------------------------------------------------------
# measurements, each in a child process (``--child SPEC``)


@dataclass
class Spec:
    name: str
    kind: str  # "raw" | "tidal" | "hf"
    label: str
    texts: str = ""
    tokenizer: str = ""
    method: str = "encode_batch_fast"  # raw: which tokenizers method
    shuffle: bool = False
    strategy: str = "concat"
    workers: int | None = None  # tidal: None iterates the Dataset itself, else a tidal.DataLoader
    env: dict[str, str] = field(default_factory=dict)  # set in the child's environment (RAYON_NUM_THREADS, ...)
    seq_len: int = 2048
    batch: int = 8
    raw_batch: int = 256
    seed: int = 0


class Clock:
    """Wall time and CPU time of this process and its reaped children (DataLoader workers, once joined)."""

    def __init__(self) -> None:
        self.t0, self.cpu0 = time.perf_counter(), self.cpu()

    @staticmethod
    def cpu() -> float:
        me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime

    def read(self) -> tuple[float, float]:
        return time.perf_counter() - self.t0, self.cpu() - self.cpu0


def _files(texts: str) -> list[Path]:
    return sorted(Path(texts).glob("*.jsonl"))


def run_raw(spec: Spec) -> dict[str, Any]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(spec.tokenizer)
    texts = list(corpus_texts(_files(spec.texts), 1 << 62))
    encode = getattr(tok, spec.method)
    clock = Clock()
    tokens = 0
    for i in range(0, len(texts), spec.raw_batch):
        chunk = texts[i : i + spec.raw_batch]
        tokens += sum(len(e.ids) for e in encode(chunk, add_special_tokens=False)) + len(chunk)  # + one EOS each
    wall, cpu = clock.read()
    return {"tokens": tokens, "docs": len(texts), "seconds": wall, "cpu_s": cpu, "first_batch_s": 0.0}


def _pipeline(spec: Spec) -> Iterator[dict[str, Any]]:
    """The batches of one pipeline: dicts with ``input_ids`` (and for tidal ``segment_ids``) of (batch, seq_len)."""
    if spec.kind == "tidal":
        import tidal

        ds = tidal.Dataset(spec.texts, columns=["text"])
        if spec.shuffle:
            ds = ds.shuffle(seed=spec.seed)
        ds = ds.tokenize(spec.tokenizer).pack(spec.seq_len, spec.strategy).batch(spec.batch, drop_last=False)
        if spec.workers is None:
            return iter(ds)
        return iter(tidal.DataLoader(ds, num_workers=spec.workers))
    return _hf_pipeline(spec)


def _hf_pipeline(spec: Spec) -> Iterator[dict[str, Any]]:
    """``datasets`` streaming with the ``tokenize`` and ``group_texts`` maps of transformers' ``run_clm.py``."""
    from itertools import chain

    import numpy as np
    from datasets import load_dataset
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_file=spec.tokenizer, eos_token=EOS)
    eos, block = tok.eos_token_id, spec.seq_len

    def tokenize(batch: dict[str, list]) -> dict[str, list]:
        out = tok(batch["text"])
        for ids, mask in zip(out["input_ids"], out["attention_mask"], strict=True):
            ids.append(eos)  # one EOS per document, as tidal and the raw count do
            mask.append(1)
        return dict(out)

    def group_texts(examples: dict[str, list]) -> dict[str, list]:
        joined = {k: list(chain(*examples[k])) for k in examples}
        total = len(joined["input_ids"]) // block * block
        result = {k: [t[i : i + block] for i in range(0, total, block)] for k, t in joined.items()}
        result["labels"] = result["input_ids"].copy()
        return result

    files = [str(p) for p in _files(spec.texts)]
    ds = load_dataset("json", data_files=files, split="train", streaming=True)
    ds = ds.map(tokenize, batched=True, remove_columns=["id", "text"]).map(group_texts, batched=True)
    for batch in ds.iter(batch_size=spec.batch):
        yield {k: np.asarray(v, dtype=np.int64) for k, v in batch.items()}


def run_pipeline(spec: Spec) -> dict[str, Any]:
    clock = Clock()
    it = _pipeline(spec)
    first = t_first = None
    tokens = batches = slots = 0
    for batch in it:
        ids = batch["input_ids"]
        seg = batch.get("segment_ids")
        n = int((seg != 0).sum()) if seg is not None else int(ids.numel() if hasattr(ids, "numel") else ids.size)
        if first is None:
            first, t_first = n, clock.read()
            continue
        tokens += n
        slots += int(ids.numel() if hasattr(ids, "numel") else ids.size)
        batches += 1
    del it  # DataLoader workers are joined here, so their CPU time is counted
    wall, cpu = clock.read()
    if t_first is None:
        raise SystemExit("the pipeline yielded no batch")
    return {
        "tokens": tokens,
        "batches": batches,
        "padding": 1 - tokens / slots if slots else 0.0,
        "seconds": wall - t_first[0],
        "first_batch_s": t_first[0],
        "total_tokens": tokens + first,
        "total_s": wall,
        "cpu_s": cpu,  # over the whole run: startup included
    }


def child(spec_json: str) -> None:
    spec = Spec(**json.loads(spec_json))
    # imports before any clock starts: the figures are about tokenizing, not about importing torch
    if spec.kind == "tidal":
        import tidal

        if spec.workers is not None:
            tidal.DataLoader  # noqa: B018  (imports torch)
    elif spec.kind == "hf":
        import datasets  # noqa: F401
        import transformers  # noqa: F401
    result = run_raw(spec) if spec.kind == "raw" else run_pipeline(spec)
    result["max_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(RESULT + json.dumps(result), flush=True)


def measure(spec: Spec, timeout: float) -> dict[str, Any]:
    env = {**os.environ, **spec.env}
    cmd = [sys.executable, __file__, "--child", json.dumps(asdict(spec))]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:g} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT)]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        return {"error": f"exit {proc.returncode}: " + " | ".join(tail)}
    out = json.loads(lines[-1][len(RESULT) :])
    out["tokens_per_s"] = out["tokens"] / out["seconds"]
    return out


# ----------------------------------------------------------------------------------------------------------------
# the plan, the peers and the report


def plan(args: argparse.Namespace, prep: dict[str, Any]) -> list[Spec]:
    common = {"texts": prep["texts"], "tokenizer": prep["tokenizer"], "seq_len": args.seq_len, "batch": args.batch}
    one = {"RAYON_NUM_THREADS": "1"}
    w = args.workers
    specs = [
        Spec("raw_fast", "raw", "tokenizers encode_batch_fast, default pool", **common),
        Spec("raw_fast_1t", "raw", "tokenizers encode_batch_fast, 1 thread", env=one, **common),
        Spec("raw_batch", "raw", "tokenizers encode_batch, default pool", method="encode_batch", **common),
        Spec("raw_batch_1t", "raw", "tokenizers encode_batch, 1 thread", method="encode_batch", env=one, **common),
        Spec("tidal", "tidal", "tidal concat, 1 process", **common),
        Spec("tidal_shuffled", "tidal", "tidal concat, shuffled, 1 process", shuffle=True, **common),
        Spec("tidal_best_fit", "tidal", "tidal best_fit, shuffled, 1 process", shuffle=True, strategy="best_fit", **common),
        Spec("tidal_loader", "tidal", f"tidal.DataLoader {w} workers, shuffled, 1 thread each", shuffle=True, workers=w, env=one, **common),
        Spec("tidal_loader_pool", "tidal", f"tidal.DataLoader {w} workers, shuffled, default pool each", shuffle=True, workers=w, **common),
        Spec("hf", "hf", "HF datasets streaming, map(tokenize) + map(group_texts)", **common),
    ]  # fmt: skip
    if args.only:
        wanted = set(args.only.split(","))
        specs = [s for s in specs if s.name in wanted]
    return specs


def peers(path: Path) -> dict[str, Any]:
    """The tokenize + pack row of PEERS.md and its raw tokenizer limits, as text."""
    try:
        text = path.read_text()
    except OSError:
        return {}
    out: dict[str, Any] = {}
    rows = [ln for ln in text.splitlines() if ln.startswith("|")]
    if rows:
        header = [c.strip() for c in rows[0].strip("|").split("|")]
        for ln in rows:
            cells = [c.strip() for c in ln.strip("|").split("|")]
            if cells[0].startswith("tokenize + pack"):
                out["tokenize_pack"] = dict(zip(header[1:], cells[1:], strict=False))
    m = re.search(r"`encode_batch`\s+([\d.]+M) tokens/s on 1 thread and ([\d.]+M) tokens/s on 2 threads", text)
    if m:
        out["raw_encode_batch"] = {"1 thread": m.group(1), "2 threads": m.group(2)}
    return out


def _tidal_commit() -> str:
    def git(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "?"
    return commit + (" (src/ has uncommitted changes)" if git("status", "--porcelain", "src") else "")


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for pkg in ("tidal", "tokenizers", "transformers", "datasets", "torch", "numpy"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def _m(x: float) -> str:
    return f"{x / 1e6:.3f}M"


def report(args: argparse.Namespace, specs: list[Spec], runs: dict[str, list[dict]], info: dict[str, Any]) -> dict:
    summary: dict[str, dict[str, Any]] = {}
    for spec in specs:
        ok = [r for r in runs[spec.name] if "error" not in r]
        if not ok:
            summary[spec.name] = {"label": spec.label, "error": runs[spec.name][-1].get("error", "not run")}
            continue
        rates = [r["tokens_per_s"] for r in ok]
        cpus = [r["cpu_s"] / r.get("total_s", r["seconds"]) for r in ok]
        summary[spec.name] = {
            "label": spec.label,
            "env": spec.env,
            "tokens_per_s": statistics.median(rates),
            "min": min(rates),
            "max": max(rates),
            "runs": len(ok),
            "cpus_busy": statistics.median(cpus),
            "tokens_per_cpu_s": statistics.median(r["total_tokens" if "total_s" in r else "tokens"] / r["cpu_s"] for r in ok),
            "first_batch_s": statistics.median(r["first_batch_s"] for r in ok),
            "padding": statistics.median(r.get("padding", 0.0) for r in ok),
            "max_rss_mb": max(r["max_rss_mb"] for r in ok),
            "tokens": ok[0].get("total_tokens", ok[0]["tokens"]),
        }  # fmt: skip

    def rate(name: str) -> float | None:
        return summary.get(name, {}).get("tokens_per_s")

    # ratios within each round too: the rounds are interleaved, so a busy spell of the machine hits both sides
    for spec in specs:
        for base in ("raw_fast", "hf"):
            pairs = zip(runs.get(spec.name, []), runs.get(base, []), strict=False)
            ratios = [a["tokens_per_s"] / b["tokens_per_s"] for a, b in pairs if "error" not in a and "error" not in b]
            if ratios and spec.name != base and "error" not in summary[spec.name]:
                summary[spec.name][f"vs_{base.split('_')[0]}_per_round"] = ratios

    raw, hf = rate("raw_fast"), rate("hf")
    print()
    print(
        f"{'':58} {'tokens/s':>9} {'range':>15} {'CPUs':>5} {'tok/CPU-s':>9} {'1st batch':>9} {'vs raw':>7} {'vs HF':>6}"
    )
    for spec in specs:
        s = summary[spec.name]
        if "error" in s:
            print(f"{spec.label:58} skipped: {s['error']}")
            continue
        r = s["tokens_per_s"]
        vs_raw = f"{r / raw:.2f}x" if raw and spec.kind != "raw" else ""
        vs_hf = f"{r / hf:.2f}x" if hf and spec.kind == "tidal" else ""
        s["vs_raw"] = r / raw if raw else None
        s["vs_hf"] = r / hf if hf else None
        rng = f"{_m(s['min'])}-{_m(s['max'])}" if s["runs"] > 1 else ""
        first = f"{s['first_batch_s']:.2f} s" if spec.kind != "raw" else ""
        pad = f"  padding {s['padding']:.1%}" if spec.strategy == "best_fit" else ""
        print(
            f"{spec.label:58} {_m(r):>9} {rng:>15} {s['cpus_busy']:5.2f} {_m(s['tokens_per_cpu_s']):>9} "
            f"{first:>9} {vs_raw:>7} {vs_hf:>6}{pad}"
        )
    print()
    print("vs raw: tokens/s over tokenizers encode_batch_fast with its default pool (target >= 0.9x);")
    print("vs HF: over HF datasets streaming with map + group_texts (target >= 2x). CPUs: CPU seconds per second,")
    print(
        "workers included; tok/CPU-s: tokens per CPU second, which moves less than tokens/s when the machine is busy."
    )
    targets = {}
    for name in ("tidal", "tidal_shuffled", "tidal_loader"):
        s = summary.get(name, {})
        if "tokens_per_s" in s and raw and hf:
            targets[name] = {"vs_raw_ok": s["vs_raw"] >= 0.9, "vs_hf_ok": s["vs_hf"] >= 2.0}
    if targets:
        marks = ", ".join(
            f"{summary[n]['label']}: vs raw {'met' if t['vs_raw_ok'] else 'MISSED'}, vs HF {'met' if t['vs_hf_ok'] else 'MISSED'}"
            for n, t in targets.items()
        )
        print(f"targets: {marks}")

    p = info["peers"]
    if p:
        print()
        print(f"Peers, from {args.peers} (measured in another run, on the 2 GB corpus, each peer in its own format;")
        print("absolute figures drift 15-25% between runs, so compare ratios within one run):")
        for peer, cell in p.get("tokenize_pack", {}).items():
            print(f"  tokenize + pack, 1 process, {peer}: {cell} tokens/s")
        for threads, cell in p.get("raw_encode_batch", {}).items():
            print(f"  raw tokenizers encode_batch, {threads}: {cell} tokens/s")
    return {"summary": summary, "targets": targets}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--data", default=str(REPO / "bench-data" / "tokenize"), help="cache of corpus, tokenizer, texts")
    ap.add_argument("--corpus-script", default=str(REPO.parent / "shared" / "bench" / "gen_corpus.py"))
    ap.add_argument("--peers", default=str(REPO.parent / "shared" / "bench" / "PEERS.md"))
    ap.add_argument("--total-gb", type=float, default=0.2, help="corpus size (PEERS.md: 2.0)")
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--train-mb", type=float, default=50.0, help="MB of text the tokenizer is trained on")
    ap.add_argument("--mb", type=float, default=20.0, help="MB of text each measurement tokenizes")
    ap.add_argument("--repeats", type=int, default=3, help="rounds of measurements; the table shows medians")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds after which one measurement is abandoned")
    ap.add_argument("--only", help="comma-separated measurement names (raw_fast, tidal, hf, ...)")
    ap.add_argument("--quick", action="store_true", help="--mb 10 --train-mb 10 --repeats 1")
    ap.add_argument("--json", help="also write every figure to this file")
    args = ap.parse_args()
    if args.child:
        child(args.child)
        return
    if args.quick:
        args.mb, args.train_mb, args.repeats = 10.0, 10.0, 1

    t_start = time.perf_counter()
    load0 = os.getloadavg()
    prep = prepare(args)
    texts = prep["texts_facts"]
    specs = plan(args, prep)
    skipped = {}
    if any(s.kind == "hf" for s in specs):
        try:
            import datasets  # noqa: F401
            import transformers  # noqa: F401
        except ImportError as e:
            skipped["hf"] = f"HF datasets streaming needs `pip install datasets transformers` ({e})"
            log(f"skipping {skipped['hf']}")
            specs = [s for s in specs if s.kind != "hf"]

    print(f"tidal {_tidal_commit()}; {' '.join(f'{k} {v}' for k, v in _versions().items())}")
    print(
        f"{os.cpu_count()} CPUs, load average {load0[0]:.2f} at the start (another busy process changes every figure)"
    )
    print(
        f"texts: {texts['docs']} documents, {texts['text_bytes'] / 1e6:.1f} MB, from {prep['texts']}; "
        f"tokenizer {Path(prep['tokenizer']).name}; pack {args.seq_len}, batch {args.batch}; "
        f"{args.repeats} round(s), medians"
    )
    runs: dict[str, list[dict]] = {s.name: [] for s in specs}
    for k in range(args.repeats):
        for spec in specs:
            log(f"round {k + 1}/{args.repeats}: {spec.label} ...")
            r = measure(spec, args.timeout)
            runs[spec.name].append(r)
            log(f"    {_m(r['tokens_per_s'])} tokens/s" if "error" not in r else f"    failed: {r['error']}")
    for name, reason in skipped.items():
        runs[name] = [{"error": reason}]
        specs.append(Spec(name, name, "HF datasets streaming, map(tokenize) + map(group_texts)"))

    info = {"peers": peers(Path(args.peers))}
    result = report(args, specs, runs, info)
    load1 = os.getloadavg()
    print(f"\nload average {load1[0]:.2f} at the end; {time.perf_counter() - t_start:.0f} s in all")
    if args.json:
        doc = {
            "args": vars(args),
            "commit": _tidal_commit(),
            "versions": _versions(),
            "cpus": os.cpu_count(),
            "load_average": {"start": load0, "end": load1},
            "data": prep,
            "specs": [asdict(s) for s in specs],
            "runs": runs,
            **result,
            "peers": info["peers"],
        }
        Path(args.json).write_text(json.dumps(doc, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
