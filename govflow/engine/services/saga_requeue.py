"""Ended instances whose compensations a run must take up: found by the sweep.

A cancelled or failed instance is never queued for its steps, but its saga may still have
work: a compensation to run (automatic, or approved), or one a killed worker dispatched and
never answered (a run records it ``outcome_unknown``). Its task may have been lost with
that worker, so the sweep queues such an instance again, like any other whose lease was
orphaned (``sweep._requeue_candidates``). This finds only intents already recorded: it
never plans a compensation (``saga``).
"""

from __future__ import annotations

import datetime as dt

from django.db.models import CharField, Exists, OuterRef, Q, Value
from django.db.models.functions import Cast, Concat

from recovery.api import compensation_subjects_due, leases_held

from ..models import Instance, InstanceStatus
from ..projection import SUBJECT_TYPE

__all__ = ["saga_requeue_candidates"]


def saga_requeue_candidates(*, now, stale_after: dt.timedelta, limit: int) -> list[int]:
    """Ended instances with compensation work, no live lease, and a lost or stale task
    (reads; the caller's read transaction)."""
    subjects = compensation_subjects_due(subject_type=SUBJECT_TYPE, limit=limit)
    if not subjects:
        return []
    lease_key = Concat(Value("instance:"), Cast(OuterRef("pk"), CharField()))
    leases = leases_held().filter(key=lease_key)
    live = Exists(leases.filter(expires_at__gt=now))
    orphaned = Exists(leases.filter(expires_at__lte=now, expires_at__gt=OuterRef("enqueued_at")))
    query = (
        Instance.objects.filter(
            pk__in=[int(s) for s in subjects],
            status__in=[InstanceStatus.CANCELLED, InstanceStatus.FAILED],
        )
        .exclude(live)
        .filter(Q(enqueued_at__isnull=True) | Q(enqueued_at__lt=now - stale_after) | orphaned)
        .values_list("pk", flat=True)[:limit]
    )
    return list(query)
