"""On a machine with a GPU and many cores: worker scaling next to LitData, and a training step fed
by ``tidal.DataLoader`` with pinned memory and ``prefetch_to_device``, with its data-wait share.

Workers adding throughput cannot be judged on a 2-core machine; this runs where the cores are.
The corpus is ``bench_tokens.py``'s: synthetic pre-tokenized documents (uint16, log-normal
lengths around 800 tokens), written as tidal token shards, as a Parquet ``list<uint16>`` column
and by ``litdata.optimize`` with its ``TokensLoader``. Each measurement is a fresh process: the time to its first batch,
then batches of (8, 2048) for ``--seconds``.

    python bench/bench_device.py --out results.json          # worker scaling, then the GPU step
    python bench/bench_device.py --skip-gpu --workers 0 2     # scaling only
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
if kind.startswith("tidal"):
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
print(json.dumps({"first_batch_s": first, "tokens_per_s": n * 8 * 2048 / (time.perf_counter() - start)}))
"""


def scaling(root: Path, workers: list[int], seconds: float) -> list[dict]:
    rows = []
    for n in workers:
        for kind in ("litdata", "tidal-tokens", "tidal-parquet"):
            cmd = [sys.executable, "-c", SCALING, kind, str(n), str(root), str(seconds)]
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds * 6 + 120)
            row: dict = {"loader": kind, "workers": n}
            if out.returncode == 0:
                row.update(json.loads(out.stdout.strip().splitlines()[-1]))
            else:
                row["error"] = out.stderr[-1500:]
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


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
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    root = Path(args.data).resolve()
    t = time.perf_counter()
    prepare(root, args.tokens)
    print(f"corpus ready in {time.perf_counter() - t:.0f} s; cores {os.cpu_count()}", flush=True)
    result: dict = {"scaling": scaling(root, args.workers, args.seconds), "train": []}
    if not args.skip_gpu:
        for workers, ahead, pin in ((4, 2, True), (4, 0, False), (0, 2, True)):
            row = train(root, args.steps, workers, ahead, pin, args.device, args.layers)
            print(json.dumps(row), flush=True)
            result["train"].append(row)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
