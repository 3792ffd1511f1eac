"""Evidence files after they were stored: attached to an investigation, and read back.

Every read re-hashes the stored bytes (BLAKE3, kind ``evidence``) into a private copy and
compares them with the fingerprint recorded when the file was received. A file that is
missing or differs is never handed out: the read is refused and an integrity incident is
opened on the subject the evidence concerns, so nothing moves on it unseen.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from typing import IO

from django.db import transaction
from django.db.models.functions import Now

from ..canonical import FingerprintKind, fingerprint_hasher
from ..errors import EvidenceCorrupt, RecoveryValidationError
from ..evidence import CHUNK_BYTES, EvidenceBatch, storage_path
from ..models import EvidenceFile, evidence_storage
from ..subjects import Subject
from .incidents import incident_report

__all__ = [
    "EVIDENCE_READERS",
    "EvidenceRead",
    "evidence_attach",
    "evidence_open",
    "evidence_received",
]

# Whoever may see a decision's rationale, or resolves integrity incidents, may open
# evidence (a resolution request's files are read by the second person who approves it).
EVIDENCE_READERS = (
    "recovery.view_decision",
    "recovery.request_decision",
    "recovery.approve_decision",
    "recovery.resolve_incident",
)


def evidence_received(uploads: Iterable) -> EvidenceBatch:
    """Stream and check ``uploads`` before a transaction: ``with evidence_received(u) as b``."""
    return EvidenceBatch(uploads, storage=evidence_storage())


def evidence_attach(*, batch: EvidenceBatch, subject: Subject) -> list[EvidenceFile]:
    """Record the files of ``batch`` as evidence about ``subject`` (inside a transaction).

    For an investigation that is not a decision (an engine incident's resolution, say).
    The rows are written now; the files reach the store after the commit.
    """
    if not transaction.get_connection().in_atomic_block:
        raise RecoveryValidationError("evidence_attach runs inside the caller's transaction.")
    rows = [
        EvidenceFile.objects.create(
            attached_to=str(subject),
            file=storage_path(item.fingerprint),
            fingerprint=item.fingerprint,
            size=item.size,
            content_type=item.content_type,
            name=item.name,
            uploaded_at=Now(),
        )
        for item in batch.files
    ]
    batch.store_after_commit()
    return rows


@dataclass
class EvidenceRead:
    """A verified private copy of a stored evidence file, positioned at its start."""

    evidence: EvidenceFile
    file: IO[bytes]


def _subject_of(evidence: EvidenceFile) -> Subject:
    if evidence.decision_id is not None:
        op = evidence.decision.operation
        return Subject(op.subject_type, op.subject_id)
    return Subject.parse(evidence.attached_to)


def _verified_copy(evidence: EvidenceFile) -> tuple[IO[bytes] | None, str]:
    """A copy of the stored bytes and "", or None and what is wrong with them."""
    storage = evidence_storage()
    hasher = fingerprint_hasher(FingerprintKind.EVIDENCE)
    copy = tempfile.TemporaryFile()  # noqa: SIM115  (handed to the caller)
    size = 0
    try:
        with storage.open(evidence.file.name, "rb") as stored:
            while data := stored.read(CHUNK_BYTES):
                hasher.update(data)
                size += len(data)
                copy.write(data)
    except FileNotFoundError:
        copy.close()
        return None, "is missing from the evidence store"
    if hasher.hexdigest() != evidence.fingerprint or size != evidence.size:
        copy.close()
        return None, (
            f"no longer matches its fingerprint {evidence.fingerprint[:16]}… (it holds "
            f"{size} bytes, {evidence.size} were received): it was changed after it was stored"
        )
    copy.seek(0)
    return copy, ""


def evidence_open(*, evidence_id: int, user) -> EvidenceRead:
    """Open a stored evidence file for ``user``, re-hashed against its fingerprint.

    Raises :class:`~recovery.errors.RecoveryValidationError` for a user without one of
    :data:`EVIDENCE_READERS` or an unknown id, and :class:`EvidenceCorrupt` — after
    opening an integrity incident on the subject — when the stored bytes are missing or
    differ. Call it outside a transaction that may roll back (the incident must stay).
    """
    if not (user and user.is_authenticated and user.is_active) or not any(
        user.has_perm(p) for p in EVIDENCE_READERS
    ):
        raise RecoveryValidationError(
            f"{user} may not open evidence files: one of the permissions "
            f"{', '.join(repr(p) for p in EVIDENCE_READERS)} is required."
        )
    evidence = (
        EvidenceFile.objects.select_related("decision__operation").filter(pk=evidence_id).first()
    )
    if evidence is None:
        raise RecoveryValidationError(f"No evidence file has id {evidence_id}.")
    copy, problem = _verified_copy(evidence)
    if copy is not None:
        return EvidenceRead(evidence=evidence, file=copy)
    what = (
        f"evidence file {evidence.pk} ({evidence.name}) of decision {evidence.decision_id}"
        if evidence.decision_id
        else f"evidence file {evidence.pk} ({evidence.name})"
    )
    incident = incident_report(subject=_subject_of(evidence), reason=f"The {what} {problem}.")
    raise EvidenceCorrupt(
        f"The {what} {problem}. It is not served. Integrity incident #{incident.pk} is open: "
        "restore the file from a backup (its fingerprint must match), then resolve the "
        "incident.",
        incident_id=incident.pk,
    )
