"""Wiring to django-q2: the schedule of the fallback sweep task."""

from __future__ import annotations

SCHEDULE_NAME = "govflow-sweep"


def ensure_sweep_schedule(**kwargs) -> None:
    """Create the minute-by-minute sweep schedule (``catch_up`` off in Q_CLUSTER).

    Every ``qcluster`` started through GovFlow's command sweeps in its main process; the
    scheduled task finds that sweeper alive and returns at once. It sweeps only for a
    cluster started some other way (ADR 0005).
    """
    from django_q.models import Schedule

    from .queue import SWEEP

    Schedule.objects.update_or_create(
        name=SCHEDULE_NAME,
        defaults={"func": SWEEP, "schedule_type": Schedule.MINUTES, "minutes": 1, "repeats": -1},
    )
