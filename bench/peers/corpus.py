"""The corpus and every peer's copy of it, each made once while its parameters hold: the shared generator's JSONL
(the one PEERS.md was measured on), each conversion in its own process with its time kept in ``manifest.json``,
and the tokenizer. A change of one parameter rebuilds what depends on it, and only that."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import load_json, log, sha1, train_tokenizer

from peers import COPIES, FORMAT_OF
from peers.harness import DRIVER, result
from peers.tidal import JSONL, warm_index


def corpus_dir(args: argparse.Namespace) -> Path:
    """One directory per corpus, so that ``--quick`` and the full run keep their caches side by side."""
    return Path(args.data) / f"{args.total_gb:g}gb-{args.shards}shards-seed{args.seed}"


def format_params(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """What each converted copy depends on besides the corpus: a change rebuilds that copy alone."""
    return {fmt: c.params(args) for fmt, c in COPIES.items() if c.params is not None}


def prepare(args: argparse.Namespace, loaders: list[str], need_tokenizer: bool) -> dict[str, Any]:
    """Generate the corpus, convert it into every format and train the tokenizer, each once while its
    parameters hold; warm tidal's index of the JSONL and Parquet copies. Returns the manifest."""
    root = corpus_dir(args)
    script = Path(args.corpus_script)
    if not script.is_file():
        sys.exit(f"corpus generator not found: {script} (pass --corpus-script)")
    path = root / "manifest.json"
    manifest = load_json(path)
    corpus = {"generator_sha1": sha1(script), "total_gb": args.total_gb, "shards": args.shards, "seed": args.seed}
    if manifest.get("corpus") != corpus or not JSONL.files(root / "jsonl"):
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        manifest = {"corpus": corpus, **generate(script, root / "jsonl", args)}
        path.write_text(json.dumps(manifest, indent=1))
    needed = {FORMAT_OF[x] for x in loaders}
    for fmt, params in format_params(args).items():
        if fmt not in needed:
            continue
        done = manifest.setdefault("formats", {}).get(fmt, {})
        if done.get("params") != params or not COPIES[fmt].files(root / fmt):
            log(f"converting the corpus to {fmt} (once) ...")
            manifest["formats"][fmt] = {"params": params, **convert_in_child(fmt, root, args)}
            path.write_text(json.dumps(manifest, indent=1))
    if need_tokenizer:
        tok = root / f"tokenizer-{args.vocab}-{args.train_mb:g}mb.json"
        if manifest.get("tokenizer", {}).get("file") != tok.name or not tok.is_file():
            log(f"training a {args.vocab} byte-level BPE tokenizer on the first {args.train_mb:g} MB of text ...")
            t0 = time.perf_counter()
            train_tokenizer(JSONL.files(root / "jsonl"), tok, args.vocab, int(args.train_mb * 1e6))
            manifest["tokenizer"] = {"file": tok.name, "train_s": round(time.perf_counter() - t0, 1)}
            path.write_text(json.dumps(manifest, indent=1))
    index = warm_index(root)
    if "tidal_index_s" not in manifest:  # the first open after the corpus was made: tidal's one-off cost
        manifest["tidal_index_s"] = index
        path.write_text(json.dumps(manifest, indent=1))
    manifest["root"] = str(root)
    return manifest


def generate(script: Path, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The shared generator's JSONL shards, and what they hold."""
    log(f"generating the corpus into {out} ({args.total_gb:g} GB, {args.shards} shards, seed {args.seed}) ...")
    t0 = time.perf_counter()
    cmd = [sys.executable, str(script), str(out), "--total-gb", str(args.total_gb)]
    subprocess.run([*cmd, "--shards", str(args.shards), "--seed", str(args.seed)], check=True, stdout=sys.stderr)
    seconds = time.perf_counter() - t0
    records = nbytes = 0
    for f in JSONL.files(out):
        data = Path(f).read_bytes()
        records += data.count(b"\n")
        nbytes += len(data)
    return {"generate_s": round(seconds, 1), "records": records, "jsonl_bytes": nbytes}


def convert_in_child(fmt: str, root: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Run one conversion in its own process: ``litdata.optimize`` sets the start method to spawn for good."""
    out = root / fmt
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, str(DRIVER), "--convert", fmt, str(root / "jsonl"), str(out)]
    cmd += ["--shard-mb", str(args.shard_mb), "--row-group", str(args.row_group)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    got = result(proc.stdout)
    if proc.returncode != 0 or got is None:
        shutil.rmtree(out, ignore_errors=True)
        sys.exit(f"converting to {fmt} failed:\n{proc.stderr[-3000:]}")
    files = COPIES[fmt].files(out)
    got["bytes"] = sum(os.path.getsize(f) for f in files)
    got["files"] = len(files)
    return got


def convert(fmt: str, src: str, out: str, shard_mb: float, row_group: int) -> dict[str, Any]:
    """Write one format from the JSONL shards; the seconds of the conversion alone (imports excluded)."""
    copy = COPIES.get(fmt)
    if copy is None or copy.write is None:
        raise SystemExit(f"unknown format {fmt!r}")
    return copy.write(JSONL.files(src), out, shard_mb, row_group)
