"""A training process that never ends, for tests/loaders/test_procs.py: the harness must kill all it left.

Run as ``python run_hang.py OUT`` (under ``torch.distributed.run`` or as a plain process given
RANK). It starts three kinds of processes that a ``killpg`` of its launcher misses: a child
in a session of its own, an orphan (its parent exits at once, so init adopts it), and two
DataLoader workers that never yield; then it waits for a batch forever. Each process
announces itself with an empty file ``OUT/rank{RANK}-{role}-{pid}``. With ``--fail-after N``
it instead waits until N such files exist and exits with status 3.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

OUT = Path(sys.argv[1])
RANK = os.environ.get("RANK", "0")


def announce(role: str) -> None:
    (OUT / f"rank{RANK}-{role}-{os.getpid()}").touch()


def forever() -> None:
    while True:
        time.sleep(0.1)


def escaped() -> None:
    if os.fork() == 0:
        os.setsid()
        announce("escaped")
        forever()


def orphan() -> None:
    child = os.fork()
    if child == 0:
        if os.fork() == 0:
            os.setsid()
            announce("orphan")
            forever()
        os._exit(0)
    os.waitpid(child, 0)


def main() -> None:
    if sys.argv[2:3] == ["--fail-after"]:
        while len(list(OUT.iterdir())) < int(sys.argv[3]):
            time.sleep(0.05)
        sys.exit(3)
    announce("main")
    escaped()
    orphan()
    import torch.utils.data

    class Stuck(torch.utils.data.IterableDataset):
        def __iter__(self) -> Iterator[int]:
            announce("worker")
            forever()
            yield 0

    next(iter(torch.utils.data.DataLoader(Stuck(), num_workers=2)))


if __name__ == "__main__":
    main()
