"""The handoff desk: human approvals, external tasks, and decisions on uncertain steps.

Each is a place where the engine waits for someone. These services record what that
someone did and move the step, under the instance's lease, in one commit. (Before the
handoffs app this module was ``govflow/engine/services/waits.py``.)
"""

from __future__ import annotations

from typing import Any

from govflow.engine.errors import EngineConflict, InvalidRequest, NotPermitted
from govflow.engine.limits import admit_json, admit_text, payload_max_bytes
from govflow.engine.linked import step_action
from govflow.engine.models import InstanceStatus, Token, TokenState, WaitKind
from govflow.engine.outputs import output_problems, result_schema
from govflow.engine.queue import instance_mark_runnable
from govflow.engine.selectors import step_get
from govflow.engine.services.definitions import spec_of
from govflow.engine.services.instances import InstanceHeld
from govflow.engine.services.linked import LINKED_DECISION_REFUSED
from govflow.engine.services.reconcile import Asked, provider_ask
from govflow.engine.services.routing import Router
from govflow.engine.services.settle import complete_with_output
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
    "handoff_ask_provider",
    "handoff_reject",
    "handoff_request",
    "handoff_withdraw",
    "result_schema_of",
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
        instance_mark_runnable(run.instance.pk)


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
    *,
    instance_id: int,
    token_id: int,
    kind: str,
    rationale: str,
    actor,
    evidence=(),
    checks=None,
    result: dict[str, Any] | None = None,
) -> Any:
    """Ask for a decision on an ``outcome_unknown`` step; the action's checks must be answered.

    *Effect confirmed* carries ``result``: the values a success of the step would have
    returned, as its node's output mapping needs them and its action's output schema types
    them (:func:`result_schema_of`); a result missing one, or with one that fails the
    schema, is refused naming them. *Effect absent* and *cancel* carry none.
    """
    if actor is None or not actor.has_perm("engine.operate_instance"):
        raise NotPermitted(
            f"{actor} may not ask for decisions on steps: the permission "
            "'engine.operate_instance' is required."
        )
    token = step_get(instance_id=instance_id, token_id=token_id)
    if token is not None and token.wait_kind == WaitKind.LINKED:
        # The other module's publication outcome is its own to settle (I11).
        raise EngineConflict(LINKED_DECISION_REFUSED)
    if token is None or token.state != TokenState.OUTCOME_UNKNOWN:
        raise EngineConflict("Only a step whose outcome is unknown takes a decision.")
    if kind == DecisionKind.CANCEL and token.instance.status == InstanceStatus.CANCELLED:
        raise EngineConflict(CANCELLED_ALREADY)
    node = spec_of(token.instance.definition).nodes[token.node_id]
    action = step_action(node)
    required = [c.id for c in action.checks] if action else []
    return decision_request(
        operation_key=token.operation_key,
        kind=kind,
        rationale=rationale,
        requested_by=actor,
        evidence=evidence,
        checks=checks,
        required_checks=required,
        result=result,
        result_schema=result_schema_of(action, node),
        result_max_bytes=payload_max_bytes(),
    )


def result_schema_of(action, node) -> dict[str, Any]:
    """The schema an *effect confirmed* result of ``node`` must satisfy (reads nothing)."""
    return result_schema(action.output_schema if action else None, node.get("output"))


def handoff_approve(*, decision_id: int, actor, result_fp: str | None = None) -> Any:
    """Approve a decision and move the step, in one commit.

    *Effect confirmed* completes the step with the decision's result, applied through the
    node's output mapping exactly as a provider's success would be (the provider is not
    called again), and routes on; *effect absent* marks it failed with a deliberate retry
    available (new operation key, same idempotency key); *cancel* cancels the instance.
    ``result_fp`` is the fingerprint of the result the approver was shown: a decision
    carrying another is not approved.
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
        node = run.spec.nodes[token.node_id]
        if decision.kind == DecisionKind.EFFECT_CONFIRMED:
            _still_fits(decision, step_action(node), node)
        try:
            with run.commit():
                approved = decision_approve(
                    decision_id=decision_id, approved_by=actor, result_fp=result_fp
                )
                if cancelled:  # record what happened; a cancelled instance goes nowhere
                    settle_after_cancel(run, token, approved)
                    return approved
                _apply_decision(run, token, node, approved)
                instance_mark_runnable(instance_id)
        except ChainBroken as exc:
            incident_open(verification=exc.result)
            raise
    return approved


def _still_fits(decision, action, node) -> None:
    """Refuse a confirmed result the step's current output schema no longer accepts."""
    problems = output_problems(result_schema_of(action, node), decision.result or {})
    if not problems:
        return
    if decision.result is None:  # requested before confirmed decisions carried results
        why = "it carries no result, and the step's output is needed by what follows"
    else:
        why = "the provider changed the action's output schema since the request"
    raise InvalidRequest(
        f"Decision {decision.pk} cannot complete the step ({'; '.join(problems)}): {why}. "
        "Nothing was approved: reject it and request effect confirmed again with the "
        "step's result."
    )


def _apply_decision(run, token: Token, node, approved) -> None:
    """Move the step as the approved decision says (needs the caller's commit)."""
    if approved.kind == DecisionKind.EFFECT_CONFIRMED:
        complete_with_output(
            run,
            token,
            node,
            dict(approved.result or {}),
            expected=TokenState.OUTCOME_UNKNOWN,
            reason=f"effect confirmed by decision {approved.pk}",
        )
    elif approved.kind == DecisionKind.EFFECT_ABSENT:
        run.update_token(
            token,
            TokenState.OUTCOME_UNKNOWN,
            state=TokenState.FAILED,
            reason=f"effect absent (decision {approved.pk}); a deliberate retry is available",
        )
        run.flush(
            Router(run),
            status=InstanceStatus.BLOCKED,
            reason="Effect absent: retry the step or cancel the instance.",
        )
    else:
        for other in list(run.active.values()):
            run.update_token(other, other.state, state=TokenState.CANCELLED)
            run.active.pop(other.pk)
        run.flush(
            Router(run),
            status=InstanceStatus.CANCELLED,
            reason=f"Cancelled by decision {approved.pk}.",
        )


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


def handoff_ask_provider(*, instance_id: int, token_id: int, actor) -> Asked:
    """An operator asks the provider about an uncertain step now ("Ask the provider now").

    Under the instance's lease, like every operator change; raises ``EngineConflict``
    while a worker holds it or when the step is no longer uncertain, and
    ``InputFingerprintMismatch`` when its input changed (nothing is asked or recorded).
    What the provider says is kept as its evidence and follows the action's policy
    (``govflow.engine.services.reconcile``).
    """
    if actor is None or not actor.has_perm("engine.operate_instance"):
        raise NotPermitted(
            f"{actor} may not ask providers about steps: the permission "
            "'engine.operate_instance' is required."
        )
    with InstanceHeld(instance_id, actor) as run:
        token = run.active.get(token_id)
        if token is None or token.state != TokenState.OUTCOME_UNKNOWN:
            raise EngineConflict("Only a step whose outcome is unknown can be reconciled.")
        asked = provider_ask(run, token, asked_by=actor)
    if asked.settled:
        instance_mark_runnable(instance_id)  # the step moved: a worker takes the instance on
    return asked
