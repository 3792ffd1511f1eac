"""Integrity incidents: opened by a failed verification or a detected inconsistency.

An open incident refuses every success for its subject. It is resolved only by four eyes
on a chain that verifies: :mod:`recovery.services.resolutions`.

Verification compares with the anchors outside the database by default (``anchors=True``
reads the configured store; pass an :class:`~recovery.anchors.AnchorIndex` read once for
many subjects, or ``False`` to leave them out): a chain shorter than its anchored head, or
rewritten since, fails like a broken one. The subjects ``recovery.ledger:watermark`` and
``recovery.anchors:store`` are verified against the anchors (``recovery.watermarks``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models.functions import Now

from ..anchors import AnchorIndex, anchor_index_read, anchor_store
from ..chain import Verification, chain_verify
from ..errors import RecoveryValidationError
from ..models import IntegrityIncident
from ..states import IncidentStatus
from ..subjects import Subject
from ..watermarks import ANCHOR_STORE, LEDGER, ledger_verify, store_verify, subject_compare

__all__ = [
    "AnchorsReport",
    "anchors_load",
    "anchors_verify",
    "incident_listen",
    "incident_open",
    "incident_report",
    "incident_reverify",
    "plain_text",
    "subject_check",
    "subject_verify",
]

Anchors = AnchorIndex | bool

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


_LISTENERS: list[Callable[[IntegrityIncident], None]] = []


def incident_listen(listener: Callable[[IntegrityIncident], None]) -> None:
    """Call ``listener`` with every incident opened from now on, inside the commit that
    opens it (so what it writes commits or rolls back with the incident). Register it
    once, from an ``AppConfig.ready()``; it must ignore subjects that are not its own.
    The core stays ignorant of who listens (an owner's event outbox, say)."""
    if listener not in _LISTENERS:
        _LISTENERS.append(listener)


def _open(subject: Subject, position: int | None, reason: str) -> IntegrityIncident:
    with transaction.atomic():
        try:
            with transaction.atomic():
                incident = IntegrityIncident.objects.create(
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
        for listener in _LISTENERS:
            listener(incident)
        return incident


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


def anchors_load() -> AnchorIndex | None:
    """Read and verify the configured anchor store; ``None`` when anchors are turned off.

    Raises :class:`~recovery.errors.AnchorStoreError` when the store cannot be read: a
    verification that was asked to compare with the anchors does not go on without them.
    """
    store = anchor_store()
    return None if store is None else anchor_index_read(store)


@dataclass(frozen=True)
class AnchorsReport:
    """The anchors as read (``None``: turned off), and each failed check with its incident."""

    index: AnchorIndex | None
    failures: tuple[tuple[Verification, IntegrityIncident], ...] = ()


def anchors_verify() -> AnchorsReport:
    """Verify the anchor store itself and the ledger's watermark; open an incident for each
    failure (on ``recovery.anchors:store`` and ``recovery.ledger:watermark``).

    Per-subject comparisons are :func:`subject_verify`'s, given the returned ``index``.
    """
    index = anchors_load()
    if index is None:
        return AnchorsReport(None)
    failures = []
    for result in (store_verify(index), ledger_verify(index.latest)):
        if not result.ok:
            failures.append((result, incident_open(verification=result)))
    return AnchorsReport(index, tuple(failures))


def subject_check(
    subject: Subject, *, watermark: int | None = None, anchors: Anchors = True
) -> Verification:
    """Verify ``subject``'s chain and compare it with its anchors; a read, opens nothing.

    ``recovery.ledger:watermark`` and ``recovery.anchors:store`` are checked against the
    anchors instead (they have no chain).
    """
    index = anchors if isinstance(anchors, AnchorIndex) else anchors_load() if anchors else None
    # The anchors are read before the chain: newer anchors can only make it stricter.
    if subject in (LEDGER, ANCHOR_STORE):
        if anchors is False:
            raise RecoveryValidationError(
                f"{subject} is verified against the anchors; it cannot be verified without."
            )
        if index is None:  # anchors turned off: nothing contradicts the database
            return Verification(subject, True, 0)
        return ledger_verify(index.latest) if subject == LEDGER else store_verify(index)
    result = chain_verify(subject, watermark=watermark)
    return result if index is None else subject_compare(result, index)


def subject_verify(
    *, subject: Subject, watermark: int | None = None, anchors: Anchors = True
) -> tuple[Verification, IntegrityIncident | None]:
    """Verify ``subject``'s chain and its anchors; a failure opens (or keeps) an incident."""
    result = subject_check(subject, watermark=watermark, anchors=anchors)
    if result.ok:
        return result, None
    return result, incident_open(verification=result)


def incident_reverify(
    *, incident: IntegrityIncident, watermark: int | None = None, anchors: Anchors = True
) -> Verification:
    """Verify the incident's subject again; a subject that still fails refreshes the incident.

    The open incident takes the newest position and reason. The anchors are compared as by
    :func:`subject_verify`, so a truncated chain does not pass by verifying on its own.
    This never resolves an incident: only :func:`incident_resolve_approve` does.
    """
    subject = Subject(incident.subject_type, incident.subject_id)
    result = subject_check(subject, watermark=watermark, anchors=anchors)
    if not result.ok:
        IntegrityIncident.objects.filter(pk=incident.pk, status=OPEN).update(
            position=result.position, reason=result.reason
        )
    incident.refresh_from_db()
    return result
