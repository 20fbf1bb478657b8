"""The gloo group that the scripts here join under torchrun, with a bound on every wait.

gloo lets a collective wait 30 minutes by default, so a rank stuck outside a collective, or
ranks that called collectives a different number of times, hang the test until it is killed,
and say nothing. Here a rank that waits longer than :data:`TIMEOUT` for the others fails
instead, with a traceback: gloo's "Timed out waiting" in the collective it waited in, and,
between jobs, monitoredBarrier's "rank N failed to pass" naming the rank that never came.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch.distributed as dist

TIMEOUT = timedelta(seconds=60)  # a run takes seconds; a rank that waits this long for another is stuck


def join() -> tuple[int, int]:
    """Join the gloo group torchrun describes; its rank and world size.

    torchrun also sets RANK/WORLD_SIZE; they are dropped from the environment, so that tidal
    has to ask ``torch.distributed``.
    """
    dist.init_process_group("gloo", timeout=TIMEOUT)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"):
        os.environ.pop(name, None)
    return dist.get_rank(), dist.get_world_size()


def barrier() -> None:
    """Every rank gets here before any goes on; a rank that does not come in time is named."""
    dist.monitored_barrier(timeout=TIMEOUT)
