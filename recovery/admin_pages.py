"""What the recovery admin's pages show: reads only, kept apart from the admin classes."""

from __future__ import annotations

from django.urls import reverse

from .errors import RecoveryError
from .forms import ResolutionRejectForm, ResolutionRequestForm
from .models import Checkpoint, EvidenceFile, IntegrityIncident
from .services.facts import incident_trail
from .services.incidents import subject_check
from .services.resolutions import RESOLVE_PERMISSION
from .states import IncidentStatus, ResolutionState
from .subjects import Subject, subject_types

__all__ = ["evidence_url", "incident_context"]


def incident_context(request, incident: IntegrityIncident, bound: dict) -> dict:
    """What the incident's page shows: reads only."""
    user = request.user
    subject = Subject(incident.subject_type, incident.subject_id)
    kind = subject_types.get(subject.type)
    resolutions = list(
        incident.resolutions.select_related("requested_by", "decided_by").order_by(
            "requested_at", "pk"
        )
    )
    pending = next((r for r in resolutions if r.state == ResolutionState.REQUESTED), None)
    is_open = incident.status == IncidentStatus.OPEN
    may_resolve = is_open and user.has_perm(RESOLVE_PERMISSION)
    try:  # against the anchors too, as a resolution request will be
        verification, verify_error = (subject_check(subject) if is_open else None), ""
    except RecoveryError as exc:  # e.g. chain keys missing, anchor store unreadable
        verification, verify_error = None, str(exc)
    trail = incident_trail(incident.pk)
    return {
        "incident": incident,
        "subject": subject,
        "subject_label": kind.label if kind else subject.type,
        "subject_url": subject_types.url_of(subject),
        "verification": verification if is_open else None,
        "verify_error": verify_error if is_open else "",
        "resolutions": resolutions,
        "pending": pending,
        "pending_evidence": [
            (f, evidence_url(f))
            for f in EvidenceFile.objects.filter(
                pk__in=pending.evidence if pending else []
            ).order_by("pk")
        ],
        "request_form": (bound.get("request") or ResolutionRequestForm())
        if may_resolve and pending is None
        else None,
        "may_decide": may_resolve and pending is not None and pending.requested_by_id != user.pk,
        "may_withdraw": may_resolve and pending is not None and pending.requested_by_id == user.pk,
        "reject_form": bound.get("reject") or ResolutionRejectForm(),
        "trail": trail,
        "trail_facts": list(
            Checkpoint.objects.filter(subject_type=trail.type, subject_id=trail.id)
            .order_by("seq")
            .values("seq", "kind", "recorded_at")
        ),
        "resolve_permission": RESOLVE_PERMISSION,
    }


def evidence_url(evidence: EvidenceFile) -> str:
    """Where a permitted person opens an evidence file: the checked view, never a media URL."""
    return reverse("admin:recovery_decision_evidence", args=[evidence.pk])
