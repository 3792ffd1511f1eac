"""django-q2 tasks: thin, ids only, idempotent (delivery is at least once)."""

from __future__ import annotations

from .services.runtime import instance_run
from .services.sweep import sweep_loop


def advance(instance_id: int) -> dict:
    report = instance_run(instance_id=int(instance_id))
    return {
        "instance": report.instance_id,
        "steps": report.steps,
        "status": report.status,
        "skipped": report.skipped,
        "stale": report.stale,
    }


def sweep() -> dict:
    return sweep_loop()
