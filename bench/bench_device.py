"""On a machine with a GPU and many cores: worker scaling next to LitData, and a training step fed
by ``tidal.DataLoader`` with pinned memory and ``prefetch_to_device``, with its data-wait share.

Workers adding throughput cannot be judged on a 2-core machine; this runs where the cores are.
The corpus is ``bench_tokens.py``'s: synthetic pre-tokenized documents (uint16, log-normal
lengths around 800 tokens), written as tidal token shards, as a Parquet ``list<uint16>`` column
and by ``litdata.optimize`` with its ``TokensLoader``. With ``--text``, also the shared generator's
text (``gen_corpus.py``) as JSON lines and as Parquet, read as records in batches of 8. Each
measurement is a fresh process: the time to its first batch, then batches for ``--seconds``.
``--trees before=DIR,after=DIR`` runs every tidal loader once per source tree (``DIR`` holds the
``tidal`` package), interleaved, to compare two versions on the same machine in one run.

    python bench/bench_device.py --out results.json          # worker scaling, then the GPU step
    python bench/bench_device.py --skip-gpu --workers 0 2     # scaling only
    python bench/bench_device.py --skip-gpu --text --corpus-script ../shared/bench/gen_corpus.py \
        --trees before=/tmp/old/src,after=src                # two versions, tokens and text
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench_tokens import prepare  # the same corpus: token shards, a Parquet column, LitData chunks

SCALING = r"""
import json, sys, time
t0 = time.perf_counter()
kind, workers, root, seconds = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
if kind.startswith("tidal-text"):
    import tidal
    ds = tidal.Dataset(root + "/text/" + kind.split("-")[-1]).shuffle(seed=0).repeat().batch(8)
    loader = tidal.DataLoader(ds, num_workers=workers, persistent_workers=False)
    def batches():
        yield from loader
elif kind.startswith("tidal"):
    import tidal
    source, column = (root + "/tidal", "input_ids") if kind == "tidal-tokens" else (root + "/parquet", "tokens")
    ds = tidal.Dataset(source).shuffle(seed=0).repeat().pack(2048, column=column, outputs=("input_ids",)).batch(8)
    loader = tidal.DataLoader(ds, num_workers=workers, persistent_workers=False)
    def batches():
        yield from loader
else:
    from litdata import StreamingDataLoader, StreamingDataset
    from litdata.streaming.item_loader import TokensLoader
    ds = StreamingDataset(root + "/litdata", item_loader=TokensLoader(block_size=2048), shuffle=True, drop_last=True)
    loader = StreamingDataLoader(ds, batch_size=8, num_workers=workers, drop_last=True)
    def batches():
        while True:
            yield from loader
it = batches()
b = next(it)
first = time.perf_counter() - t0
start = time.perf_counter(); n = 0
while time.perf_counter() - start < seconds:
    b = next(it); n += 1
rate = n / (time.perf_counter() - start)
unit = {"records_per_s": rate * 8} if kind.startswith("tidal-text") else {"tokens_per_s": rate * 8 * 2048}
print(json.dumps({"first_batch_s": first, **unit}))
"""


def scaling(root: Path, workers: list[int], seconds: float, trees: dict[str, str], text: bool) -> list[dict]:
    """Every loader at every worker count, a fresh process each; tidal's once per tree."""
    kinds = ["tidal-tokens", "tidal-parquet"] + (["tidal-text-jsonl", "tidal-text-parquet"] if text else [])
    rows = []
    for n in workers:
        runs = [("litdata", "")] + [(kind, tree) for kind in kinds for tree in trees]
        for kind, tree in runs:
            cmd = [sys.executable, "-c", SCALING, kind, str(n), str(root), str(seconds)]
            env = dict(os.environ)
            if tree and trees[tree]:
                env["PYTHONPATH"] = os.pathsep.join(p for p in (trees[tree], env.get("PYTHONPATH", "")) if p)
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds * 6 + 120, env=env)
            row: dict = {"loader": kind, "workers": n, **({"tree": tree} if len(trees) > 1 else {})}
            if out.returncode == 0:
                row.update(json.loads(out.stdout.strip().splitlines()[-1]))
            else:
                row["error"] = out.stderr[-1500:]
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def prepare_text(root: Path, script: Path, gb: float) -> None:
    """The shared generator's text as 8 JSON lines files, and the same records as 8 Parquet files
    (snappy, row groups of 10,000: pyarrow's defaults but the group size)."""
    if (root / "parquet").exists():
        return
    import pyarrow.json as pj
    import pyarrow.parquet as pq

    cmd = [sys.executable, str(script), str(root / "jsonl"), "--total-gb", str(gb), "--shards", "8", "--seed", "1234"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    (root / "parquet.partial").mkdir(exist_ok=True)
    for f in sorted((root / "jsonl").glob("*.jsonl")):
        table = pj.read_json(f, read_options=pj.ReadOptions(block_size=64 << 20))
        pq.write_table(table, root / "parquet.partial" / f"{f.stem}.parquet", row_group_size=10_000)
    (root / "parquet.partial").rename(root / "parquet")


def train(root: Path, steps: int, workers: int, ahead: int, pin: bool, device: str = "cuda", layers: int = 12) -> dict:
    """A GPT-2 step (12 layers, 768 wide, bf16) on (8, 2048) packed rows: how long the loop waits
    for data, against its whole time."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    import tidal

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=layers, n_embd=768, n_head=12, n_positions=2048, vocab_size=32_000))
    model = model.to(device).to(torch.bfloat16)
    cuda = device == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ds = tidal.Dataset(root / "tidal").shuffle(seed=0).repeat().pack(2048).batch(8)
    loader = tidal.DataLoader(ds, num_workers=workers, pin_memory=pin, device=device, prefetch_to_device=ahead)
    it = iter(loader)
    wait = 0.0
    for step in range(steps + 5):
        if step == 5:  # after warm-up: the clock starts
            if cuda:
                torch.cuda.synchronize()
            start, wait = time.perf_counter(), 0.0
        t = time.perf_counter()
        batch = next(it)
        wait += time.perf_counter() - t
        ids = batch["input_ids"].to(device, non_blocking=True)
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    if cuda:
        torch.cuda.synchronize()
    total = time.perf_counter() - start
    return {
        "workers": workers,
        "prefetch_to_device": ahead,
        "pin_memory": pin,
        "step_s": total / steps,
        "data_wait_s": wait,
        "data_wait_share": wait / total,
        "tokens_per_s": steps * 8 * 2048 / total,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="bench-data/device")
    ap.add_argument("--tokens", type=int, default=100_000_000)
    ap.add_argument("--workers", type=int, nargs="*", default=[0, 2, 4, 8])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--skip-gpu", action="store_true")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--text", action="store_true", help="also the shared generator's text, JSON lines and Parquet")
    ap.add_argument("--corpus-script", default=str(Path(__file__).resolve().parents[2] / "shared/bench/gen_corpus.py"))
    ap.add_argument("--text-gb", type=float, default=0.3)
    ap.add_argument("--trees", default="", help="name=DIR,...: run tidal's loaders from each source tree")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    root = Path(args.data).resolve()
    trees = dict(t.split("=", 1) for t in args.trees.split(",")) if args.trees else {"tidal": ""}
    trees = {name: str(Path(d).resolve()) if d else "" for name, d in trees.items()}
    t = time.perf_counter()
    prepare(root, args.tokens)
    if args.text:
        prepare_text(root / "text", Path(args.corpus_script), args.text_gb)
    print(f"corpus ready in {time.perf_counter() - t:.0f} s; cores {os.cpu_count()}", flush=True)
    result: dict = {"scaling": scaling(root, args.workers, args.seconds, trees, args.text), "train": []}
    if not args.skip_gpu:
        for workers, ahead, pin in ((4, 2, True), (4, 0, False), (0, 2, True)):
            row = train(root, args.steps, workers, ahead, pin, args.device, args.layers)
            print(json.dumps(row), flush=True)
            result["train"].append(row)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
