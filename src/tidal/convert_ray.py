"""The Ray engine of ``tidal convert``: each output shard one Ray task, the same :func:`~tidal.convert.run_task`.

The job (the chain, the plan, the destination) is put in Ray's object store once; each task
reads its source range and writes, places and records its shard exactly as a local process
does, so a conversion started on Ray can be finished locally and the other way round. On a
cluster (``ray_address="ray://head:10001"`` or ``"auto"``) every node needs tidal installed
and must reach the source and the destination (object storage, or a shared file system).

Where no Ray is initialized in this process, it connects to ``ray_address`` or starts a local Ray
of ``workers`` CPUs (all of them when 1), and disconnects (a local Ray: stops it) at the end; a
Ray already initialized, as in a notebook or a test, is used and left as it was.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tidal.convert import Job, run_task
from tidal.errors import TidalError


def _task(job: Job, shard: int) -> tuple[int, dict]:
    return run_task(job, shard)


def run_ray(
    job: Job, todo: list[int], workers: int, address: str | None, done: Callable[[tuple[int, dict]], None]
) -> None:
    """Run the shards ``todo`` as Ray tasks, at most ``workers`` at once when above 1."""
    try:
        import ray
    except ImportError:
        raise TidalError("--engine ray needs Ray: pip install 'ray[data]'") from None
    started = False
    if not ray.is_initialized():
        if address:  # a cluster: its own settings
            ray.init(address=address)
        else:
            ray.init(num_cpus=workers if workers > 1 else None, include_dashboard=False)
        started = True
    try:
        remote = ray.remote(num_cpus=1, max_retries=0)(_task)
        job_ref = ray.put(job)
        limit = workers if workers > 1 else len(todo)
        queue = list(todo)
        pending: dict[Any, int] = {}
        while queue or pending:
            while queue and len(pending) < limit:
                shard = queue.pop(0)
                pending[remote.remote(job_ref, shard)] = shard
            finished, _ = ray.wait(list(pending), num_returns=1)
            for ref in finished:
                shard = pending.pop(ref)
                try:
                    done(ray.get(ref))
                except ray.exceptions.RayTaskError as exc:  # the task's own error, as raised in the task
                    for ref2 in pending:
                        ray.cancel(ref2)
                    cause = exc.as_instanceof_cause()
                    raise (cause.cause if getattr(cause, "cause", None) is not None else cause) from None
                except ray.exceptions.RayError as exc:
                    for ref2 in pending:
                        ray.cancel(ref2)
                    raise TidalError(
                        f"the Ray task writing {job.name(shard)} failed ({type(exc).__name__}); "
                        "the finished shards are kept: run the same conversion again to go on"
                    ) from exc
    finally:
        if started:
            ray.shutdown()
