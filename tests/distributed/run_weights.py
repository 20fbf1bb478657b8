"""One rank of a loop that sets mixture weights live, for tests/test_weights.py.

``run_weights.py WEB CODE OUT`` under torchrun: every rank sets the same weights after the same
batch, saves the state and takes more batches; then a rank that sets other weights, and a rank
that sets them a batch later, get the error on every rank. Writes ``OUT/rank{R}.json``.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import gloo_group
import torch.distributed as dist

import tidal


def main() -> None:
    web, code, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    rank, _ = gloo_group.join()
    streams = {"web": tidal.Dataset(web).shuffle(seed=1).repeat(), "code": tidal.Dataset(code).shuffle(seed=2).repeat()}
    ds = tidal.mix(streams, weights={"web": 0.9, "code": 0.1}, seed=0, stop="never").batch(4)  # no step collective
    loader = tidal.DataLoader(ds, num_workers=2)
    it = iter(loader)
    before = [next(it)["src"] for _ in range(3)]
    loader.set_weights({"web": 0.0, "code": 1.0})
    after = [next(it)["src"] for _ in range(3)]
    state = loader.state_dict()
    errors = []
    try:
        loader.set_weights({"web": 1.0, "code": float(rank)})  # other weights on rank 1
    except tidal.ArgumentError as exc:
        errors.append(str(exc))
    if rank == 1:
        next(it)
    try:
        loader.set_weights({"web": 1.0})  # rank 1 a batch later
    except tidal.ArgumentError as exc:
        errors.append(str(exc))
    result = {"before": before, "after": after, "state": state, "errors": errors}
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    list(itertools.islice(it, 0))
    gloo_group.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
