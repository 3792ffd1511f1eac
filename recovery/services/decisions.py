"""Decisions: an operator resolves an uncertain operation; a second person approves.

Nothing moves on a request alone. Approval is a compare-and-swap on the decision's state,
so two approvals racing for the same decision move the operation exactly once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.db.models.functions import Now

from .. import chain
from ..canonical import FingerprintKind, fingerprint_value, input_guard
from ..decided import admit_result
from ..errors import CanonicalError, DecisionConflict, DecisionError
from ..evidence import EvidenceBatch, storage_path
from ..models import Decision, EvidenceFile, Operation, evidence_storage
from ..states import DecisionKind, DecisionState, OperationState
from ..subjects import Subject
from ._ledger import load_row, opening_incidents, transition, verified_head
from .compensations import compensation_bind

__all__ = ["decision_approve", "decision_reject", "decision_request", "decision_withdraw"]

K = DecisionKind
S = OperationState
# Which operation states each kind of decision may resolve, and where it moves them.
DECIDABLE = {
    K.EFFECT_CONFIRMED: ({S.OUTCOME_UNKNOWN}, S.EFFECT_CONFIRMED),
    K.EFFECT_ABSENT: ({S.OUTCOME_UNKNOWN}, S.EFFECT_ABSENT),
    # A cancel records that the work is abandoned; the effect stays unknown in the ledger.
    K.CANCEL: ({S.OUTCOME_UNKNOWN, S.PENDING}, None),
    # Approves a compensation to cross its dispatch boundary; the operation stays prepared
    # until the dispatch (recovery.services.compensations), bound to what was approved.
    K.COMPENSATE: ({S.PREPARED}, None),
}
NO_EVIDENCE = frozenset({K.CANCEL, K.COMPENSATE})


def _require_perm(user, perm: str, doing: str) -> None:
    if not (user and user.is_authenticated and user.is_active and user.has_perm(perm)):
        raise DecisionError(f"{user} may not {doing}: the permission {perm!r} is required.")


# Rationale, check answers and notes are stored as they are written: bounded, and free of
# what a database cannot store (U+0000 on PostgreSQL) or a page cannot show.
TEXT_MAX_BYTES = 64 * 1024


def _admit_text(fields: dict) -> None:
    try:
        input_guard(fields, max_bytes=TEXT_MAX_BYTES)
    except CanonicalError as exc:
        raise DecisionError(f"The decision cannot be recorded as written: {exc}") from None


def decision_request(
    *,
    operation_key: str,
    kind: str,
    rationale: str,
    requested_by,
    evidence: Sequence = (),
    checks: Mapping[str, str] | None = None,
    required_checks: Sequence[str] = (),
    result: Mapping | None = None,
    result_schema: Mapping | None = None,
    result_max_bytes: int = TEXT_MAX_BYTES,
) -> Decision:
    """Request a decision on an uncertain operation, with evidence files.

    *Effect confirmed* and *effect absent* need a rationale and at least one evidence file;
    a cancel needs a rationale. ``required_checks`` are the provider's verification check
    ids: each needs an answer in ``checks``. *Effect confirmed* carries ``result``, what
    the effect returned, checked against ``result_schema`` when given (the other kinds
    carry none). Nothing moves until another person approves.
    """
    _require_perm(requested_by, "recovery.request_decision", "request a decision")
    if kind not in DECIDABLE:
        raise DecisionError(f"Unknown decision {kind!r}; use one of {', '.join(K.values)}.")
    rationale = (rationale or "").strip()
    if not rationale:
        raise DecisionError(
            "A decision needs a rationale: say what was checked and what it showed."
        )
    if kind not in NO_EVIDENCE and not evidence:
        raise DecisionError(
            f"'{K(kind).label}' needs at least one evidence file (for example the provider's "
            "record, a registry extract or a confirmation e-mail). A timeout, a restart or an "
            "empty local result is not evidence of absence."
        )
    checks = {str(k): str(v).strip() for k, v in (checks or {}).items()}
    missing = [c for c in required_checks if not checks.get(c)]
    if missing:
        raise DecisionError(
            f"Answer the provider's verification checks first: {', '.join(missing)}."
        )
    _admit_text({"rationale": rationale, "checks": checks})
    stored, result_fp = admit_result(kind, result, result_schema, max_bytes=result_max_bytes)
    request = _Request(operation_key, kind, rationale, requested_by, checks, stored, result_fp)
    # Files are streamed to temporary files and checked first; they reach the store only
    # as the last step of the transaction, and the batch removes whatever was not stored.
    with EvidenceBatch(evidence, storage=evidence_storage()) as batch:
        return _record_request(request, batch)


@dataclass(frozen=True)
class _Request:
    operation_key: str
    kind: str
    rationale: str
    requested_by: Any
    checks: dict[str, str]
    result: dict | None
    result_fp: str


def _record_request(request: _Request, batch: EvidenceBatch) -> Decision:
    try:
        with transaction.atomic():
            operation = _decidable(request.operation_key, request.kind)
            decision = Decision.objects.create(
                operation=operation,
                kind=request.kind,
                rationale=request.rationale,
                checks=request.checks,
                result=request.result,
                result_fp=request.result_fp,
                requested_by=request.requested_by,
                requested_at=Now(),
            )
            for item in batch.files:
                EvidenceFile.objects.create(
                    decision=decision,
                    file=storage_path(item.fingerprint),
                    fingerprint=item.fingerprint,
                    size=item.size,
                    content_type=item.content_type,
                    name=item.name,
                    uploaded_at=Now(),
                )
            _chain_request(operation, decision, request, batch.files)
            # The files reach the store after the commit, and are removed on a rollback
            # (of this block or of a caller's): a refused request leaves no file behind.
            batch.store_after_commit()
    except IntegrityError as exc:
        raise DecisionConflict(
            f"Operation {request.operation_key} already has a decision awaiting approval. "
            "Approve or reject that one first."
        ) from exc
    decision.refresh_from_db()
    return decision


def _decidable(operation_key: str, kind: str) -> Operation:
    """The operation, locked, if a decision of ``kind`` may resolve it."""
    operation = Operation.objects.select_for_update().filter(key=operation_key).first()
    if operation is None:
        raise DecisionError(f"No ledger operation has key {operation_key!r}.")
    allowed, _ = DECIDABLE[kind]
    if operation.state not in allowed:
        raise DecisionError(
            f"Operation {operation_key} is {operation.state}; '{K(kind).label}' can "
            f"only resolve an operation that is {' or '.join(sorted(allowed))}."
        )
    return operation


def _chain_request(operation: Operation, decision: Decision, request: _Request, files) -> None:
    fact = {
        "operation": operation.key,
        "decision": decision.pk,
        "kind": str(request.kind),
        "requested_by": request.requested_by.pk,
        "rationale_fp": fingerprint_value(FingerprintKind.INPUT, request.rationale),
        "checks_fp": fingerprint_value(FingerprintKind.INPUT, request.checks),
        "evidence": sorted(f.fingerprint for f in files),
    }
    if request.result is not None:
        # The values approved are the values requested: the chain holds their fingerprint.
        fact["result_fp"] = request.result_fp
    subject = Subject(operation.subject_type, operation.subject_id)
    with connection.cursor() as cursor:
        chain.append(cursor, subject, chain.read_head(cursor, subject), "decision.requested", fact)


def decision_approve(*, decision_id: int, approved_by, result_fp: str | None = None) -> Decision:
    """Approve another person's decision and move the operation, exactly once.

    ``result_fp`` is the fingerprint of the result the approver was shown: required
    when the decision carries a result; if the decision's is another, nothing is
    approved. An approved *effect confirmed*
    records its result's fingerprint as the operation's result.
    """
    _require_perm(approved_by, "recovery.approve_decision", "approve a decision")
    with opening_incidents(), transaction.atomic():
        decision = _claim(decision_id, approved_by, result_fp)
        operation = decision.operation
        subject = Subject(operation.subject_type, operation.subject_id)
        extra = {
            "decision": decision.pk,
            "kind": str(decision.kind),
            "requested_by": decision.requested_by_id,
            "approved_by": approved_by.pk,
        }
        with connection.cursor() as cursor:
            # The operation may have been resolved since the request (e.g. by a provider
            # reconcile): its fact is final, so this decision must not overwrite it.
            row = load_row(cursor, operation.key)
            allowed, target = DECIDABLE[decision.kind]
            if row["state"] not in allowed:
                raise DecisionConflict(
                    f"Operation {operation.key} is now {row['state']}, so decision "
                    f"{decision_id} no longer applies. Nothing was changed; reject it."
                )
            if target is None:
                head = chain.read_head(cursor, subject)
                if decision.kind == K.COMPENSATE:
                    extra.update(compensation_bind(cursor, decision, head.seq + 1))
                fact = {"operation": operation.key, **extra}
                chain.append(cursor, subject, head, "decision.approved", fact)
            else:
                _move(cursor, row, target, decision, extra)
    # Only what the approval changed is read again: the result stays the one verified.
    decision.refresh_from_db(fields=["state", "decided_by", "decided_at"])
    return decision


def _claim(decision_id: int, approved_by, result_fp: str | None) -> Decision:
    """Move the decision from requested to approved (compare-and-swap); return it."""
    decision = Decision.objects.select_related("operation").filter(pk=decision_id).first()
    if decision is None:
        raise DecisionError(f"No decision has id {decision_id}.")
    if decision.requested_by_id == approved_by.pk:
        raise DecisionError(
            "The person who requested a decision cannot approve it: a second person "
            "must check the evidence."
        )
    if decision.state != DecisionState.REQUESTED:
        raise _not_awaiting(decision_id)
    if decision.result_fp and result_fp is None:
        raise DecisionConflict(
            f"Decision {decision_id} carries result values, so its approval must name the "
            "fingerprint of the values the approver checked. Nothing was approved: approve "
            "it from the instance page, where the values and their fingerprint are shown."
        )
    if result_fp is not None and result_fp != decision.result_fp:
        raise DecisionConflict(
            f"Decision {decision_id} does not carry the result you were shown. Nothing was "
            "approved: open the instance again and check the values before approving."
        )
    claimed = Decision.objects.filter(pk=decision_id, state=DecisionState.REQUESTED).update(
        state=DecisionState.APPROVED, decided_by=approved_by, decided_at=Now()
    )
    if claimed != 1:
        raise _not_awaiting(decision_id)
    return decision


def _move(cursor, row: dict, target: str, decision: Decision, extra: dict) -> None:
    """Move the operation as the decision says and chain it (needs the open transaction).

    *Effect confirmed* is a success: the whole chain, and the decision's stored result
    against the fingerprint its request chained, are verified first.
    """
    subject = Subject(row["subject_type"], row["subject_id"])
    result_fp = row["result_fp"]
    if target == S.EFFECT_CONFIRMED:
        decisions = [(decision.pk, decision.result, decision.result_fp)]
        head = verified_head(cursor, subject, decisions=decisions)
        result_fp = decision.result_fp or result_fp
    else:
        head = chain.read_head(cursor, subject)
    transition(
        cursor,
        row,
        target,
        head=head,
        kind="decision.approved",
        fact_extra=extra,
        result_fp=result_fp,
    )


def decision_reject(*, decision_id: int, rejected_by, note: str) -> Decision:
    """Reject another person's decision; the operation stays as it was."""
    _require_perm(rejected_by, "recovery.approve_decision", "reject a decision")
    note = (note or "").strip()
    if not note:
        raise DecisionError("Say why the decision is rejected, so the requester can act on it.")
    _admit_text({"note": note})
    with transaction.atomic():
        decision = Decision.objects.select_related("operation").filter(pk=decision_id).first()
        if decision is None:
            raise DecisionError(f"No decision has id {decision_id}.")
        if decision.requested_by_id == rejected_by.pk:
            raise DecisionError(
                "The requester cannot reject their own decision; a second person decides."
            )
        changed = Decision.objects.filter(pk=decision_id, state=DecisionState.REQUESTED).update(
            state=DecisionState.REJECTED,
            decided_by=rejected_by,
            decided_at=Now(),
            decision_note=note,
        )
        if changed != 1:
            raise _not_awaiting(decision_id)
        operation = decision.operation
        subject = Subject(operation.subject_type, operation.subject_id)
        with connection.cursor() as cursor:
            chain.append(
                cursor,
                subject,
                chain.read_head(cursor, subject),
                "decision.rejected",
                {
                    "operation": operation.key,
                    "decision": decision.pk,
                    "rejected_by": rejected_by.pk,
                },
            )
    decision.refresh_from_db()
    return decision


def _not_awaiting(decision_id: int) -> DecisionConflict:
    """The refusal for a decision someone already approved, rejected or withdrew."""
    state = Decision.objects.filter(pk=decision_id).values_list("state", flat=True).first()
    now = DecisionState(state).label.lower() if state else "gone"
    return DecisionConflict(
        f"Decision {decision_id} is no longer awaiting approval: it is {now}. A decision is "
        "decided once; nothing was changed."
    )


def decision_withdraw(*, decision_id: int, withdrawn_by) -> Decision:
    """The requester withdraws their own decision before anyone decided it.

    The operation stays as it was and a ``decision.withdrawn`` checkpoint is appended; a
    new decision can then be requested. Only the requester may withdraw (another person
    rejects, with a note).
    """
    _require_perm(withdrawn_by, "recovery.request_decision", "withdraw a decision")
    with transaction.atomic():
        decision = Decision.objects.select_related("operation").filter(pk=decision_id).first()
        if decision is None:
            raise DecisionError(f"No decision has id {decision_id}.")
        if decision.requested_by_id != withdrawn_by.pk:
            raise DecisionError(
                f"Only its requester ({decision.requested_by}) can withdraw decision "
                f"{decision_id}; reject it with a note instead."
            )
        changed = Decision.objects.filter(
            pk=decision_id, state=DecisionState.REQUESTED, requested_by=withdrawn_by
        ).update(state=DecisionState.WITHDRAWN, decided_at=Now())
        if changed != 1:
            raise _not_awaiting(decision_id)
        operation = decision.operation
        subject = Subject(operation.subject_type, operation.subject_id)
        with connection.cursor() as cursor:
            chain.append(
                cursor,
                subject,
                chain.read_head(cursor, subject),
                "decision.withdrawn",
                {
                    "operation": operation.key,
                    "decision": decision.pk,
                    "withdrawn_by": withdrawn_by.pk,
                },
            )
    decision.refresh_from_db()
    return decision
