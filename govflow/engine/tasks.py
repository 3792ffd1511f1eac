"""django-q2 tasks: thin, ids only, idempotent (delivery is at least once)."""

from __future__ import annotations

import logging
import traceback
from collections.abc import Sequence

from django.utils import timezone

from .queue import Claim
from .runpool import failure_record, run_pool
from .services.runtime import instance_run
from .services.sweep import sweep_loop

log = logging.getLogger("govflow.engine")


def advance(
    instance_id: int,
    fence: int | None = None,
    holder: str = "",
    wakeups: int = 0,
    more: Sequence[Sequence] = (),
) -> dict:
    """Run one instance; with ``fence``, one the broker claimed (``broker.ClaimBroker``),
    and with ``more``, further claimed runs carried by the same task, each as
    ``(instance_id, fence, holder, wakeups)`` (ADR 0069).

    In a ``qcluster`` worker with ``GOVFLOW_WORKER_RUNS`` > 1, each claimed run is handed to
    a free run thread of the process (waiting for one to be free), and this returns once a
    thread is free for the worker's next task (``runpool.py``, ADR 0041): the runs'
    outcomes are the instances'.
    """
    if fence is None:
        return _report(instance_run(instance_id=int(instance_id)))
    claims = [Claim(int(instance_id), int(fence), holder, int(wakeups))]
    claims += [Claim(int(i), int(f), str(h), int(w)) for i, f, h, w in more]
    pool = run_pool()
    if pool is not None:
        for claim in claims:
            pool.submit(claim)
        pool.wait_free()
        return {"instances": [c.instance_id for c in claims], "handed": "to run threads"}
    if len(claims) == 1:
        return _report(instance_run(instance_id=claims[0].instance_id, claim=claims[0]))
    return {"runs": [_one_of_several(claim) for claim in claims]}


def _report(report) -> dict:
    return {
        "instance": report.instance_id,
        "steps": report.steps,
        "status": report.status,
        "skipped": report.skipped,
        "stale": report.stale,
    }


def _one_of_several(claim: Claim) -> dict:
    """One of a task's claimed runs, one after the other (no run threads here): a run that
    fails is logged and stored as a failed task of its own, as a run thread stores it, and
    the task's other runs still run."""
    started = timezone.now()
    try:
        return _report(instance_run(instance_id=claim.instance_id, claim=claim))
    except Exception:
        log.exception("instance %s: its run failed", claim.instance_id)
        failure_record(claim, started=started, result=traceback.format_exc())
        return {"instance": claim.instance_id, "failed": True}


def sweep() -> dict:
    return sweep_loop()
