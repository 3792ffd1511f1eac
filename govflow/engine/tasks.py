"""django-q2 tasks: thin, ids only, idempotent (delivery is at least once)."""

from __future__ import annotations

from .queue import Claim
from .services.runtime import instance_run
from .services.sweep import sweep_loop


def advance(instance_id: int, fence: int | None = None, holder: str = "", wakeups: int = 0) -> dict:
    """Run one instance; with ``fence``, one the broker claimed (``broker.ClaimBroker``)."""
    claim = None if fence is None else Claim(int(instance_id), int(fence), holder, int(wakeups))
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
