"""What surrounds the tables: the versions and commit measured, the corpus and its conversions (the header), and
the figures drawn, one panel per workload."""

from __future__ import annotations

import argparse
import contextlib
import math
import subprocess
from typing import Any

from peers import COPIES, RESUMABLE
from peers.harness import REPO
from peers.plan import FRACTIONS, S3_RUNS, TEXT_RUNS, raw_name, s3_name, text_name
from peers.tables import med, summary


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    pkgs = ("tidal", "mosaicml-streaming", "litdata", "datasets", "webdataset", "tokenizers", "torch", "pyarrow")
    for pkg in (*pkgs, "moto", "s3fs", "obstore", "boto3"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def tidal_commit() -> str:
    def git(*a: str) -> str:
        with contextlib.suppress(OSError):
            return subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True).stdout.strip()
        return ""

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    return commit + (" dirty (src/ has uncommitted changes)" if git("status", "--porcelain", "src") else "")


def conversions(manifest: dict[str, Any]) -> str:
    f = manifest.get("formats", {})

    def one(fmt: str) -> str:
        got = f.get(fmt)
        return (
            f"{got['seconds']:.1f} s ({got['tool']}; {got['bytes'] / 1e6:,.0f} MB in {got['files']} files)"
            if got
            else "-"
        )

    idx = manifest.get("tidal_index_s", {})
    return "\n".join(
        [
            "conversion of the corpus, once (s):",
            f"  tidal-jsonl: none needed (tidal's index, built on the first open: {idx.get('jsonl', '-')} s)",
            f"  tidal-parquet and hf, Parquet: {one('parquet')}",
            f"  litdata: {one('litdata')}",
            f"  mosaic, MDS: {one('mds')}",
            f"  webdataset, tar: {one('wds')}",
        ]
    )


def header(res: dict[str, Any], manifest: dict[str, Any], args: argparse.Namespace) -> str:
    v = res["versions"]
    load0, load1 = res["loadavg_start"], res["loadavg_end"]
    return "\n".join(
        [
            f"tidal {v['tidal']} at {res['commit']}; peers: mosaicml-streaming {v['mosaicml-streaming']}, "
            f"litdata {v['litdata']}, datasets {v['datasets']}, webdataset {v['webdataset']}; tokenizers "
            f"{v['tokenizers']}, torch {v['torch']}, pyarrow {v['pyarrow']}",
            f"machine: {res['cpus']} CPUs ({res['usable_cpus']} usable); load average {load0[0]:.2f} {load0[1]:.2f} "
            f"{load0[2]:.2f} at the start, {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f} at the end; whole run "
            f"{res['total_s']:.0f} s",
            f"corpus: gen_corpus.py --total-gb {args.total_gb:g} --shards {args.shards} --seed {args.seed}: "
            f"{manifest['records']:,} records, {manifest['jsonl_bytes'] / 1e6:,.0f} MB of JSONL ({manifest['root']})",
            f"each measurement a fresh process; {args.repeats} interleaved repetition(s), {args.seconds:g} s of steady "
            f"state each; shuffle seed {args.shuffle_seed}",
            conversions(manifest),
        ]
    )


def plot(res: dict[str, Any], loaders: list[str], workloads: set[str], threads: int, path: str) -> None:
    """One panel per workload, bars per loader; a log scale where the bars differ by more than 20x."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = res["runs"]

    def m(name: str, key: str) -> float:
        return med(summary(runs.get(name), key)) or 0.0

    panels: list[tuple[str, list[str], dict[str, list[float]]]] = []
    if "text" in workloads:
        series = {f"{w}w b{b}": [m(text_name(x, w, b), "rate") for x in loaders] for w, b in TEXT_RUNS}
        panels.append(("text records/s", loaders, series))
    if "tokens" in workloads:
        series = {f"{w}w": [m(f"tokens {x} w{w}", "rate") for x in loaders] for w in (0, 2)}
        names = [*loaders, f"raw {threads}t"]
        for s in series.values():
            s.append(m(raw_name("encode_batch", threads), "rate"))
        panels.append(("tokenize + pack tokens/s", names, series))
    if "first" in workloads:
        series = {"s": [m(f"first {x}", "first_batch_from_start_s") for x in loaders]}
        series["s"].append(m("first import", "first_batch_from_start_s"))
        panels.append(("first batch from process start, s", [*loaders, "import"], series))
    if "resume" in workloads:
        rl = [x for x in loaders if x in RESUMABLE]
        series = {f"{at:.0%}": [m(f"resume {x} {at}", "first_batch_after_load_s") for x in rl] for at in FRACTIONS}
        panels.append(("resume: load_state_dict -> 1st batch, s", rl, series))
    if "rss" in workloads:
        series = {f"{w}w": [m(text_name(x, w, 8), "peak_rss_gb") for x in loaders] for w in (0, 2)}
        panels.append(("peak RSS of the process tree, GB", loaders, series))
    if "s3" in workloads:
        series = {f"{w}w b{b}": [m(s3_name(x, w, b), "rate") for x in loaders] for w, b in S3_RUNS}
        panels.append(("from S3 (moto, loopback), cold cache, records/s", loaders, series))
    if "limits" in workloads:
        got = res["runs"].get("cache", [])
        fmts = list(COPIES)
        series = {"GB/s": [med(summary([g.get(f, {}) for g in got], "gb_per_s")) or 0.0 for f in fmts]}
        panels.append(("page cache read, GB/s", fmts, series))
    if not panels:
        return
    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 4.2 * rows), squeeze=False)
    for ax, (title, names, series) in zip(axes.flat, panels, strict=False):
        width = 0.8 / len(series)
        for i, (label, vals) in enumerate(series.items()):
            ax.bar([j + i * width for j in range(len(names))], vals, width, label=label)
        ax.set_xticks([j + width * (len(series) - 1) / 2 for j in range(len(names))], names, rotation=30, ha="right")
        ax.set_title(title, fontsize=10)
        positive = [v for vals in series.values() for v in vals if v > 0]
        if positive and max(positive) / min(positive) > 20:
            ax.set_yscale("log")
        if len(series) > 1:
            ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.suptitle(f"tidal {res['commit']} next to its peers ({res['cpus']} CPUs)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
