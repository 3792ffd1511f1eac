"""Integrity incidents on workflow instances: resolving one lets the instance continue.

While an integrity incident is open on an instance's subject, the ledger refuses its new
effects and its successes. The recovery core resolves the incident (four eyes, and only
on a chain that verifies); this module adds what the engine must do in the same commit:
close the instance's own ``integrity`` incidents and queue the instance, so a worker picks
it up where it stopped.
"""

from __future__ import annotations

import dataclasses

from django.db import transaction
from django.db.models.functions import Now

from govflow.engine.emit import incident_resolved, integrity_incident_resolved
from govflow.engine.models import Incident, Instance
from govflow.engine.projection import SUBJECT_TYPE
from govflow.engine.queue import instance_mark_runnable
from govflow.engine.selectors import TERMINAL_STATUSES
from recovery.api import ResolutionOutcome, Subject, incident_resolve_approve

__all__ = ["instance_of_subject", "integrity_incident_resolve_approve"]


def instance_of_subject(subject: Subject) -> int | None:
    """The instance id a recovery subject stands for, or None for any other subject."""
    if subject.type != SUBJECT_TYPE or not subject.id.isdecimal():
        return None
    return int(subject.id)


def integrity_incident_resolve_approve(*, incident_id: int, actor) -> ResolutionOutcome:
    """Approve the resolution of an integrity incident; an instance's goes on running.

    ``actor`` must hold ``recovery.resolve_incident`` and must not be the requester (the
    recovery core checks both). When the approval resolves the incident and its subject is
    an instance that has not ended, the instance's open ``integrity`` incidents are closed
    and an advance task is queued, in the approval's own commit. When the chain still does
    not verify nothing changes here, and the outcome says why.
    """
    with transaction.atomic():
        outcome = incident_resolve_approve(incident_id=incident_id, approved_by=actor)
        incident = outcome.incident
        instance_id = instance_of_subject(Subject(incident.subject_type, incident.subject_id))
        if not outcome.resolved or instance_id is None:
            return outcome
        instance = Instance.objects.filter(pk=instance_id).first()
        if instance is None:
            return outcome
        # Announced in the resolution's commit, whether or not the instance goes on.
        integrity_incident_resolved(instance, incident=incident.pk)
        if instance.status in TERMINAL_STATUSES:
            return outcome
        closed = list(
            Incident.objects.filter(
                instance_id=instance_id, kind="integrity", resolved_at__isnull=True
            ).values_list("pk", flat=True)
        )
        for pk in closed:
            incident_resolved(instance, incident=pk, kind="integrity")
        Incident.objects.filter(pk__in=closed, resolved_at__isnull=True).update(
            resolved_at=Now(),
            resolved_by=actor,
            resolution=f"Closed with integrity incident #{incident.pk}, whose resolution "
            f"{actor} approved after its chain verified again.",
        )
        instance_mark_runnable(instance_id)
    return dataclasses.replace(
        outcome, message=f"{outcome.message} Instance {instance_id} is queued to continue."
    )
