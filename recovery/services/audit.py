"""Whole-chain verification besides a run's first success (ADR 0038).

A run verifies its subject's whole chain at its first success and then only the tail after
its mark (ADR 0034), so a checkpoint older than the mark changed *during* the run is found
at the next full verification. Two full verifications make sure there is always a next
one:

- :func:`chain_verify_whole`, called by the owner in the commit that ends a subject's life
  (an instance completing): nothing ends over a chain tampered behind a run's mark; or
  :func:`chain_mark_drop` when that commit writes a success under the run's fence anyway,
  which then verifies the whole chain itself.
- :func:`chain_audit`, a bounded pass (the host's sweeper runs it on a slow cadence) over
  the subjects whose chain grew since the audit last verified them, with the anchors
  (ADR 0007): a checkpoint changed after its subject ended is found without anyone asking,
  and a broken chain opens the same incident ``recovery_verify`` opens.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

from django.db import connection
from django.db.models import BooleanField, ExpressionWrapper, F, Q
from django.db.models.functions import Now

from .. import chain
from ..anchors import AnchorIndex
from ..audits import ChainAudit
from ..chain import Verification
from ..decided import load_results
from ..errors import ChainBroken, ChainConflict
from ..models import Checkpoint, IntegrityIncident
from ..subjects import Subject
from ._ledger import verified_head
from .incidents import anchors_load, subject_verify
from .leases import Fence

__all__ = ["AuditPass", "chain_audit", "chain_mark_drop", "chain_verify_whole"]

log = logging.getLogger("recovery.audit")

AUDIT = "chains"
"""The name of the audit's progress row."""

ROWS_PER_SUBJECT = 64
"""Checkpoint rows a pass reads at most per subject it may verify (bounds its read)."""


def chain_verify_whole(*, subject: Subject, fence: Fence | None = None) -> None:
    """Verify ``subject``'s whole chain in the caller's transaction, or raise ``ChainBroken``.

    Needs the caller's transaction. Reads every checkpoint, every operation row and every
    decision's stored result of the subject (three statements) and verifies them exactly as
    a run's first success does (the same replay, ``_ledger.verified_head``). With ``fence``
    the run's mark is left at the verified head, so a success later in the same commit
    verifies only what follows it.

    A broken chain raises :class:`ChainBroken`: the caller's commit must roll back, and the
    caller opens the incident after it (``incident_open(verification=exc.result)``), since
    nothing written inside a rolled-back transaction survives.
    """
    with connection.cursor() as cursor:
        try:
            verified_head(cursor, subject, decisions=load_results(subject), fence=fence)
        except ChainBroken as exc:
            result = exc.result
            raise ChainBroken(
                f"Refusing to end {subject}: its checkpoint chain is broken at "
                f"#{result.position} ({result.reason}). Nothing of the ending was written; "
                "an integrity incident records it: investigate before anything moves on.",
                result,
            ) from None


def chain_mark_drop(*, fence: Fence) -> None:
    """Forget the verified mark of the run holding ``fence`` (ADR 0034): its next success
    reads and verifies the whole chain, not from the mark nor from its subject's seal
    (ADR 0066).

    For an owner whose ending commit writes a success under ``fence``: that success is then
    the whole-chain verification of the ending (the same replay as
    :func:`chain_verify_whole`, without the decisions' stored results, which their
    approval verified), and costs no statement of its own.
    """
    chain.mark_whole(fence)


@dataclass(frozen=True)
class AuditPass:
    """What one :func:`chain_audit` pass did."""

    verified: tuple[Verification, ...] = ()
    broken: tuple[tuple[Verification, IntegrityIncident], ...] = ()
    checkpoint: int = 0
    """The progress after the pass: every checkpoint up to this id is covered."""
    more: bool = False
    """Checkpoints past it are waiting (settled ones: the next pass can go on at once)."""


def chain_audit(*, subjects: int, settle: float, anchors: bool = True) -> AuditPass:
    """Verify, with the anchors, the whole chains of at most ``subjects`` subjects that grew
    since the audit last verified them; open an incident for each broken one.

    Owns its commits; outside any transaction. Progress is kept in the database (a
    :class:`~recovery.audits.ChainAudit` row: the newest checkpoint covered), so a restart
    goes on where the last pass stopped. The pass reads the checkpoints past it in the
    order they were written, takes their subjects in that order (each once, however much it
    grew) and verifies each whole chain as it is now; so every subject that grows is
    audited once after it grew, and an untouched one never again. Checkpoints younger than
    ``settle`` seconds (database clock) wait for a later pass: a commit still in flight may
    hold a lower id, and it must not be passed over. A chain that kept changing while it
    was read is verified at the next pass. Raises ``AnchorStoreError`` when the anchors are
    configured but cannot be read: nothing is concluded and the progress stays.
    """
    if subjects < 1:
        raise ValueError("an audit pass verifies at least one subject")
    progress, _ = ChainAudit.objects.get_or_create(name=AUDIT)
    order, upto, more = _subjects_due(progress.checkpoint, subjects, settle)
    if not order:
        return AuditPass(checkpoint=progress.checkpoint, more=more)
    loaded = anchors_load() if anchors else None
    index: AnchorIndex | bool = False if loaded is None else loaded
    verified: list[Verification] = []
    broken: list[tuple[Verification, IntegrityIncident]] = []
    for subject, before in order:
        try:
            result, incident = _verified(subject, index)
        except ChainConflict:
            log.info("%s kept changing while the audit read it; verified at the next pass", subject)
            upto, more = before, True
            break
        verified.append(result)
        if incident is not None:
            log.error("chain audit: %s is broken: %s (incident #%s)", subject, result, incident.pk)
            broken.append((result, incident))
    _advance(progress, upto, len(verified), len(broken))
    return AuditPass(tuple(verified), tuple(broken), upto, more)


def _verified(subject: Subject, index: AnchorIndex | bool):
    """``subject_verify`` with the pass's anchors. A commit landing on a live chain between
    its reads is read again, not concluded (``chain_verify``); a chain that kept moving
    raises ``ChainConflict``."""
    return subject_verify(subject=subject, anchors=index)


def _subjects_due(after: int, subjects: int, settle: float):
    """The subjects of the checkpoints past ``after``, in first-written order, at most
    ``subjects``; each with the id before its first such checkpoint. Also the id the pass
    covers when they are verified, and whether more checkpoints wait."""
    horizon = Now() - timedelta(seconds=settle)
    rows = (
        Checkpoint.objects.filter(pk__gt=after)
        .order_by("pk")
        .annotate(young=ExpressionWrapper(Q(recorded_at__gt=horizon), BooleanField()))
        .values_list("pk", "subject_type", "subject_id", "young")[: subjects * ROWS_PER_SUBJECT]
    )
    order: dict[Subject, int] = {}
    previous, more = after, False
    for pk, subject_type, subject_id, young in rows:
        subject = Subject(subject_type, subject_id)
        if young or (subject not in order and len(order) >= subjects):
            more = not young
            break
        order.setdefault(subject, previous)
        previous = pk
    else:
        more = len(rows) >= subjects * ROWS_PER_SUBJECT
    return list(order.items()), previous, more


def _advance(progress: ChainAudit, upto: int, verified: int, broken: int) -> None:
    """Move the progress forward (its own commit); another pass that moved it first wins."""
    ChainAudit.objects.filter(pk=progress.pk, checkpoint=progress.checkpoint).update(
        checkpoint=upto,
        subjects=F("subjects") + verified,
        broken=F("broken") + broken,
        updated_at=Now(),
    )
