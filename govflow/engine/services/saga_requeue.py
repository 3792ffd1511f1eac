"""Ended instances whose compensations a run must take up: found by the sweep.

A cancelled or failed instance is never queued for its steps, but its saga may still have
work: a compensation to run (automatic, or approved), or one a killed worker dispatched and
never answered (a run records it ``outcome_unknown``). A run's mark normally carries it
(ADR 0026); should an ended instance with such work have none, the sweep marks it again,
like any other instance with work due (``sweep._requeue_candidates``). This finds only
intents already recorded: it never plans a compensation (``saga``).
"""

from __future__ import annotations

from django.db.models import CharField, Exists, OuterRef, Value
from django.db.models.functions import Cast, Concat

from recovery.api import compensation_subjects_due, leases_held

from ..models import Instance, InstanceStatus
from ..projection import SUBJECT_TYPE

__all__ = ["saga_requeue_candidates"]


def saga_requeue_candidates(*, now, limit: int) -> list[int]:
    """Ended instances with compensation work, no live lease and no runnable mark
    (reads; the caller's read transaction): the sweep marks them (ADR 0026)."""
    subjects = compensation_subjects_due(subject_type=SUBJECT_TYPE, now=now, limit=limit)
    if not subjects:
        return []
    lease_key = Concat(Value("instance:"), Cast(OuterRef("pk"), CharField()))
    live = Exists(leases_held().filter(key=lease_key, expires_at__gt=now))
    query = (
        Instance.objects.filter(
            pk__in=[int(s) for s in subjects],
            status__in=[InstanceStatus.CANCELLED, InstanceStatus.FAILED],
            runnable_at__isnull=True,
        )
        .exclude(live)
        .values_list("pk", flat=True)[:limit]
    )
    return list(query)
