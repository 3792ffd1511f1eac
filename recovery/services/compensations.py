"""Compensation intents: undo a succeeded operation, through the ledger like any effect.

1. :func:`compensation_record` — the intent and its own ``cmp-`` operation (``prepared``,
   before the dispatch boundary) commit together, chained, and only for an original that
   durably succeeded (``succeeded`` or ``effect_confirmed``). A unique constraint keeps it
   to one intent per original, whoever races for it.
2. An intent whose policy is ``operator`` runs only after a decision of kind
   ``compensate`` is requested by one person and approved by another
   (``decision_request`` / :func:`compensation_approve`). The approval is *bound*: to the
   subject's revision right after it, and to the preview, input and tenant it was shown.
3. :func:`compensation_dispatch` moves the ``cmp-`` operation across the dispatch
   boundary, on the caller's fence, only while that binding still holds; otherwise the
   approval is voided (chained) and nothing is dispatched.

Its observation, an unknown outcome and the decisions that settle one are the ledger's
ordinary services (``operation_observe``, ``decision_*``): a compensation is an effect.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import IntegrityError, connection
from django.db.models.functions import Now

from .. import chain
from ..compensation_reads import CompensationView
from ..compensation_reads import compensation_view as _view
from ..compensations import Compensation
from ..db import atomic
from ..errors import CompensationDrift, CompensationRefused, DecisionError, OperationNotFound
from ..models import Decision, Operation
from ..states import CompensationApproval, CompensationTrigger, DecisionKind, OperationState
from ..subjects import Subject
from .leases import Fence
from .operations import RecordedOperation, operation_dispatch, operation_record

__all__ = [
    "DispatchRefused",
    "compensation_approve",
    "compensation_dispatch",
    "compensation_record",
]

S = OperationState
ELIGIBLE = frozenset({S.SUCCEEDED, S.EFFECT_CONFIRMED})

_WHY_NOT = {
    S.PREPARED: "it has not been dispatched yet",
    S.DISPATCHED: "it is still running (dispatched, no answer yet)",
    S.PENDING: "its provider still owns the outcome (pending)",
    S.FAILED: "it failed: nothing happened, so there is nothing to undo",
    S.EFFECT_ABSENT: "it was decided absent: nothing happened, so there is nothing to undo",
    S.OUTCOME_UNKNOWN: (
        "its outcome is unknown (and stays unknown when its instance was cancelled): "
        "record what happened first (effect confirmed or absent); an unknown effect is "
        "never compensated on a guess"
    ),
}


@dataclass(frozen=True)
class DispatchRefused:
    """What :func:`compensation_dispatch` returns when the binding moved (nothing sent)."""

    drift: tuple[str, ...]
    message: str


def _refuse_ineligible(original_key: str, original: Operation | None) -> None:
    if original is None:
        raise CompensationRefused(
            f"No ledger operation has key {original_key!r}; nothing was recorded.",
            reason="ineligible",
        )
    if original.key.startswith("cmp-"):
        raise CompensationRefused(
            f"Operation {original.key} is itself a compensation; a compensation is not "
            "compensated again. Nothing was recorded.",
            reason="ineligible",
        )
    if original.state not in ELIGIBLE:
        raise CompensationRefused(
            f"Operation {original.key} ({original.action}) cannot be compensated: "
            f"{_WHY_NOT.get(original.state, original.state)}. Only an effect that durably "
            "succeeded can be undone. Nothing was recorded.",
            reason="ineligible",
        )


def _exists(original_key: str) -> CompensationRefused:
    return CompensationRefused(
        f"Operation {original_key} already has its compensation; an operation is "
        "compensated at most once (the existing intent is reused after any crash). "
        "Nothing was recorded.",
        reason="exists",
    )


def _check_choices(tenant: str, trigger: str, approval: str) -> None:
    if trigger not in CompensationTrigger.values:
        raise CompensationRefused(
            f"Unknown trigger {trigger!r}; use one of {', '.join(CompensationTrigger.values)}.",
            reason="invalid",
        )
    if approval not in CompensationApproval.values:
        raise CompensationRefused(
            f"Unknown approval policy {approval!r}; use one of "
            f"{', '.join(CompensationApproval.values)}.",
            reason="invalid",
        )
    if not isinstance(tenant, str) or not tenant:
        raise CompensationRefused("A compensation needs its tenant.", reason="invalid")


def compensation_record(
    *,
    original_key: str,
    action: str,
    recovery_mode: str,
    definition_fp: str,
    input_fp: str,
    preview_fp: str,
    access_fp: str,
    idempotency_fp: str,
    tenant: str,
    trigger: str,
    approval: str,
    fence: Fence,
    projection_fp: str = "",
) -> CompensationView:
    """Record the intent to compensate ``original_key``, on the caller's live fence.

    Runs in the caller's transaction (or its own). The original must have durably
    succeeded; a second intent for it is refused by a unique constraint, whoever asks.
    Raises :class:`CompensationRefused` (``reason`` ``ineligible`` or ``exists``) with
    nothing recorded, or what :func:`operation_record` raises.
    """
    _check_choices(tenant, trigger, approval)
    with atomic():
        original = Operation.objects.select_for_update().filter(key=original_key).first()
        _refuse_ineligible(original_key, original)
        if Compensation.objects.filter(original=original).exists():
            raise _exists(original_key)
        recorded = operation_record(
            subject=Subject(original.subject_type, original.subject_id),
            step_id=original.step_id,
            action=action,
            recovery_mode=recovery_mode,
            definition_fp=definition_fp,
            input_fp=input_fp,
            preview_fp=preview_fp,
            access_fp=access_fp,
            idempotency_fp=idempotency_fp,
            nonce=f"compensation:{original.key}",
            ordinal=0,
            fence=fence,
            state=S.PREPARED,
            compensation=True,
            projection_fp=projection_fp,
        )
        intent = _insert(original, recorded, tenant, trigger, approval)
    return _view(intent)


def _insert(original, recorded: RecordedOperation, tenant, trigger, approval) -> Compensation:
    """The intent's row and its ``compensation.recorded`` fact (needs the transaction)."""
    try:
        with atomic():
            intent = Compensation.objects.create(
                original=original,
                operation=Operation.objects.get(key=recorded.key),
                subject_type=original.subject_type,
                subject_id=original.subject_id,
                position=original.chain_seq,
                tenant=tenant,
                trigger=trigger,
                approval=approval,
                recorded_at=Now(),
            )
    except IntegrityError as exc:
        raise _exists(original.key) from exc
    fact = {
        "compensation": recorded.key,
        "original": original.key,
        "position": original.chain_seq,
        "tenant": tenant,
        "trigger": trigger,
        "approval": approval,
    }
    _append(recorded.subject, "compensation.recorded", fact)
    return Compensation.objects.select_related("original", "operation").get(pk=intent.pk)


def _append(subject: Subject, kind: str, fact: dict) -> int:
    with connection.cursor() as cursor:
        return chain.append(cursor, subject, chain.read_head(cursor, subject), kind, fact).seq


def compensation_bind(cursor, decision: Decision, revision: int) -> dict:
    """Bind an approved ``compensate`` decision to what it was shown (internal; called by
    ``decision_approve`` inside its transaction, before it chains the approval).

    Returns the binding, which the approval's fact carries.
    """
    intent = Compensation.objects.select_related("operation").get(operation=decision.operation)
    binding = {
        "bound_revision": revision,
        "bound_preview_fp": intent.operation.preview_fp,
        "bound_input_fp": intent.operation.input_fp,
        "bound_tenant": intent.tenant,
    }
    Compensation.objects.filter(pk=intent.pk).update(decision=decision, **binding)
    return binding


def compensation_approve(
    *,
    decision_id: int,
    approved_by,
    shown_revision: int,
    shown_preview_fp: str,
    tenant: str,
) -> Decision:
    """Approve another person's ``compensate`` decision, if nothing moved since it was shown.

    ``shown_revision`` and ``shown_preview_fp`` are what the approver's page showed;
    ``tenant`` is the instance's tenant now. If the subject's revision moved, the preview
    differs or the tenant changed, :class:`CompensationDrift` is raised and nothing is
    approved: reload, check again, approve what is there now.
    """
    from .decisions import decision_approve

    with atomic():
        intent = (
            Compensation.objects.select_related("operation")
            .filter(operation__decisions__pk=decision_id)
            .first()
        )
        decision = Decision.objects.filter(pk=decision_id).first()
        if intent is None or decision is None or decision.kind != DecisionKind.COMPENSATE:
            raise DecisionError(f"Decision {decision_id} is not a compensation's approval.")
        subject = Subject(intent.subject_type, intent.subject_id)
        drift = _moved(
            revision=(chain.subject_revision(subject), shown_revision),
            preview=(intent.operation.preview_fp, shown_preview_fp),
            tenant=(intent.tenant, tenant),
        )
        if drift:
            raise CompensationDrift(
                f"The compensation {intent.operation.key} changed since it was shown to you "
                f"({', '.join(drift)} moved). Nothing was approved: open the instance again, "
                "check what the compensation will do now and approve that.",
                drift=drift,
            )
        return decision_approve(decision_id=decision_id, approved_by=approved_by)


def _moved(**pairs: tuple) -> tuple[str, ...]:
    return tuple(name for name, (now, then) in pairs.items() if now != then)


def compensation_dispatch(
    *, key: str, fence: Fence, tenant: str, input_fp: str, preview_fp: str
) -> RecordedOperation | DispatchRefused:
    """Move the compensation ``key`` across the dispatch boundary, on the caller's fence.

    Runs in the caller's transaction (or its own). ``input_fp`` and ``preview_fp`` are
    the fingerprints of the input and preview the caller is about to use; ``tenant`` is
    the subject's tenant now. They must be the recorded ones, and a bound approval must
    still hold: the subject's revision the one right after it. Otherwise nothing is
    dispatched, a bound approval is voided (``compensation.approval_void``, chained) and
    :class:`DispatchRefused` is returned. An intent whose policy needs an approval and has
    none raises :class:`CompensationDrift` with ``drift`` ``("approval",)``.
    """
    with atomic():
        intent = (
            Compensation.objects.select_for_update()
            .select_related("operation")
            .filter(operation__key=key)
            .first()
        )
        if intent is None:
            raise OperationNotFound(f"No compensation has operation key {key!r}.")
        operation = intent.operation
        if operation.state != S.PREPARED:  # an idempotent repeat, or the ledger's refusal
            return operation_dispatch(key=key, fence=fence)
        subject = Subject(intent.subject_type, intent.subject_id)
        drift = _moved(
            input=(operation.input_fp, input_fp),
            preview=(operation.preview_fp, preview_fp),
            tenant=(intent.tenant, tenant),
        )
        if intent.decision_id is not None:
            drift += _moved(revision=(chain.subject_revision(subject), intent.bound_revision))
        elif intent.approval == CompensationApproval.OPERATOR and not drift:
            raise CompensationDrift(
                f"Compensation {key} needs an operator's approval before it runs.",
                drift=("approval",),
            )
        if drift:
            return _void(intent, subject, drift)
        return operation_dispatch(key=key, fence=fence)


def _void(intent: Compensation, subject: Subject, drift: tuple[str, ...]) -> DispatchRefused:
    """Void a bound approval that no longer holds, chained (needs the transaction)."""
    voided = intent.decision_id
    if voided is not None:
        Compensation.objects.filter(pk=intent.pk).update(
            decision=None,
            bound_revision=None,
            bound_preview_fp="",
            bound_input_fp="",
            bound_tenant="",
        )
        fact = {"compensation": intent.operation.key, "decision": voided, "drift": list(drift)}
        _append(subject, "compensation.approval_void", fact)
    message = (
        f"Compensation {intent.operation.key} was not dispatched: its "
        f"{', '.join(drift)} changed since it was "
        + ("approved. The approval no longer applies; " if voided else "recorded. ")
        + "check it again and approve it anew (two people), or investigate the change."
    )
    return DispatchRefused(drift=drift, message=message)
