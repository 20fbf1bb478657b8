"""One training process for tests/loaders/test_distributed_elastic.py: consume tidal.DataLoader jobs, write what it saw.

Run as ``python run_elastic.py CONFIG.json`` under ``torch.distributed.run`` (the config says
``"dist": true``: the process joins a gloo group and drops RANK/WORLD_SIZE from its
environment, so tidal can only learn the topology from ``torch.distributed``) or as a plain
process. Each job of the config builds a dataset over ``config["data"]``, optionally loads a
loader state from a JSON file (saved on any topology), consumes batches until the pass ends
or ``steps`` batches, calls ``loader.state_dict()`` after each step in ``save_at`` (a
collective under torch.distributed: every rank calls it at the same step) and writes, per
rank, ``{out}/{job}-rank{rank}.json`` (every batch: the ids and the DataLoader worker of each
record) and ``{out}/{job}-rank{rank}-state-{step}.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import gloo_group
import torch
import torch.distributed as dist
import torch.utils.data

import tidal


def _tag_worker(record: dict) -> dict:
    info = torch.utils.data.get_worker_info()
    return {"id": record["id"], "worker": 0 if info is None else tidal.World.current().worker}


def _dataset(data: str, job: dict) -> tidal.Dataset:
    ds = tidal.Dataset(data).shuffle(
        job["seed"], block_size=job["block_size"], shards_per_block=job["shards_per_block"]
    )
    if job.get("repeat") == "forever":
        ds = ds.repeat()
    return ds.map(_tag_worker).batch(job["batch"], drop_last=job["drop_last"])


def _ints(value: Any) -> list[int]:
    return value.tolist() if isinstance(value, torch.Tensor) else [int(v) for v in value]


def run_job(config: dict, job: dict, rank: int) -> None:
    out = Path(config["out"])
    name = job["name"]
    loader = tidal.DataLoader(_dataset(config["data"], job), num_workers=job["workers"])
    if job.get("resume"):
        loader.load_state_dict(json.loads(Path(job["resume"]).read_text()))
    save_at = set(job.get("save_at", []))
    steps = job.get("steps")
    batches: list[dict] = []
    if steps != 0:
        for batch in loader:
            batches.append({"id": _ints(batch["id"]), "worker": _ints(batch["worker"])})
            if len(batches) in save_at:
                state = loader.state_dict()  # every rank at the same step: it gathers all ranks' states
                (out / f"{name}-rank{rank}-state-{len(batches)}.json").write_text(json.dumps(state))
            if steps is not None and len(batches) >= steps:
                break
    (out / f"{name}-rank{rank}.json").write_text(json.dumps({"rank": rank, "batches": batches}))


def main() -> None:
    config = json.loads(Path(sys.argv[1]).read_text())
    if config.get("dist"):
        rank, _ = gloo_group.join()
    else:
        rank = 0
    try:
        for job in config["jobs"]:
            run_job(config, job, rank)
            if config.get("dist"):
                gloo_group.barrier()  # every rank finishes a job before any starts the next
    finally:
        if config.get("dist"):
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
