"""Wiring to django-q2: the sweep's schedule, and a sweep at every worker start."""

from __future__ import annotations

import logging

log = logging.getLogger("govflow.engine")

SCHEDULE_NAME = "govflow-sweep"


def ensure_sweep_schedule(**kwargs) -> None:
    """Create the minute-by-minute sweep schedule (``catch_up`` off in Q_CLUSTER)."""
    from django_q.models import Schedule

    from .queue import SWEEP

    Schedule.objects.update_or_create(
        name=SCHEDULE_NAME,
        defaults={"func": SWEEP, "schedule_type": Schedule.MINUTES, "minutes": 1, "repeats": -1},
    )


def sweep_on_worker_start(sender=None, **kwargs) -> None:
    """Every worker start enqueues a sweep: rehydration runs right after a restart."""
    from django.db import DatabaseError

    from .queue import enqueue_sweep

    try:
        enqueue_sweep()
    except DatabaseError:
        log.exception("could not enqueue the start-up sweep")
