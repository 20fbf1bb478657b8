"""One rank of a cheap training loop that the kill-and-resume chaos test kills at random points.

``run_train.py DATA OUT CYCLE SEED`` under torchrun (2 DataLoader workers per rank). It resumes
from ``OUT/state.json`` when there is one, then for every batch appends one line to
``OUT/audit-c{CYCLE}-r{RANK}.jsonl`` (the step and the batch's record ids) and every
``EVERY`` steps saves the loader state (a collective: every rank calls it) to ``state.json``,
atomically, with the cycle and step it was taken at. At the end of the data it writes
``OUT/done``. What was consumed is the audit of each cycle up to the step of the state the
next cycle resumed from: the test checks that it holds every record exactly once per epoch.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import gloo_group
import torch
import torch.distributed as dist

import tidal

EVERY = 3
EPOCHS = 2


def main() -> None:
    data, out, cycle, seed = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    gloo_group.join()
    rank = dist.get_rank()
    ds = (
        tidal.Dataset(data)
        .shuffle(seed=seed, block_size=64, shards_per_block=3)
        .repeat(EPOCHS)
        .batch(4, drop_last=False)
    )
    loader = tidal.DataLoader(ds, num_workers=2)
    saved = out / "state.json"
    step = 0
    if saved.exists():
        checkpoint = json.loads(saved.read_text())
        loader.load_state_dict(checkpoint["state"])
        step = checkpoint["step"]
    with open(out / f"audit-c{cycle}-r{rank}.jsonl", "a") as audit:
        for batch in loader:
            step += 1
            audit.write(json.dumps({"step": step, "ids": batch["id"].tolist()}) + "\n")
            audit.flush()
            if step % EVERY == 0:
                state = loader.state_dict()
                if rank == 0:
                    tmp = out / f"state.json.{os.getpid()}"
                    tmp.write_text(json.dumps({"cycle": cycle, "step": step, "state": state}))
                    os.replace(tmp, saved)
                dist.barrier()  # the state is on disk before any rank goes on
            loss = torch.ones(1)
            dist.all_reduce(loss)  # the collective of a DDP step
    dist.barrier()
    if rank == 0:
        (out / "done").write_text(str(step))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
