"""One rank of a training loop that sets mixture weights live, for tests/stages/test_weights.py.

``run_weights.py WEB CODE OUT WORKERS`` under torchrun: every training step is a batch and an
all_reduce (what DDP does with the gradients), so a rank that waited in a collective of its own
would hang the others. Every rank sets the same weights after the same batch, takes more batches
and saves the state; then rank 1 sets weights a batch after rank 0 (each in its own step), then
other weights than rank 0; each time the next state_dict() raises on every rank. Writes
``OUT/rank{R}.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import gloo_group
import torch
import torch.distributed as dist

import tidal


def main() -> None:
    web, code, out, workers = sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
    rank, _ = gloo_group.join()
    streams = {"web": tidal.Dataset(web).shuffle(seed=1).repeat(), "code": tidal.Dataset(code).shuffle(seed=2).repeat()}
    ds = tidal.mix(streams, weights={"web": 0.9, "code": 0.1}, seed=0, stop="never").batch(4)  # no step collective
    loader = tidal.DataLoader(ds, num_workers=workers)
    it = iter(loader)

    def step() -> list[str]:
        batch = next(it)
        dist.all_reduce(torch.ones(1))  # the gradients
        return list(batch["src"])

    def state_dict() -> dict | None:
        try:
            return loader.state_dict()
        except tidal.ArgumentError as exc:
            errors.append(str(exc))
            return None

    errors: list[str] = []
    before = [step() for _ in range(3)]
    loader.set_weights({"web": 0.0, "code": 1.0})  # every rank, after batch 3
    after = [step() for _ in range(3)]
    agreed = state_dict()
    for batches in (6, 7, 8):
        if batches == 6 + rank:  # rank 0 after batch 6, rank 1 after batch 7
            loader.set_weights({"web": 1.0, "code": 1.0})
        step()
    state_dict()  # after 9 batches on every rank: told
    loader.set_weights({"web": 1.0, "code": float(1 + rank)})  # after batch 9 on every rank, other weights
    step()
    state_dict()  # told
    step()
    state_dict()  # told again: the weights in force still differ
    loader.set_weights({"web": 1.0, "code": 1.0})
    step()
    last = state_dict()
    result: dict[str, Any] = {"before": before, "after": after, "agreed": agreed, "errors": errors, "last": last}
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    gloo_group.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
