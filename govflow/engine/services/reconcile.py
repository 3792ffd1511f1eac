"""The reconciliation ladder: an uncertain step is put to its provider before a person.

When a step turns ``outcome_unknown`` and its action can be asked (a ``reconcile`` hook,
automatic verification checks), the step also waits for the ladder (``wait_kind``
``reconcile``, ``not_before`` now: ``answers.ladder_wait``). The loop (``runtime``) and
the sweep find it due like a backoff, by the database clock; nothing sleeps in a worker.
One rung, under the instance lease:

1. The step's input is built again from the variables and must hash to the operation's
   recorded input fingerprint; otherwise the provider is not asked (a different input is
   a different effect: ``InputFingerprintMismatch``) and the ladder stops.
2. The provider's ``reconcile`` and the automatic checks are called outside any
   transaction, with the step's idempotency key and phase ``reconcile``.
3. One commit: every answer is kept as chained evidence on the operation
   (``recovery.api.observation_record``, marked as the provider's), then
   - a conclusive answer of an action with ``reconcile_settles=True`` settles the step
     on the provider's authority: succeeded → ``effect_confirmed`` and the normal
     success path with its output; failed → ``effect_absent``, a deliberate retry
     available;
   - a conclusive answer otherwise stays a finding: the operator's decision is
     pre-filled from it and a second person approves it;
   - no conclusive answer: asked again after ``reconcile_backoff`` * 2^n seconds, up to
     ``reconcile_budget`` asks; then the case is the operator's alone.

An operator can ask again at any time (``handoffs.services.desk.handoff_ask_provider``,
through :func:`provider_ask` under the instance's lease); their asks are kept the same way
and do not use up the budget.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from recovery.api import FingerprintKind as FK
from recovery.api import (
    InputFingerprintMismatch,
    ObservationKind,
    OperationState,
    fingerprint_value,
    observation_record,
    operation_get,
    operation_observe,
    provider_findings,
)

from ..db import clock
from ..errors import EngineConflict, InvalidRequest
from ..linked import step_action
from ..models import InstanceStatus, Token, TokenState, WaitKind
from ..registry import ActionDefinition
from ..results import ActionContext, Failed, Succeeded, Unknown
from ..variables import MissingVariable, build_input
from .answers import answer_values
from .dispatch import context_for
from .routing import after_seconds
from .run import Run
from .settle import MAX_DELAY, result_admitted, succeed

__all__ = ["Asked", "ladder_due", "ladder_step", "provider_ask"]

log = logging.getLogger("govflow.engine")

NO_WAIT = {"wait_kind": "", "not_before": None}


@dataclass(frozen=True)
class Asked:
    """What one ask found: the reconcile's outcome (or ``""`` without a hook), how many
    checks answered, and whether the provider's word settled the step."""

    outcome: str
    checks: int
    settled: bool


def ladder_due(run: Run) -> Token | None:
    """The uncertain step whose provider is due to be asked now, or None (reads).

    No statement unless a step of this run waits for the ladder.
    """
    waiting = [
        t.pk
        for t in run.active.values()
        if t.state == TokenState.OUTCOME_UNKNOWN
        and t.wait_kind == WaitKind.RECONCILE
        and t.pk not in run.blocked
    ]
    if not waiting:
        return None
    due = (
        Token.objects.filter(
            pk__in=waiting,
            state=TokenState.OUTCOME_UNKNOWN,
            wait_kind=WaitKind.RECONCILE,
            not_before__lte=clock(),
        )
        .order_by("ordinal")
        .values_list("pk", flat=True)
        .first()
    )
    return None if due is None else run.active[due]


def ladder_step(run: Run, token: Token) -> None:
    """One rung of the ladder for ``token`` (owns its commits; the calls are outside)."""
    try:
        provider_ask(run, token, asked_by=None)
    except (InputFingerprintMismatch, InvalidRequest, EngineConflict) as exc:
        run.blocked.add(token.pk)  # not again in this run
        with run.commit():
            run.update_token(
                token,
                TokenState.OUTCOME_UNKNOWN,
                reason=f"{token.reason} The provider was not asked: {exc}"[:2000],
                **NO_WAIT,
            )


def provider_ask(run: Run, token: Token, *, asked_by) -> Asked:
    """Check, ask the provider, keep what it said and apply the policy (owns its commits).

    ``asked_by`` is the operator who asked, or None for the engine's own ladder.
    """
    node = run.spec.nodes[token.node_id]
    action = step_action(node)
    if action is None or not action.asks_provider:
        raise InvalidRequest(
            f"The provider of step '{token.node_id}' has no reconcile hook and no automatic "
            "check: it cannot be asked. Look the effect up by hand and record a decision."
        )
    operation = operation_get(key=token.operation_key)
    if operation is None or operation.state != OperationState.OUTCOME_UNKNOWN:
        raise EngineConflict(f"Step '{token.node_id}' is no longer waiting on its provider.")
    input_value = _recorded_input(run, token, node, operation.input_fp)
    access = {**(run.instance.access or {}), "tenant": run.instance.tenant}
    context = context_for(
        run, token, node, action, input_value, access, token.idempotency_key, "reconcile"
    )
    with run.kept_alive():
        result, findings = _call(action, context)
    with run.commit():
        for check_id, finding in findings:
            observation_record(
                key=operation.key,
                kind=ObservationKind.CHECK,
                source=check_id,
                outcome="finding",
                values={"finding": finding},
                asked_by=asked_by,
            )
        if result is None:
            if run.instance.status != InstanceStatus.CANCELLED:
                _next_rung(run, token, action, asked_by, conclusive=False)
            return Asked("", len(findings), False)
        return _settle_or_keep(
            run, token, node, action, operation.key, result, input_value, asked_by
        )


def _recorded_input(run: Run, token: Token, node, input_fp: str) -> Any:
    """The step's input rebuilt from the variables; it must be the recorded one."""
    try:
        input_value = build_input(node.get("input", {}), run.variables)
    except MissingVariable as exc:
        raise InputFingerprintMismatch(
            f"Step '{token.node_id}' cannot be reconciled: its input needs the variable "
            f"'{exc.path}', which is no longer set, so it would not be the recorded input. "
            "Nothing was asked or recorded."
        ) from None
    if fingerprint_value(FK.INPUT, input_value) != input_fp:
        raise InputFingerprintMismatch(
            f"The input of step '{token.node_id}' changed since it was dispatched; asking "
            "the provider about it would be asking about a different effect. Nothing was "
            "asked or recorded: look the effect up by hand and record a decision."
        )
    return input_value


def _call(action: ActionDefinition, context: ActionContext):
    """The provider's reconcile answer (None without a hook) and the automatic checks'
    findings. Outside any transaction; a provider that raises answered nothing."""
    result = None
    if action.reconcile is not None:
        try:
            result = result_admitted(action.reconcile(context), action)
        except Exception as exc:
            log.warning("reconcile of %s raised %s", action.name, type(exc).__name__)
            result = Unknown(f"the provider's reconcile raised {type(exc).__name__}")
    findings = []
    for check in action.checks:
        if check.automatic is None:
            continue
        try:
            finding = str(check.automatic(context))[:2000]
        except Exception as exc:
            finding = f"the automatic check raised {type(exc).__name__}"
        findings.append((check.id, finding))
    return result, findings


def _settle_or_keep(run, token, node, action, key, result, input_value, asked_by) -> Asked:
    """Keep the reconcile's answer and apply the action's policy (needs the commit)."""
    outcome, values, reason = answer_values(result)
    conclusive = isinstance(result, (Succeeded, Failed))
    # A cancelled instance goes nowhere: there the answer is evidence for the person who
    # records what happened (its case stays open), whatever the action's policy.
    cancelled = run.instance.status == InstanceStatus.CANCELLED
    settles = conclusive and action.reconcile_settles and not cancelled
    observation = observation_record(
        key=key,
        kind=ObservationKind.RECONCILE,
        source="reconcile",
        outcome=outcome,
        values=values,
        reason=reason,
        input=input_value,
        asked_by=asked_by,
        applied=settles,
    )
    if settles and isinstance(result, Succeeded):
        why = f"effect confirmed by the provider's reconcile (finding {observation.pk})"
        extra = {**NO_WAIT, "reason": why}
        expected = TokenState.OUTCOME_UNKNOWN
        succeed(run, token, node, key, result, expected=expected, extra=extra, by="provider")
    elif settles:
        _absent_by_provider(run, token, key, result, observation.pk)
    elif not cancelled:
        _next_rung(run, token, action, asked_by, conclusive=conclusive, found=observation)
    return Asked(outcome, 0, settles)


def _absent_by_provider(run: Run, token: Token, key: str, result: Failed, finding: int) -> None:
    """The provider says the effect did not happen, and its word settles (needs the
    commit): as an approved *effect absent* would, with a deliberate retry available."""
    run.update_token(
        token,
        TokenState.OUTCOME_UNKNOWN,
        state=TokenState.FAILED,
        reason=f"effect absent by the provider's reconcile (finding {finding}): "
        f"{result.reason}; a deliberate retry is available"[:2000],
        **NO_WAIT,
    )
    run.flush(
        status=InstanceStatus.BLOCKED,
        reason="Effect absent (the provider's reconcile): retry the step or cancel the instance.",
    )
    operation_observe(
        key=key,
        state=OperationState.EFFECT_ABSENT,
        fence=run.fence,
        result={"reason": str(result.reason), "permanent": bool(result.permanent)},
        projection_fp=run.carry_projection(),
        by="provider",
    )


FOUND = {
    "succeeded": "found that the effect happened",
    "failed": "found that the effect did not happen",
}


def _next_rung(run, token, action, asked_by, *, conclusive: bool, found=None) -> None:
    """After an ask that did not settle the step (needs the commit): say what was found,
    and schedule the next ask while the budget lasts (the engine's asks only)."""
    if conclusive:
        _say(
            run,
            token,
            f"the provider's reconcile {FOUND[found.outcome]} (finding {found.pk}): an "
            "operator records the decision pre-filled from it, and a second person "
            "approves it.",
        )
        return
    if asked_by is not None:
        return  # an operator's ask leaves the engine's schedule as it was
    asked = sum(
        1
        for f in provider_findings(token.operation_key)
        if f.asked_by_id is None and f.kind == ObservationKind.RECONCILE
    )
    if action.reconcile is not None and asked < action.reconcile_budget:
        delay = min(action.reconcile_backoff * (2.0 ** min(asked - 1, 32)), MAX_DELAY)
        run.update_token(token, TokenState.OUTCOME_UNKNOWN, not_before=after_seconds(delay))
        return
    said = (
        f"was asked {asked} time(s) and could not say whether the effect happened"
        if action.reconcile is not None
        else "cannot be asked whether the effect happened; its automatic checks' findings are shown"
    )
    _say(
        run,
        token,
        f"the provider {said}: an operator must record effect confirmed or effect absent "
        "with evidence, and a second person approves it.",
    )


ASKED = " Asked the provider: "
"""Where what the ladder found begins in a step's reason (after why it is uncertain)."""


def _say(run: Run, token: Token, found: str) -> None:
    """Stop the ladder and say what it found, after why the step is uncertain (needs the
    commit)."""
    message = f"{token.reason.split(ASKED)[0]}{ASKED}{found}"[:2000]
    run.update_token(token, TokenState.OUTCOME_UNKNOWN, reason=message, **NO_WAIT)
    run.flush(status=InstanceStatus.BLOCKED, reason=message)
