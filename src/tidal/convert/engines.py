"""Where the tasks of a job run (a conversion's shards, an index's batches of files):
processes of this machine, or Ray tasks.

Both run ``job.run(task)`` and hand each result to ``done`` as it comes. A job is picklable and
says what it is (``noun``) and what a task does (``doing(task)``) for the messages.

- :func:`run_processes`: ``workers`` processes started with ``spawn`` (safe beside threads, the
  same on every OS); the job is sent once to each. A process that dies (killed, out of memory)
  is named as such; finished shards stay finished.
- :func:`run_ray`: each shard a Ray task (``ray`` imported only here). The job is put in Ray's
  object store once. Where no Ray is initialized in this process, it connects to
  ``ray_address`` or starts a local Ray of ``workers`` CPUs (all of them when 1), and
  disconnects (a local Ray: stops it) at the end; a Ray already initialized, as in a notebook
  or a test, is used and left as it was. On a cluster every node needs tidal installed and
  must reach the source and the destination (object storage, or a shared file system).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from tidal.errors import StorageError, needs

Done = Callable[[tuple[int, Any]], None]


class Job(Protocol):
    noun: str

    def doing(self, task: int) -> str: ...

    def run(self, task: int) -> tuple[int, Any]: ...


_job: Job | None = None  # the job of a worker process, sent once when it starts


def _start_worker(job: Job) -> None:
    global _job
    _job = job


def _worker_task(shard: int) -> tuple[int, Any]:
    assert _job is not None
    return _job.run(shard)


def run_processes(job: Job, todo: list[int], workers: int, done: Done) -> None:
    """Tasks in ``workers`` processes started with ``spawn`` (safe beside threads, the same on every OS)."""
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool

    ctx = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(min(workers, len(todo)), mp_context=ctx, initializer=_start_worker, initargs=(job,))
    try:
        pending = {pool.submit(_worker_task, s): s for s in todo}
        while pending:
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for f in finished:
                shard = pending.pop(f)
                try:
                    result = f.result()
                except BrokenProcessPool:
                    raise StorageError(
                        f"a {job.noun} process died (killed, or out of memory) while {job.doing(shard)}; "
                        f"what is finished is kept: run the same {job.noun} again to go on"
                    ) from None
                done(result)
    except BaseException:
        # an error or Ctrl-C: stop the other shards now rather than after they finish (they are
        # written again, whole, by the next run), then let the pool wind down
        for process in list((getattr(pool, "_processes", None) or {}).values()):
            process.terminate()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


def _task(job: Job, shard: int) -> tuple[int, Any]:
    return job.run(shard)


def run_ray(job: Job, todo: list[int], workers: int, address: str | None, done: Done) -> None:
    """Run the shards ``todo`` as Ray tasks, at most ``workers`` at once when above 1."""
    ray = needs("ray", "--engine ray", "ray")
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
                    result = ray.get(ref)
                except ray.exceptions.RayError as exc:
                    for other in pending:
                        ray.cancel(other)
                    cause = getattr(exc, "cause", None)  # a RayTaskError: the task's own error, raised as it was
                    if isinstance(exc, ray.exceptions.RayTaskError) and isinstance(cause, BaseException):
                        raise cause from None
                    raise StorageError(
                        f"the Ray task {job.doing(shard)} failed ({type(exc).__name__}); "
                        f"what is finished is kept: run the same {job.noun} again to go on"
                    ) from exc
                done(result)
    finally:
        if started:
            ray.shutdown()
