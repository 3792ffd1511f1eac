"""Resolving an integrity incident: four eyes, on a chain that verifies.

1. ``incident_resolve_request`` (in :mod:`.resolution_requests`) — someone with
   ``recovery.resolve_incident`` says what was repaired and how, with optional evidence.
   The subject's chain must verify already; nothing is resolved.
2. :func:`incident_resolve_approve` — a *different* person with the same permission
   approves. The chain is verified again inside the approving transaction: only a clean
   chain resolves the incident; a broken one leaves it open with the newest position and
   reason, and the request keeps waiting. Or :func:`incident_resolve_reject` (another
   person, with a note) or :func:`incident_resolve_withdraw` (the requester) closes the
   request and the incident stays open.

Every step appends a fact to the incident's own trail (``recovery.services.facts``), never
to the chain the incident is about. Every change is a conditional ``UPDATE`` whose row
count is checked; the loser of a race gets :class:`IncidentConflict` and nothing changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models.functions import Now

from ..canonical import FingerprintKind, fingerprint_value
from ..chain import Verification
from ..errors import ConflictError, RecoveryValidationError
from ..models import IncidentResolution, IntegrityIncident
from ..states import IncidentStatus, ResolutionState
from ..subjects import Subject, subject_types
from .facts import incident_fact_append
from .incidents import MAX_TEXT, incident_reverify, plain_text, subject_check

__all__ = [
    "MAX_TEXT",
    "RESOLVE_PERMISSION",
    "IncidentConflict",
    "IncidentError",
    "ResolutionOutcome",
    "incident_resolve_approve",
    "incident_resolve_approve_via_owner",
    "incident_resolve_reject",
    "incident_resolve_withdraw",
]

RESOLVE_PERMISSION = "recovery.resolve_incident"
OPEN, RESOLVED = IncidentStatus.OPEN, IncidentStatus.RESOLVED
REQUESTED = ResolutionState.REQUESTED


# These belong in recovery/errors.py with the other typed errors; they live here until
# that module is free to change.
class IncidentError(RecoveryValidationError):
    """A resolution request, approval, rejection or withdrawal is incomplete or not allowed."""


class IncidentConflict(ConflictError):
    """The incident or its resolution request changed meanwhile; nothing was changed."""


@dataclass(frozen=True)
class ResolutionOutcome:
    """What an approval did: ``resolved``, or why the incident stays open (``message``)."""

    incident: IntegrityIncident
    resolution: IncidentResolution
    verification: Verification
    resolved: bool
    message: str


def _require_perm(user, doing: str) -> None:
    if not (user and user.is_authenticated and user.is_active):
        raise IncidentError(f"Only an active, signed-in person may {doing}.")
    if not user.has_perm(RESOLVE_PERMISSION):
        raise IncidentError(
            f"{user} may not {doing}: the permission {RESOLVE_PERMISSION!r} is required."
        )


def _text(value: Any, what: str, missing: str) -> str:
    return plain_text(value, what, missing, IncidentError)


def _fp(text: str) -> str:
    return fingerprint_value(FingerprintKind.INPUT, text)


def _require_open(incident: IntegrityIncident | None, incident_id: int) -> IntegrityIncident:
    if incident is None:
        raise IncidentError(f"No integrity incident has id {incident_id}.")
    if incident.status != OPEN:
        by = f" by {incident.resolved_by}" if incident.resolved_by_id else ""
        at = f" at {incident.resolved_at:%Y-%m-%d %H:%M} UTC" if incident.resolved_at else ""
        raise IncidentConflict(
            f"Incident {incident_id} is already resolved{by}{at}. Nothing was changed."
        )
    return incident


def _locked_open_incident(incident_id: int) -> IntegrityIncident:
    """The open incident, row-locked until commit (internal: inside a transaction)."""
    incident = IntegrityIncident.objects.select_for_update().filter(pk=incident_id).first()
    return _require_open(incident, incident_id)


def _pending(incident: IntegrityIncident) -> IncidentResolution:
    resolution = (
        IncidentResolution.objects.select_related("requested_by")
        .filter(incident=incident, state=REQUESTED)
        .first()
    )
    if resolution is None:
        raise IncidentConflict(
            f"No resolution of incident {incident.pk} awaits approval (it may have been "
            "rejected or withdrawn meanwhile). Nothing was changed."
        )
    return resolution


def _recheck(
    incident: IntegrityIncident, watermark: int | None, *, refresh: bool
) -> tuple[Verification, str]:
    """Verify the incident's subject again; return the verification and what is wrong, or "".

    With ``refresh``, a chain that still fails gives the incident its newest position and
    reason (:func:`incident_reverify`); without, nothing is written.
    """
    if refresh:
        result = incident_reverify(incident=incident, watermark=watermark)
    else:  # the same check, against the anchors too, without writing
        result = subject_check(
            Subject(incident.subject_type, incident.subject_id), watermark=watermark
        )
    subject = result.subject
    if not result.ok:
        at = f" at checkpoint #{result.position}" if result.position is not None else ""
        return result, f"the chain of {subject} is still broken{at}: {result.reason}"
    if result.length == 0 and watermark is None:
        return result, (
            f"the chain of {subject} is empty. An empty chain verifies trivially, so it "
            "proves nothing (every checkpoint may have been removed): the request must give "
            "the revision last seen as its watermark (0 if the subject never had a "
            "checkpoint)"
        )
    return result, ""


def _close(
    resolution: IncidentResolution,
    state: str,
    kind: str,
    fact: dict[str, Any],
    *,
    only_if: dict[str, Any] | None = None,
    **values: Any,
) -> None:
    """Move a request out of ``requested`` and record ``kind`` on the incident's trail
    (internal: inside a transaction). A conditional update, on ``only_if`` too: someone
    else's move first is a conflict and nothing is written."""
    changed = IncidentResolution.objects.filter(
        pk=resolution.pk, state=REQUESTED, **(only_if or {})
    ).update(state=state, decided_at=Now(), **values)
    if changed != 1:
        raise IncidentConflict(
            f"Resolution request {resolution.pk} no longer awaits approval (someone else "
            "approved, rejected or withdrew it). Nothing was changed."
        )
    _record(resolution, kind, fact)


def _record(resolution: IncidentResolution, kind: str, fact: dict[str, Any]) -> None:
    """Append ``kind`` to the incident's trail (internal: inside a transaction)."""
    incident_fact_append(
        incident_id=resolution.incident_id,
        kind=kind,
        fact={"incident": resolution.incident_id, "resolution": resolution.pk, **fact},
    )


def incident_resolve_approve(*, incident_id: int, approved_by) -> ResolutionOutcome:
    """Approve another person's resolution request: resolve only if the chain verifies now.

    Returns a :class:`ResolutionOutcome`. When the chain is still broken (or empty without
    a watermark), the incident stays open with the newest position and reason, the request
    keeps waiting, the attempt is recorded on the incident's trail and ``message`` says
    why. Raises :class:`IncidentError` for the requester themselves and
    :class:`IncidentConflict` when someone else approved, rejected or withdrew first.
    """
    _require_perm(approved_by, "approve the resolution of an integrity incident")
    with transaction.atomic():
        incident = _locked_open_incident(incident_id)
        resolution = _pending(incident)
        if resolution.requested_by_id == approved_by.pk:
            raise IncidentError(
                "The person who requested a resolution cannot approve it: a second person "
                "must check what was repaired."
            )
        verification, problem = _recheck(incident, resolution.watermark, refresh=True)
        if problem:
            return _kept_open(incident, resolution, verification, problem, approved_by)
        closed = IntegrityIncident.objects.filter(pk=incident.pk, status=OPEN).update(
            status=RESOLVED, resolved_at=Now(), resolved_by=approved_by
        )
        if closed != 1:
            raise IncidentConflict(
                f"Incident {incident.pk} was resolved by someone else meanwhile. Nothing was "
                "changed."
            )
        _close(
            resolution,
            ResolutionState.APPROVED,
            "incident.resolved",
            {
                "subject_type": incident.subject_type,
                "subject_id": incident.subject_id,
                "requested_by": resolution.requested_by_id,
                "approved_by": approved_by.pk,
                "revision": verification.length,
            },
            decided_by=approved_by,
        )
    incident.refresh_from_db()
    resolution.refresh_from_db()
    return ResolutionOutcome(
        incident=incident,
        resolution=resolution,
        verification=verification,
        resolved=True,
        message=(
            f"Incident {incident.pk} is resolved: the chain of {verification.subject} "
            f"verifies again ({verification.length} checkpoint"
            f"{'' if verification.length == 1 else 's'})."
        ),
    )


def _kept_open(
    incident: IntegrityIncident,
    resolution: IncidentResolution,
    verification: Verification,
    problem: str,
    approved_by,
) -> ResolutionOutcome:
    """Record an approval that found the chain still broken; say why nothing changed."""
    _record(
        resolution,
        "incident.reverify_failed",
        {
            "by": approved_by.pk,
            "ok": verification.ok,
            "position": verification.position,
            "reason_fp": _fp(verification.reason),
            "revision": verification.length,
        },
    )
    return ResolutionOutcome(
        incident=incident,
        resolution=resolution,
        verification=verification,
        resolved=False,
        message=(
            f"Incident {incident.pk} stays open: {problem}. Nothing was resolved; "
            f"resolution request {resolution.pk} still awaits approval. Once the "
            "cause is repaired, approve it again, or reject it with a note."
        ),
    )


def incident_resolve_approve_via_owner(*, incident_id: int, actor) -> ResolutionOutcome:
    """Approve through the approver the subject's type registered, if any.

    The door for user interfaces (the admin, ``recovery_verify --approve``): the owner of
    the subject type (the engine, for workflow instances) acts in the same commit.
    """
    incident = IntegrityIncident.objects.filter(pk=incident_id).first()
    kind = subject_types.get(incident.subject_type) if incident is not None else None
    if kind is not None and kind.resolve_approve is not None:
        return kind.resolve_approve(incident_id=incident_id, actor=actor)
    return incident_resolve_approve(incident_id=incident_id, approved_by=actor)


def incident_resolve_reject(*, incident_id: int, rejected_by, note: str) -> IncidentResolution:
    """Reject another person's resolution request, saying why; the incident stays open."""
    _require_perm(rejected_by, "reject the resolution of an integrity incident")
    note = _text(note, "note", "Say why the request is rejected, so the requester can act on it.")
    with transaction.atomic():
        incident = _locked_open_incident(incident_id)
        resolution = _pending(incident)
        if resolution.requested_by_id == rejected_by.pk:
            raise IncidentError(
                "The requester cannot reject their own request; withdraw it instead."
            )
        _close(
            resolution,
            ResolutionState.REJECTED,
            "incident.resolution_rejected",
            {"rejected_by": rejected_by.pk, "note_fp": _fp(note)},
            decided_by=rejected_by,
            decision_note=note,
        )
    resolution.refresh_from_db()
    return resolution


def incident_resolve_withdraw(*, incident_id: int, withdrawn_by) -> IncidentResolution:
    """The requester withdraws their own resolution request; the incident stays open."""
    _require_perm(withdrawn_by, "withdraw a resolution request")
    with transaction.atomic():
        incident = _locked_open_incident(incident_id)
        resolution = _pending(incident)
        if resolution.requested_by_id != withdrawn_by.pk:
            raise IncidentError(
                f"Only its requester ({resolution.requested_by}) can withdraw resolution "
                f"request {resolution.pk}; reject it with a note instead."
            )
        _close(
            resolution,
            ResolutionState.WITHDRAWN,
            "incident.resolution_withdrawn",
            {"withdrawn_by": withdrawn_by.pk},
            only_if={"requested_by": withdrawn_by},
        )
    resolution.refresh_from_db()
    return resolution
