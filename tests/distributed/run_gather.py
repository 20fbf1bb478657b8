"""One rank of a run whose loader state is gathered without pickle, for tests/sources/test_discover.py.

``run_gather.py DATA OUT`` under torchrun: ``torch.distributed``'s object collectives (which
pickle what they send and unpickle what they receive) raise here, so ``state_dict()`` must
gather the ranks' parts as plain data. Each rank takes 3 batches, saves the state, takes 2
more; then a fresh loader restored from the state takes 2. Writes ``OUT/rank{R}.json``.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path
from typing import Any

import gloo_group
import torch.distributed as dist

import tidal


def refused(*args: Any, **kwargs: Any) -> None:
    raise AssertionError("an object collective: it unpickles what other ranks send")


def main() -> None:
    data, out = sys.argv[1], Path(sys.argv[2])
    rank, _ = gloo_group.join()
    for name in ("all_gather_object", "gather_object", "broadcast_object_list", "scatter_object_list"):
        setattr(dist, name, refused)
    ds = tidal.Dataset(data).shuffle(seed=4, block_size=16).batch(4)
    loader = tidal.DataLoader(ds, num_workers=0)
    it = iter(loader)
    head = [b["id"].tolist() for b in itertools.islice(it, 3)]
    state = loader.state_dict()
    rest = [b["id"].tolist() for b in itertools.islice(it, 2)]
    del it
    again = tidal.DataLoader(ds, num_workers=0)
    again.load_state_dict(json.loads(json.dumps(state)))
    resumed = [b["id"].tolist() for b in itertools.islice(again, 2)]
    (out / f"rank{rank}.json").write_text(json.dumps({"head": head, "state": state, "rest": rest, "resumed": resumed}))
    gloo_group.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
