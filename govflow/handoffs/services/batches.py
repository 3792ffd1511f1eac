"""Bulk triage, the writing half: submit a previewed batch, approve or reject it whole.

A batch is a set of ordinary decision requests (``handoff_request``), grouped and bound to
the fingerprint of the preview its requester saw; its approval is ``handoff_approve`` of
each, in one transaction. Nothing here moves a step in a way a single decision could not
(ADR 0024):

1. Submitting recomputes the preview from the database inside the transaction. A
   fingerprint that differs from the submitted one refuses the batch, naming what changed
   (the selection, an operation's state or revision, the decision or its text).
2. Each row becomes a decision with its own evidence (the files for all rows and the row's
   own, at least one) and its evidence reference in the rationale, chained as today.
3. Approval claims the batch (compare-and-swap on ``requested``), checks each operation is
   where the preview saw it, and approves each decision; the first refusal rolls back the
   whole transaction — nothing applied — and names the operation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from django.db import transaction
from django.db.models.functions import Now
from django.utils.translation import gettext as _

from govflow.engine.errors import EngineError, NotPermitted
from recovery.api import (
    ChainBroken,
    FingerprintKind,
    RecoveryError,
    decision_get,
    fingerprint_value,
    incident_open,
    operations_standing,
)

from ..batches import BatchPreview, BatchRefused, batch_fingerprint, batch_preview
from ..models import BatchItem, BatchState, DecisionBatch
from .desk import handoff_approve, handoff_reject, handoff_request

__all__ = ["BatchSubmission", "batch_approve", "batch_reject", "batch_request"]

REQUEST = "recovery.request_decision"
APPROVE = "recovery.approve_decision"
OPERATE = "engine.operate_instance"


@dataclass(frozen=True)
class BatchSubmission:
    """What the requester submits: the preview's terms and fingerprint, and the evidence."""

    token_ids: Sequence[int]
    kind: str
    rationale: str
    checks: Mapping[str, str]
    fingerprint: str
    previewed: Sequence[tuple[str, int]]  # (operation key, revision) as the preview showed
    references: Mapping[int, str]  # token id → where the evidence shows this operation
    files: Mapping[int, Sequence]  # token id → the row's own evidence files
    shared: Sequence = ()  # evidence files for every row


def _require(user, *perms: str, doing: str) -> None:
    missing = [p for p in perms if not user.has_perm(p)]
    if missing:
        raise NotPermitted(
            _("%(user)s may not %(doing)s: the permission %(perms)s is required.")
            % {"user": user, "doing": doing, "perms": ", ".join(repr(p) for p in missing)}
        )


def batch_request(*, submission: BatchSubmission, actor) -> DecisionBatch:
    """Request every decision of a previewed batch, in one transaction, or none."""
    _require(actor, OPERATE, REQUEST, doing=_("request decisions"))
    s = submission
    shown = batch_fingerprint(
        kind=s.kind, rationale=s.rationale, checks=s.checks, operations=s.previewed
    )
    if shown != s.fingerprint:
        raise BatchRefused(
            _(
                "The submission does not match the preview it claims (its fingerprint "
                "differs): preview the batch again. Nothing was recorded."
            )
        )
    with transaction.atomic():
        preview = batch_preview(
            user=actor, token_ids=s.token_ids, kind=s.kind, rationale=s.rationale, checks=s.checks
        )
        if preview.fingerprint != s.fingerprint:
            raise BatchRefused(_changes(s.previewed, preview))
        _require_evidence(preview, s)
        batch = DecisionBatch.objects.create(
            kind=preview.kind,
            action=preview.action,
            definition=preview.definition,
            tenant=preview.tenant,
            fingerprint=preview.fingerprint,
            rationale=preview.rationale,
            requested_by=actor,
            requested_at=Now(),
        )
        for row in preview.rows:
            reference = s.references[row.token_id].strip()
            decision = handoff_request(
                instance_id=row.instance_id,
                token_id=row.token_id,
                kind=preview.kind,
                # Recorded text, the same in every language: chained with the request.
                rationale=f"{preview.rationale}\n\nEvidence reference: {reference} "
                f"(decision batch {batch.pk}).",
                actor=actor,
                evidence=[*s.shared, *s.files.get(row.token_id, ())],
                checks=dict(preview.checks),
            )
            BatchItem.objects.create(
                batch=batch,
                decision=decision,
                token_id=row.token_id,
                operation_key=row.operation_key,
                revision=row.revision,
                reference=reference,
            )
        # decision_request locked each operation row: they are still where the preview saw.
        _require_unmoved(batch)
    return batch


def _require_evidence(preview: BatchPreview, s: BatchSubmission) -> None:
    for number, row in enumerate(preview.rows, start=1):
        if not (s.references.get(row.token_id) or "").strip():
            raise BatchRefused(
                _("Row %(n)s (%(case)s, %(step)s) needs its evidence reference.")
                % {"n": number, "case": row.case_title, "step": row.step_title}
            )
        if not s.shared and not s.files.get(row.token_id):
            raise BatchRefused(
                _(
                    "Row %(n)s (%(case)s, %(step)s) has no evidence file: add one for the "
                    "row, or files for all rows."
                )
                % {"n": number, "case": row.case_title, "step": row.step_title}
            )


def _changes(previewed: Sequence[tuple[str, int]], preview: BatchPreview) -> str:
    """What differs between the preview the requester saw and the batch as it is now."""
    before = dict(previewed)
    now = {r.operation_key: r for r in preview.rows}
    said = []
    gone, added = sorted(set(before) - set(now)), sorted(set(now) - set(before))
    if gone or added:
        said.append(
            _("the selection changed (removed: %(gone)s; added: %(added)s)")
            % {
                "gone": ", ".join(k[:15] + "…" for k in gone) or "—",
                "added": ", ".join(k[:15] + "…" for k in added) or "—",
            }
        )
    for key in sorted(set(before) & set(now)):
        row = now[key]
        if before[key] != row.revision:
            said.append(
                _(
                    "operation %(key)s… (%(case)s, %(step)s) moved from ledger revision "
                    "%(was)s to %(now)s"
                )
                % {
                    "key": key[:15],
                    "case": row.case_title,
                    "step": row.step_title,
                    "was": before[key],
                    "now": row.revision,
                }
            )
    if not said:
        said.append(_("the decision, its rationale or its check answers changed"))
    return _(
        "The batch changed since its preview: %(what)s. Nothing was recorded: preview it again."
    ) % {"what": "; ".join(said)}


def _require_unmoved(batch: DecisionBatch) -> None:
    """Each operation still has the state and revision the batch was bound to, or refused
    naming the first that moved (rolls back the caller's transaction)."""
    items = list(batch.items.select_related("token__instance"))
    standing = operations_standing(item.operation_key for item in items)
    for item in items:
        op = standing.get(item.operation_key)
        if op is None or op.state != "outcome_unknown" or op.revision != item.revision:
            where = _("step '%(step)s' of instance %(id)s (operation %(key)s…)") % {
                "step": item.token.node_id,
                "id": item.token.instance_id,
                "key": item.operation_key[:15],
            }
            now = _("%(state)s at revision %(rev)s") % {
                "state": op.state if op else _("gone"),
                "rev": op.revision if op else "—",
            }
            raise BatchRefused(
                _(
                    "Batch %(batch)s cannot be applied: %(where)s moved since the preview "
                    "(now %(now)s). Nothing was applied; reject the batch."
                )
                % {"batch": batch.pk, "where": where, "now": now}
            )


def batch_approve(*, batch_id: int, actor) -> DecisionBatch:
    """Approve every decision of another person's batch in one transaction, or none."""
    _require(actor, APPROVE, doing=_("approve decisions"))
    try:
        with transaction.atomic():
            batch = _claim(batch_id, actor, BatchState.APPROVED)
            _require_unmoved(batch)
            # One fixed order (instance, then step) so two batches never wait on each other.
            items = sorted(
                batch.items.select_related("token"),
                key=lambda i: (i.token.instance_id, i.token_id),
            )
            for item in items:
                _approve_item(batch, item, actor)
    except BatchRefused as exc:
        if isinstance(exc.__cause__, ChainBroken):
            # The incident handoff_approve opened rolled back with the batch: open it now,
            # after the rollback, so the broken chain stops its instance (fail closed).
            incident_open(verification=exc.__cause__.result)
        raise
    batch.refresh_from_db()
    return batch


EMPTY_RESULT_FP = fingerprint_value(FingerprintKind.RESULT, {})
"""The only result a batch's decision carries (result values are decided one by one):
the approver approves it as the preview showed it, and a decision carrying any other is
refused."""


def _approve_item(batch: DecisionBatch, item: BatchItem, actor) -> None:
    try:
        carried = decision_get(decision_id=item.decision_id).result_fp
        shown = EMPTY_RESULT_FP if carried else None  # effect absent carries none at all
        handoff_approve(decision_id=item.decision_id, actor=actor, result_fp=shown)
    except (EngineError, RecoveryError) as exc:
        raise BatchRefused(
            _(
                "Batch %(batch)s cannot be applied: step '%(step)s' of instance %(id)s "
                "(operation %(key)s…): %(why)s Nothing was applied."
            )
            % {
                "batch": batch.pk,
                "step": item.token.node_id,
                "id": item.token.instance_id,
                "key": item.operation_key[:15],
                "why": exc,
            }
        ) from exc


def batch_reject(*, batch_id: int, actor, note: str) -> DecisionBatch:
    """Reject another person's batch whole: each decision is rejected with ``note``."""
    _require(actor, APPROVE, doing=_("reject decisions"))
    note = (note or "").strip()
    if not note:
        raise BatchRefused(_("Say why the batch is rejected, so the requester can act on it."))
    with transaction.atomic():
        batch = _claim(batch_id, actor, BatchState.REJECTED, note=note)
        for item in batch.items.all():
            handoff_reject(decision_id=item.decision_id, actor=actor, note=note)
    batch.refresh_from_db()
    return batch


def _claim(batch_id: int, actor, state: str, note: str = "") -> DecisionBatch:
    batch = DecisionBatch.objects.filter(pk=batch_id).first()
    if batch is None:
        raise BatchRefused(_("No decision batch has id %(id)s.") % {"id": batch_id})
    if batch.requested_by_id == actor.pk:
        raise NotPermitted(
            _(
                "You requested batch %(id)s: a second person with the permission "
                "'recovery.approve_decision' checks the evidence and decides it."
            )
            % {"id": batch_id}
        )
    claimed = DecisionBatch.objects.filter(pk=batch_id, state=BatchState.REQUESTED).update(
        state=state, decided_by=actor, decided_at=Now(), decision_note=note
    )
    if claimed != 1:
        batch.refresh_from_db()
        raise BatchRefused(
            _("Batch %(id)s is no longer awaiting approval: it is %(state)s. Nothing was changed.")
            % {"id": batch_id, "state": batch.get_state_display().lower()}
        )
    return batch
