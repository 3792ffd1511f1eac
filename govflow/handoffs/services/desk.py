"""The handoff desk: human approvals, external tasks, and decisions on uncertain steps.

Each is a place where the engine waits for someone. These services record what that
someone did and move the step, under the instance's lease, in one commit. (Before the
handoffs app this module was ``govflow/engine/services/waits.py``.)
"""

from __future__ import annotations

from typing import Any

from govflow.engine.errors import EngineConflict, InvalidRequest, NotPermitted
from govflow.engine.limits import admit_json, admit_text, payload_max_bytes
from govflow.engine.models import InstanceStatus, Token, TokenState, WaitKind
from govflow.engine.queue import enqueue_advance
from govflow.engine.registry import registry
from govflow.engine.selectors import step_get
from govflow.engine.services.blocking import leave_or_block
from govflow.engine.services.definitions import spec_of
from govflow.engine.services.instances import InstanceHeld
from govflow.engine.services.routing import Router
from recovery.api import (
    ChainBroken,
    DecisionKind,
    decision_approve,
    decision_get,
    decision_reject,
    decision_request,
    decision_withdraw,
    incident_open,
)

__all__ = [
    "approval_decide",
    "external_complete",
    "handoff_approve",
    "handoff_reject",
    "handoff_request",
    "handoff_withdraw",
]

CANCELLED_ALREADY = (
    "The instance is already cancelled, but the effect of this step may have happened: "
    "a cancel decides nothing about it. Record what happened instead (effect confirmed or "
    "effect absent, with evidence)."
)


def _waiting(run, token_id: int, kind: str) -> Token:
    token = run.active.get(token_id)
    if token is None or token.state != TokenState.WAITING or token.wait_kind != kind:
        raise EngineConflict(
            f"Step {token_id} of instance {run.instance.pk} is not waiting for "
            f"{'an approval' if kind == WaitKind.APPROVAL else kind}."
        )
    return token


def _release_waiting(run, token: Token, payload: dict[str, Any]) -> None:
    """Make a waiting step ready with what it waited for, in one commit, and queue the run."""
    with run.commit():
        run.update_token(token, TokenState.WAITING, state=TokenState.READY, payload=payload)
        run.flush(Router(run))
        enqueue_advance(run.instance.pk)


def approval_decide(
    *, instance_id: int, token_id: int, actor, approved: bool, note: str = ""
) -> None:
    """Record a human approval; the node's permission is checked against ``actor``."""
    note = admit_text(str(note)[:1000], name="note", max_length=1000, required=False)
    with InstanceHeld(instance_id, actor) as run:
        token = _waiting(run, token_id, WaitKind.APPROVAL)
        permission = run.spec.nodes[token.node_id]["permission"]
        if not actor.has_perm(permission):
            raise NotPermitted(
                f"{actor} may not decide '{token.node_id}': it needs the permission {permission!r}."
            )
        _release_waiting(
            run,
            token,
            {"approved": bool(approved), "by": actor.get_username(), "note": note},
        )


def external_complete(
    *, instance_id: int, token_id: int, payload: dict[str, Any], actor=None
) -> None:
    """An external worker reports its task done; ``payload`` feeds the output mapping."""
    if not isinstance(payload, dict):
        raise InvalidRequest("payload must be a JSON object.")
    admit_json(payload, what="payload is malformed", max_bytes=payload_max_bytes())
    with InstanceHeld(instance_id, actor) as run:
        _release_waiting(run, _waiting(run, token_id, WaitKind.EXTERNAL), payload)


def _uncertain_token(run, operation_key: str) -> Token:
    token = next(
        (
            t
            for t in run.active.values()
            if t.operation_key == operation_key and t.state == TokenState.OUTCOME_UNKNOWN
        ),
        None,
    )
    if token is None:
        raise EngineConflict("This step is not waiting for a decision on its outcome.")
    return token


def handoff_request(
    *, instance_id: int, token_id: int, kind: str, rationale: str, actor, evidence=(), checks=None
) -> Any:
    """Ask for a decision on an ``outcome_unknown`` step; the action's checks must be answered."""
    if actor is None or not actor.has_perm("engine.operate_instance"):
        raise NotPermitted(
            f"{actor} may not ask for decisions on steps: the permission "
            "'engine.operate_instance' is required."
        )
    token = step_get(instance_id=instance_id, token_id=token_id)
    if token is None or token.state != TokenState.OUTCOME_UNKNOWN:
        raise EngineConflict("Only a step whose outcome is unknown takes a decision.")
    if kind == DecisionKind.CANCEL and token.instance.status == InstanceStatus.CANCELLED:
        raise EngineConflict(CANCELLED_ALREADY)
    node = spec_of(token.instance.definition).nodes[token.node_id]
    action = registry.get(node.get("action", ""))
    required = [c.id for c in action.checks] if action else []
    return decision_request(
        operation_key=token.operation_key,
        kind=kind,
        rationale=rationale,
        requested_by=actor,
        evidence=evidence,
        checks=checks,
        required_checks=required,
    )


def handoff_approve(*, decision_id: int, actor) -> Any:
    """Approve a decision and move the step, in one commit.

    *Effect confirmed* completes the step without calling the provider again; *effect
    absent* marks it failed with a deliberate retry available (new operation key, same
    idempotency key); *cancel* cancels the instance.
    """
    decision = decision_get(decision_id=decision_id)
    if decision is None:
        raise InvalidRequest(f"No decision has id {decision_id}.")
    instance_id = int(decision.operation.subject_id)
    with InstanceHeld(instance_id, actor) as run:
        token = _uncertain_token(run, decision.operation.key)
        cancelled = run.instance.status == InstanceStatus.CANCELLED
        if cancelled and decision.kind == DecisionKind.CANCEL:
            raise EngineConflict(CANCELLED_ALREADY)
        try:
            with run.commit():
                approved = decision_approve(decision_id=decision_id, approved_by=actor)
                if cancelled:  # record what happened; a cancelled instance goes nowhere
                    settle_after_cancel(run, token, approved)
                    return approved
                router = Router(run)
                if approved.kind == DecisionKind.EFFECT_CONFIRMED:
                    run.update_token(
                        token,
                        TokenState.OUTCOME_UNKNOWN,
                        state=TokenState.COMPLETED,
                        reason=f"effect confirmed by decision {approved.pk}",
                    )
                    run.active.pop(token.pk, None)
                    leave_or_block(run, token)
                elif approved.kind == DecisionKind.EFFECT_ABSENT:
                    run.update_token(
                        token,
                        TokenState.OUTCOME_UNKNOWN,
                        state=TokenState.FAILED,
                        reason=f"effect absent (decision {approved.pk}); a "
                        "deliberate retry is available",
                    )
                    run.flush(
                        router,
                        status=InstanceStatus.BLOCKED,
                        reason="Effect absent: retry the step or cancel the instance.",
                    )
                else:
                    for other in list(run.active.values()):
                        run.update_token(other, other.state, state=TokenState.CANCELLED)
                        run.active.pop(other.pk)
                    run.flush(
                        router,
                        status=InstanceStatus.CANCELLED,
                        reason=f"Cancelled by decision {approved.pk}.",
                    )
                enqueue_advance(instance_id)
        except ChainBroken as exc:
            incident_open(verification=exc.result)
            raise
    return approved


def handoff_reject(*, decision_id: int, actor, note: str) -> Any:
    """Reject a requested decision; the step keeps waiting for a decision."""
    return decision_reject(decision_id=decision_id, rejected_by=actor, note=note)


def handoff_withdraw(*, decision_id: int, actor) -> Any:
    """The requester withdraws their decision; the step keeps waiting for a decision."""
    return decision_withdraw(decision_id=decision_id, withdrawn_by=actor)


def settle_after_cancel(run, token: Token, approved) -> None:
    """Move the step of a cancelled instance as the approved decision says (inside the
    approval's commit): confirmed → completed, absent → failed. Nothing is routed or
    queued, and the instance stays cancelled."""
    confirmed = approved.kind == DecisionKind.EFFECT_CONFIRMED
    run.update_token(
        token,
        TokenState.OUTCOME_UNKNOWN,
        state=TokenState.COMPLETED if confirmed else TokenState.FAILED,
        reason=f"effect {'confirmed' if confirmed else 'absent'} by decision {approved.pk}, "
        "after the instance was cancelled",
    )
    run.active.pop(token.pk, None)
    run.flush(status=InstanceStatus.CANCELLED, reason=run.instance.reason)
