"""One training process for tests/loaders/test_distributed.py: iterate tidal.DataLoader jobs, write what it saw.

Run as ``python run_loader.py CONFIG.json``: under ``torch.distributed.run`` (the config says
``"dist": true``; the process joins a gloo group and removes RANK/WORLD_SIZE from its
environment, so the topology can only come from ``torch.distributed``), or as a plain process whose rank comes
from RANK/WORLD_SIZE, or as a single process. The config lists jobs; each job builds a
dataset over ``config["data"]``, optionally restores a loader state from a JSON file, iterates
``passes`` passes (at most ``steps`` batches in all) and writes, per rank,
``{out}/{job}-rank{rank}.json`` with every batch (ids, texts, the DataLoader worker that made
each record) and the loader states saved along the way (``{out}/{job}-rank{rank}-state-*.json``).
"""

from __future__ import annotations

import json
import os
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
    return {**record, "worker": -1 if info is None else tidal.World.current().worker}


def _dataset(data: str, job: dict) -> tidal.Dataset:
    ds = tidal.Dataset(data)
    if job.get("seed") is not None:
        ds = ds.shuffle(
            job["seed"], block_size=job.get("block_size", 32), shards_per_block=job.get("shards_per_block", 2)
        )
    if job.get("repeat") == "forever":
        ds = ds.repeat()
    elif job.get("repeat") is not None:
        ds = ds.repeat(job["repeat"])
    return ds.map(_tag_worker).batch(job["batch"], drop_last=job["drop_last"])


def _plain(batch: dict) -> dict:
    def as_list(value: Any) -> list:
        return (
            value.tolist()
            if isinstance(value, torch.Tensor)
            else [int(v) if isinstance(v, torch.Tensor) else v for v in value]
        )

    return {"id": as_list(batch["id"]), "text": as_list(batch["text"]), "worker": as_list(batch["worker"])}


def _save(path: Path, state: dict) -> None:
    path.write_text(json.dumps(state))


def run_job(config: dict, job: dict, rank: int, world_size: int) -> None:
    out = Path(config["out"])
    name = job["name"]
    extra = {"persistent_workers": True} if job.get("persistent") else {}
    loader = tidal.DataLoader(_dataset(config["data"], job), num_workers=job["workers"], **extra)
    result: dict[str, Any] = {"rank": rank, "batches": [], "pass_lengths": [], "error": None}
    if job.get("resume"):
        other = (rank + 1) % world_size  # another rank's state, for the tests that expect a refusal
        state = json.loads(Path(job["resume"].format(rank=rank, other=other)).read_text())
        try:
            loader.load_state_dict(state)
            if job.get("expect_error"):
                next(iter(loader))
        except tidal.StateError as exc:
            if not job.get("expect_error"):
                raise
            result["error"] = f"{type(exc).__name__}: {exc}"
            (out / f"{name}-rank{rank}.json").write_text(json.dumps(result))
            return
    save_at = set(job.get("save_at", []))
    steps = job.get("steps")
    if 0 in save_at:
        _save(out / f"{name}-rank{rank}-state-0.json", loader.state_dict())
    interrupt_at = set(job.get("interrupt_at", []))
    count = 0
    for p in range(job.get("passes", 1)):
        before = count
        batches = iter(loader)
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                break
            result["batches"].append(_plain(batch))
            count += 1
            if count in save_at:
                _save(out / f"{name}-rank{rank}-state-{count}.json", loader.state_dict())
            if steps is not None and count >= steps:
                break
            if count in interrupt_at:  # the training loop stops here; a new iter(loader) must continue
                batches = iter(loader)
        result["pass_lengths"].append(count - before)
        if steps is not None and count >= steps:
            break
        _save(out / f"{name}-rank{rank}-state-pass{p + 1}.json", loader.state_dict())
    (out / f"{name}-rank{rank}.json").write_text(json.dumps(result))


def main() -> None:
    config = json.loads(Path(sys.argv[1]).read_text())
    if config.get("dist"):
        rank, world_size = gloo_group.join()
    else:
        rank, world_size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    try:
        for job in config["jobs"]:
            run_job(config, job, rank, world_size)
            if config.get("dist"):
                gloo_group.barrier()  # every rank finishes a job before any starts the next
    finally:
        if config.get("dist"):
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
