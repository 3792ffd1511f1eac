"""Integrity incidents: opened by a failed verification or a detected inconsistency.

An open incident refuses every success for its subject. It is resolved only by four eyes
on a chain that verifies: :mod:`recovery.services.resolutions`.
"""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction
from django.db.models.functions import Now

from ..chain import Verification, chain_verify
from ..errors import RecoveryValidationError
from ..models import IntegrityIncident
from ..states import IncidentStatus
from ..subjects import Subject

__all__ = [
    "incident_open",
    "incident_report",
    "incident_reverify",
    "plain_text",
    "subject_verify",
]

MAX_TEXT = 10_000
OPEN = IncidentStatus.OPEN


def plain_text(
    value: Any, what: str, missing: str, error: type[Exception] = RecoveryValidationError
) -> str:
    """``value`` stripped, or ``error``: empty, too long, or not storable as text."""
    text = value.strip() if isinstance(value, str) else ""
    if not text:
        raise error(missing)
    if len(text) > MAX_TEXT:
        raise error(f"The {what} is {len(text)} characters long; keep it under {MAX_TEXT}.")
    if "\x00" in text:
        raise error(f"The {what} contains a NUL character (U+0000); remove it.")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise error(f"The {what} contains a character that is not valid text.") from exc
    return text


def _open(subject: Subject, position: int | None, reason: str) -> IntegrityIncident:
    try:
        with transaction.atomic():
            return IntegrityIncident.objects.create(
                subject_type=subject.type,
                subject_id=subject.id,
                position=position,
                reason=reason,
                detected_at=Now(),
            )
    except IntegrityError:
        # One open incident per subject (a partial unique constraint): keep the first.
        return IntegrityIncident.objects.get(
            subject_type=subject.type, subject_id=subject.id, status=OPEN
        )


def incident_open(*, verification: Verification) -> IntegrityIncident:
    """Open an incident for a failed verification, or return the one already open."""
    if verification.ok:
        raise RecoveryValidationError("A verification that passed opens no incident.")
    return _open(verification.subject, verification.position, verification.reason)


def incident_report(
    *, subject: Subject, reason: str, position: int | None = None
) -> IntegrityIncident:
    """Open an incident for a contradiction found outside the chain, or return the open one.

    For a caller that compared its own records with what they were pinned to (a stored
    document that no longer hashes to its fingerprint, a token that contradicts its ledger
    operation) and found them changed. ``reason`` says what was found, in words an
    operator can act on; ``position`` is the checkpoint it concerns, if any. Like
    :func:`incident_open`, at most one is open per subject: while one is open, this
    returns it unchanged. Call it outside any transaction that will roll back, or the
    incident rolls back with it. It is resolved like any other incident (four eyes, on a
    chain that verifies: :mod:`recovery.services.resolutions`); the caller that found the
    contradiction opens it again if it is still there.
    """
    if not isinstance(subject, Subject):
        raise RecoveryValidationError(f"subject must be a Subject, not {subject!r}.")
    reason = plain_text(reason, "reason", "An incident needs a reason: say what was found.")
    if position is not None and (not isinstance(position, int) or position < 1):
        raise RecoveryValidationError("position must be a checkpoint number (1 or more).")
    return _open(subject, position, reason)


def subject_verify(
    *, subject: Subject, watermark: int | None = None
) -> tuple[Verification, IntegrityIncident | None]:
    """Verify ``subject``'s chain; a broken chain opens (or keeps) an integrity incident."""
    result = chain_verify(subject, watermark=watermark)
    if result.ok:
        return result, None
    return result, incident_open(verification=result)


def incident_reverify(*, incident: IntegrityIncident, watermark: int | None = None) -> Verification:
    """Verify the incident's subject again; a chain that still fails refreshes the incident.

    The open incident takes the newest position and reason. This never resolves an
    incident: only :func:`incident_resolve_approve` does.
    """
    subject = Subject(incident.subject_type, incident.subject_id)
    result = chain_verify(subject, watermark=watermark)
    if not result.ok:
        IntegrityIncident.objects.filter(pk=incident.pk, status=OPEN).update(
            position=result.position, reason=result.reason
        )
    incident.refresh_from_db()
    return result
