"""A training loop preempted the way Kubernetes and SLURM do it: SIGTERM, caught by a handler that
asks the loop to save the loader's state and exit (docs/reliability.md, "Preemption").

``run_preempted.py DATA OUT [STATE]``: DataLoader with 2 workers over ``Dataset(DATA).shuffle(1).batch(4)``,
resumed from STATE when given. Writes every batch's ids to ``OUT/ids.jsonl`` as it goes; on SIGTERM
saves ``OUT/state.json`` after the last batch trained on, and exits 0.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import tidal

if __name__ == "__main__":
    data, out = Path(sys.argv[1]), Path(sys.argv[2])
    stop = False

    def preempted(signum: int, frame: object) -> None:
        global stop
        stop = True  # the loop saves at the end of the step it is in: never from inside the handler

    signal.signal(signal.SIGTERM, preempted)
    loader = tidal.DataLoader(tidal.Dataset(data).shuffle(seed=1).batch(4), num_workers=2)
    if len(sys.argv) > 3:
        loader.load_state_dict(json.loads(Path(sys.argv[3]).read_text()))
    with (out / "ids.jsonl").open("a") as log:
        for batch in loader:
            log.write(json.dumps(batch["id"].tolist()) + "\n")
            log.flush()
            time.sleep(0.02)  # the training step
            if stop:
                (out / "state.json").write_text(json.dumps(loader.state_dict()))
                break
    sys.exit(0)
