"""One rank for tests/loaders/test_ray.py: 2 ranks (torchrun) x 2 tidal.ray readers each, on the test's Ray cluster.

Run as ``python run_ray.py CONFIG.json`` under ``torch.distributed.run``: the rank joins a gloo
group, connects to the cluster at ``config["address"]``, and iterates
``tidal.ray.DataLoader(dataset, readers=2)`` over the dataset ``config["dataset"]`` describes to
the end of its epoch. After ``config["save_at"]`` batches every rank saves the gathered state
(a collective); after ``config["kill_at"]`` batches the rank ``config["kill_rank"]`` kills its
reader 0. Each rank writes ``{out}/rank{rank}.json``: the ids of every batch, the state saved,
and how many of its readers were replaced.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import gloo_group
import ray

import tidal
import tidal.ray


def main() -> None:
    config = json.loads(Path(sys.argv[1]).read_text())
    rank, _ = gloo_group.join()
    ray.init(address=config["address"])
    ds = tidal.Dataset.from_config(config["dataset"])
    loader = tidal.ray.DataLoader(ds, readers=2, reader_options={"num_cpus": 0.25})
    batches, state = [], None
    for step, batch in enumerate(loader, 1):
        batches.append(batch["id"].tolist())
        if step == config["save_at"]:
            state = loader.state_dict()
        if step == config["kill_at"] and rank == config["kill_rank"]:
            ray.kill(loader.readers[0])
    out = {"batches": batches, "state": state, "replaced": loader.stats().get("readers_replaced", 0)}
    (Path(config["out"]) / f"rank{rank}.json").write_text(json.dumps(out))
    gloo_group.barrier()


if __name__ == "__main__":
    main()
