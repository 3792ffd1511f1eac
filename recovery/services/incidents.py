"""Integrity incidents: opened by a failed verification, resolved only by a clean one."""

from __future__ import annotations

from django.db import IntegrityError, transaction
from django.db.models.functions import Now

from ..chain import Verification, chain_verify
from ..errors import RecoveryValidationError
from ..models import IntegrityIncident
from ..subjects import Subject

__all__ = ["incident_open", "incident_report", "incident_reverify", "subject_verify"]


def incident_open(*, verification: Verification) -> IntegrityIncident:
    """Open an incident for a failed verification, or return the one already open."""
    if verification.ok:
        raise RecoveryValidationError("A verification that passed opens no incident.")
    subject = verification.subject
    try:
        with transaction.atomic():
            return IntegrityIncident.objects.create(
                subject_type=subject.type,
                subject_id=subject.id,
                position=verification.position,
                reason=verification.reason,
                detected_at=Now(),
            )
    except IntegrityError:
        # One open incident per subject (a partial unique constraint): keep the first.
        return IntegrityIncident.objects.get(
            subject_type=subject.type, subject_id=subject.id, status="open"
        )


def incident_report(*, subject: Subject, reason: str) -> IntegrityIncident:
    """Open an incident for a contradiction found outside the chain, or return the open one.

    For a caller that compared its own records with what they were pinned to (a stored
    document that no longer hashes to its fingerprint, say) and found them changed. The
    incident has no chain position. Like :func:`incident_open`, at most one is open per
    subject: while one is open, this returns it unchanged. Resolving it is the same
    re-verification; the caller that found the contradiction opens it again if it is
    still there.
    """
    reason = (reason or "").strip()
    if not reason:
        raise RecoveryValidationError("Say what was found: an incident needs a reason.")
    return incident_open(
        verification=Verification(subject, ok=False, length=0, position=None, reason=reason)
    )


def subject_verify(
    *, subject: Subject, watermark: int | None = None
) -> tuple[Verification, IntegrityIncident | None]:
    """Verify ``subject``'s chain; a broken chain opens (or keeps) an integrity incident."""
    result = chain_verify(subject, watermark=watermark)
    if result.ok:
        return result, None
    return result, incident_open(verification=result)


def incident_reverify(*, incident: IntegrityIncident, actor, watermark: int | None = None):
    """Re-verify the incident's subject; resolve the incident only if the chain verifies.

    Returns the :class:`Verification`. A chain that still fails leaves the incident open
    with the latest position and reason.
    """
    subject = Subject(incident.subject_type, incident.subject_id)
    result = chain_verify(subject, watermark=watermark)
    with transaction.atomic():
        if result.ok:
            IntegrityIncident.objects.filter(pk=incident.pk, status="open").update(
                status="resolved", resolved_at=Now(), resolved_by=actor
            )
        else:
            IntegrityIncident.objects.filter(pk=incident.pk, status="open").update(
                position=result.position, reason=result.reason
            )
    incident.refresh_from_db()
    return result
