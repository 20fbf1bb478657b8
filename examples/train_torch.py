"""Train a causal LM in a plain torch loop on a tidal stream, counting steps, resumable exactly.

    python examples/train_torch.py --data DIR --tokenizer tokenizer.json --max_steps 1000 --out run/
    python examples/train_torch.py ... --resume          # continues model, optimizer and data

Under torchrun each rank reads its own share; the checkpoint holds one data state per rank.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F
import transformers

import tidal


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--out", default="run")
    p.add_argument("--seq_len", type=int, default=256)
    p.add_argument("--batch_size", type=int, default=8)
    p.add_argument("--max_steps", type=int, default=200)
    p.add_argument("--save_every", type=int, default=50)
    p.add_argument("--num_workers", type=int, default=2)
    p.add_argument("--resume", action="store_true")
    args = p.parse_args()

    distributed = "RANK" in os.environ
    if distributed:
        torch.distributed.init_process_group("gloo")
    rank = torch.distributed.get_rank() if distributed else 0

    ds = tidal.Dataset(args.data, columns=["text"]).shuffle(seed=0).repeat()
    ds = ds.tokenize(args.tokenizer).pack(args.seq_len).batch(args.batch_size)
    loader = tidal.DataLoader(ds, num_workers=args.num_workers)

    tok = tidal.stages.tokenize.load(args.tokenizer)
    vocab, eos = tok.backend.get_vocab_size(), tok.eos_id
    config = transformers.GPT2Config(
        vocab_size=vocab, n_positions=args.seq_len, n_embd=128, n_layer=2, n_head=4, bos_token_id=eos, eos_token_id=eos
    )
    model = transformers.GPT2LMHeadModel(config)
    if distributed:
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    out, step = Path(args.out), 0
    if args.resume and (out / "latest").exists():
        ckpt = out / (out / "latest").read_text().strip()
        saved = torch.load(ckpt / "train.pt")
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        loader.load_state_dict(json.loads((ckpt / f"data-rank{rank}.json").read_text()))
        step = saved["step"]
        print(f"resumed at step {step} from {ckpt}")

    for batch in loader:
        logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits
        loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if step % 10 == 0 and rank == 0:
            print(f"step {step} loss {loss.item():.3f}")
        if step % args.save_every == 0 or step == args.max_steps:
            ckpt = out / f"step-{step}"
            ckpt.mkdir(parents=True, exist_ok=True)
            (ckpt / f"data-rank{rank}.json").write_text(json.dumps(loader.state_dict()))
            if rank == 0:
                torch.save(
                    {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, ckpt / "train.pt"
                )
                (out / "latest").write_text(ckpt.name)
        if step >= args.max_steps:
            break
    if distributed:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
