"""django-q2 tasks: thin, ids only, idempotent (delivery is at least once)."""

from __future__ import annotations

from .queue import Claim
from .runpool import run_pool
from .services.runtime import instance_run
from .services.sweep import sweep_loop


def advance(instance_id: int, fence: int | None = None, holder: str = "", wakeups: int = 0) -> dict:
    """Run one instance; with ``fence``, one the broker claimed (``broker.ClaimBroker``).

    In a ``qcluster`` worker with ``GOVFLOW_WORKER_RUNS`` > 1, a claimed run is handed to
    a free run thread of the process, and this returns once a thread is free for the
    worker's next task (``runpool.py``, ADR 0041): the run's outcome is the instance's.
    """
    claim = None if fence is None else Claim(int(instance_id), int(fence), holder, int(wakeups))
    pool = run_pool() if claim is not None else None
    if pool is not None:
        pool.submit(claim)
        pool.wait_free()
        return {"instance": claim.instance_id, "handed": "to a run thread"}
    report = instance_run(instance_id=int(instance_id), claim=claim)
    return {
        "instance": report.instance_id,
        "steps": report.steps,
        "status": report.status,
        "skipped": report.skipped,
        "stale": report.stale,
    }


def sweep() -> dict:
    return sweep_loop()
