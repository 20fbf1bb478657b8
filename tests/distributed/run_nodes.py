"""One rank of a job on several "nodes" (torchrun launchers on 127.0.0.1), reading from S3.

``run_nodes.py CONFIG``: CONFIG is JSON with ``url``, ``out``, ``seed``, ``block_size``,
``shards_per_block``, ``batch``, ``workers``, ``save_every``, ``sleep`` (seconds per step, so
that a test can kill a node mid-epoch), ``resume`` (a state file or null) and, per node
(``nodes[GROUP_RANK]``), ``storage_options`` and ``cache_dir``. Each rank writes the ids of every
batch it consumed to ``out/<name>-rank<r>.json``; rank 0 writes the loader state every
``save_every`` steps to ``out/<name>-state-<step>.json``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import gloo_group
import torch.distributed as dist

import tidal

if __name__ == "__main__":
    config = json.loads(Path(sys.argv[1]).read_text())
    node = config["nodes"][int(os.environ["GROUP_RANK"])]
    rank, _ = gloo_group.join()
    ds = tidal.Dataset(config["url"], storage_options=node["storage_options"], cache_dir=node["cache_dir"])
    ds = ds.shuffle(config["seed"], block_size=config["block_size"], shards_per_block=config["shards_per_block"])
    loader = tidal.DataLoader(ds.batch(config["batch"], drop_last=False), num_workers=config["workers"])
    if config.get("resume"):
        loader.load_state_dict(json.loads(Path(config["resume"]).read_text()))
    out, name = Path(config["out"]), config["name"]
    seen: list[list[int]] = []
    for step, batch in enumerate(loader, 1):
        seen.append(batch["id"].tolist())
        (out / f"{name}-rank{rank}.json").write_text(json.dumps(seen))
        if step % config["save_every"] == 0:
            state = loader.state_dict()  # every rank, at the same step
            if rank == 0:
                tmp = out / f".{name}-state-{step}.json"
                tmp.write_text(json.dumps(state))
                tmp.rename(out / f"{name}-state-{step}.json")
        time.sleep(config.get("sleep", 0))
    gloo_group.barrier()
    dist.destroy_process_group()
