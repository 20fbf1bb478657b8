"""One process of an HF Accelerate training loop over a tidal.DataLoader, for tests/loaders/test_clients.py.

Run under torchrun: ``run_accelerate.py DATA OUT run`` trains on every batch of one epoch and
saves the Accelerate state after 7 batches; ``... resume`` loads that state and trains on the
rest. Each process writes the ids of the batches it trained on to ``OUT/{phase}-{rank}.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from accelerate import Accelerator

import tidal


def main() -> None:
    data, out, phase = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    accelerator = Accelerator(cpu=True)
    ds = tidal.Dataset(data).shuffle(seed=1, block_size=32).batch(6)
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer, loader = accelerator.prepare(model, optimizer, tidal.DataLoader(ds, num_workers=2))
    if phase == "resume":
        accelerator.load_state(out / "checkpoint")
    seen = []
    for batch in loader:
        seen.append(batch["id"].tolist())
        loss = model(batch["id"].float()[:, None]).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        if phase == "run" and len(seen) == 7:
            accelerator.save_state(out / "checkpoint")
    (out / f"{phase}-{accelerator.process_index}.json").write_text(json.dumps(seen))
    accelerator.end_training()


if __name__ == "__main__":
    main()
