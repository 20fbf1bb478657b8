"""One rank of a DDP-like loop over a finite, filtered dataset, for tests/loaders/test_distributed_uneven.py.

``run_uneven.py DATA OUT`` under torchrun: every step does an all_reduce, as DDP's backward
does, so a rank with a batch more than another would wait forever. Writes the ids of its
batches to ``OUT/rank{R}.json``, and the error a state saved at different steps on the
two ranks gets.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import gloo_group
import torch
import torch.distributed as dist

import tidal


def keep(record: dict) -> bool:
    return record["id"] % 3 != 0 or record["id"] < 120  # rank 0's share keeps more than rank 1's


def main() -> None:
    data, out = sys.argv[1], Path(sys.argv[2])
    gloo_group.join()
    ds = tidal.Dataset(data).filter(keep).batch(4, drop_last=True)
    loader = tidal.DataLoader(ds, num_workers=2)
    batches = []
    for passes in range(2):  # a second pass: the next epoch, still together
        for batch in loader:
            step = torch.ones(1)
            dist.all_reduce(step)  # the collective every DDP step makes
            batches.append([passes, *batch["id"].tolist()])
    # a state taken after different numbers of batches on different ranks is refused on every rank
    apart = tidal.DataLoader(tidal.Dataset(data).repeat().batch(4), num_workers=0)
    batches_apart = iter(apart)
    for _ in range(1 + dist.get_rank()):
        next(batches_apart)
    try:
        apart.state_dict()
        refused = ""
    except tidal.StateError as exc:
        refused = str(exc)
    (out / f"rank{dist.get_rank()}.json").write_text(json.dumps({"batches": batches, "refused": refused}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
