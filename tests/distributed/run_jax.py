"""One JAX process of a test run: ``python run_jax.py CONFIG PROCESS_ID NUM_PROCESSES PORT``.

With NUM_PROCESSES > 1 the processes join with ``jax.distributed.initialize`` on CPU (each with
the devices ``XLA_FLAGS`` gives it) and read through ``tidal.jax.Loader``. Each job writes
``{job}-p{PROCESS_ID}.json``: per step, this process's rows (from the global array's shards
on its own devices) and the whole global batch (gathered from every process), plus the loader
states it saved. Jobs (from CONFIG):

- ``full``: the whole finite epoch;
- ``resume``: ``steps`` batches, ``state_dict()`` (saved to ``state.json``), then a new loader
  restored from it reads the rest;
- ``restore``: a new loader restored from the state file ``state`` reads to the end;
- ``uneven``: a filtered finite epoch, whose processes have different numbers of batches.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

import tidal
import tidal.jax


def keep(record: dict) -> bool:
    return int(record["id"]) < 60


def dataset(config: dict, uneven: bool = False) -> tidal.Dataset:
    ds = tidal.Dataset(config["data"]).shuffle(**config["shuffle"])
    if uneven:
        ds = ds.filter(keep)
    return ds.batch(config["batch"])


def rows(batch: dict) -> dict[str, Any]:
    """This process's rows of the global ``id`` array, and the whole array, as lists."""
    ids = batch["id"]
    shards = sorted(ids.addressable_shards, key=lambda s: s.index[0].start)
    local = np.concatenate([np.asarray(s.data) for s in shards])
    whole = np.asarray(multihost_utils.process_allgather(ids, tiled=True)) if jax.process_count() > 1 else ids
    assert ids.shape == (config["batch"] * jax.process_count(),), ids.shape
    texts = batch["text"]  # not numeric: this process's own rows, as a list
    assert [t.split()[1] for t in texts] == [str(i) for i in local.tolist()], (texts, local)
    return {"local": local.tolist(), "global": np.asarray(whole).tolist()}


def run(job: dict) -> dict:
    out: dict[str, Any] = {"steps": []}
    workers = job.get("workers", 2)
    name = job["name"]
    if name == "full" or name == "uneven":
        loader = tidal.jax.Loader(dataset(config, uneven=name == "uneven"), num_workers=workers)
        out["steps"] = [rows(b) for b in loader]
    elif name == "resume":
        ds = dataset(config)
        first = tidal.jax.Loader(ds, num_workers=workers, prefetch=3)
        out["steps"] = [rows(b) for b in itertools.islice(first, job["steps"])]
        state = json.loads(json.dumps(first.state_dict()))
        first.close()
        out["state"] = state
        if jax.process_index() == 0:
            (Path(config["out"]) / "state.json").write_text(json.dumps(state))
        second = tidal.jax.Loader(ds, num_workers=workers, prefetch=0)
        second.load_state_dict(state)
        out["rest"] = [rows(b) for b in second]
    elif name == "restore":
        loader = tidal.jax.Loader(dataset(config), num_workers=workers)
        loader.load_state_dict(json.loads(Path(job["state"]).read_text()))
        out["steps"] = [rows(b) for b in loader]
        out["state"] = loader.state_dict()
    return out


if __name__ == "__main__":
    config = json.loads(Path(sys.argv[1]).read_text())
    process_id, processes, port = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    if processes > 1:
        jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=processes, process_id=process_id)
    assert tidal.World.ranks() == tidal.World(process_id, processes)
    for job in config["jobs"]:
        result = run(job)
        (Path(config["out"]) / f"{job['name']}-p{process_id}.json").write_text(json.dumps(result))
