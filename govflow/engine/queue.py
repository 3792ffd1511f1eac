"""Enqueueing work for django-q2 workers. Tasks carry ids only.

With the ORM broker on the default database, an enqueue inside a transaction commits or
rolls back with it: work is never queued for a change that did not happen.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db.models.functions import Now

ADVANCE = "govflow.engine.tasks.advance"
SWEEP = "govflow.engine.tasks.sweep"


def enqueue_advance(instance_id: int) -> None:
    enqueue_many([instance_id])


def enqueue_many(instance_ids: Iterable[int]) -> int:
    from django_q.tasks import async_task

    from .models import Instance

    ids = list(dict.fromkeys(instance_ids))
    for instance_id in ids:
        async_task(ADVANCE, instance_id, group="govflow-advance")
    if ids:
        Instance.objects.filter(pk__in=ids).update(enqueued_at=Now())
    return len(ids)


def enqueue_sweep() -> None:
    from django_q.tasks import async_task

    async_task(SWEEP, group="govflow-sweep")
