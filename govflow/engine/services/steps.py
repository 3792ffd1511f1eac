"""One step of one token: wait nodes that were released, and module actions."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jsonschema
from django.contrib.auth import get_user_model

from recovery.api import (
    CanonicalError,
    ChainConflict,
    FingerprintKind,
    IntegrityViolation,
    OperationState,
    RecoveryMode,
    Subject,
    canonical_bytes,
    fingerprint_value,
    idempotency_key,
    input_guard,
    operation_get,
    operation_key,
    operation_observe,
    operation_record,
)

from ..dialect import clock
from ..limits import payload_max_bytes
from ..models import InstanceStatus, KeptAnswer, Token, TokenState, WaitKind
from ..projection import SUBJECT_TYPE
from ..registry import ActionDefinition, registry
from ..results import ActionContext, Failed, Pending, Succeeded, Unknown
from ..variables import MissingVariable, apply_output, build_input
from .routing import RouteError, Router, after_seconds
from .runtime import (
    KEPT_NOTE,
    Run,
    block,
    integrity_stop_message,
    lease_ttl,
    leave_or_block,
)

log = logging.getLogger("govflow.engine")


class StepRejected(Exception):
    """The step cannot be dispatched; nothing was recorded. The message says what to fix."""

    def __init__(self, kind: str, message: str) -> None:
        self.kind = kind
        super().__init__(message)


def subject_of(run: Run) -> Subject:
    return run.subject


def run_token(run: Run, token: Token) -> None:
    node = run.spec.nodes[token.node_id]
    try:
        if node["type"] == "action":
            run_action(run, token, node)
        else:
            complete_wait(run, token, node)
    except RouteError as exc:
        block(run, token, "route", f"The workflow cannot continue: {exc}.")


def run_chained(run: Run) -> None:
    """Call the provider of the step whose dispatch the previous commit recorded."""
    plan, run.chained = run.chained, None
    call_and_settle(run, plan)


def complete_wait(run: Run, token: Token, node: Mapping[str, Any]) -> None:
    """A released wait (timer fired, message delivered, approval given) moves on."""
    try:
        with run.commit():
            # Only a delivered payload (message, approval, external result) is output: a
            # start or timer node writes nothing, so it cannot clobber a variable named like it.
            if token.payload is not None:
                apply_output(run.variables, token.node_id, node.get("output"), token.payload)
            run.update_token(token, TokenState.READY, state=TokenState.COMPLETED)
            run.active.pop(token.pk, None)
            leave_or_block(run, token)
            chained = dispatch_next(run)
            run.release_if_ended()
    except IntegrityViolation as exc:
        if not getattr(exc, "in_chained_dispatch", False):
            raise
        # The next step's dispatch was refused: complete this wait again without it; the
        # loop then dispatches that step in its own commit, where the refusal stops it.
        run.no_chain = True
        run.reload()
        return
    run.chained = chained


def access_context(run: Run) -> dict[str, Any]:
    """The access context a step runs under, revalidated before every dispatch."""
    access = dict(run.instance.access or {})
    access["tenant"] = run.instance.tenant
    user_id = access.get("started_by")
    if user_id is not None:
        user = get_user_model().objects.filter(pk=user_id).only("is_active").first()
        if user is None or not user.is_active:
            raise StepRejected(
                "access_revoked",
                f"The user who started this instance (id {user_id}) is no "
                "longer active, so its steps no longer have authority. An "
                "operator may cancel the instance or start it again.",
            )
    return access


def prepare(run: Run, token: Token, node: Mapping[str, Any], action: ActionDefinition):
    """Everything before the dispatch boundary; raises StepRejected (nothing recorded)."""
    if action.gated_by and not str(node.get(action.gated_by) or "").strip():
        raise StepRejected(
            "gate",
            f"Action {action.name} is {action.recovery_mode} and the "
            f"node pins no '{action.gated_by}'; it was not dispatched.",
        )
    try:
        input_value = build_input(node.get("input", {}), run.variables)
    except MissingVariable as exc:
        raise StepRejected(
            "input",
            f"Step '{token.node_id}' needs the variable "
            f"'{exc.path}', which is not set. Set it (or fix the "
            "definition's input mapping); nothing was "
            "dispatched.",
        ) from None
    errors = sorted(
        jsonschema.Draft202012Validator(action.input_schema).iter_errors(input_value),
        key=lambda e: list(e.path),
    )
    if errors:
        detail = "; ".join(
            f"{'.'.join(map(str, e.path)) or '(input)'}: {e.message}" for e in errors[:5]
        )
        raise StepRejected(
            "input",
            f"The input of step '{token.node_id}' violates the "
            f"schema of {action.name}: {detail}. Nothing was dispatched.",
        )
    try:
        canonical_bytes(input_value)
        preview = action.preview(input_value)
        canonical_bytes(preview)
    except CanonicalError as exc:
        raise StepRejected("input", f"Step '{token.node_id}': {exc}") from None
    except Exception as exc:  # a provider bug before dispatch: nothing happened outside
        log.warning("preview of %s raised %s", action.name, type(exc).__name__)
        raise StepRejected(
            "preview",
            f"The preview of {action.name} for step "
            f"'{token.node_id}' raised {type(exc).__name__}; "
            "nothing was dispatched. Fix the provider or the "
            "input; the step is tried again later.",
        ) from None
    return input_value, preview, access_context(run)


def context_for(run, token, node, action, input_value, access, idem, phase) -> ActionContext:
    return ActionContext(
        action=action.name,
        input=input_value,
        idempotency_key=idem,
        tenant=run.instance.tenant,
        access=access,
        instance_id=run.instance.pk,
        step_id=token.node_id,
        attempt=token.attempt,
        poll=token.poll,
        phase=phase,
        backup_ref=node.get("backup_ref"),
        approval_ref=node.get("approval_ref"),
    )


@dataclass
class Plan:
    """Everything a step's dispatch needs, computed before anything is recorded."""

    token: Token
    node: Mapping[str, Any]
    action: ActionDefinition
    record: dict[str, Any]
    key: str
    idem: str
    context: ActionContext


def plan_action(run: Run, token: Token, node: Mapping[str, Any]) -> Plan:
    """Check and prepare a step for dispatch; raises StepRejected (nothing recorded)."""
    action = registry.get(node["action"])
    if action is None:
        raise StepRejected(
            "action_missing",
            f"No installed provider registers {node['action']}; install its module.",
        )
    input_value, preview, access = prepare(run, token, node, action)
    definition_fp = run.definition_fp  # re-hashed from the stored definition, not copied
    input_fp = fingerprint_value(FingerprintKind.INPUT, input_value)
    if token.idempotency_key:
        previous = operation_get(key=token.operation_key)
        if previous is not None and previous.input_fp != input_fp:
            raise StepRejected(
                "input_changed",
                f"The input of step '{token.node_id}' changed since its first attempt; "
                "retrying it would be a different effect. Cancel the instance or restore "
                "the variables.",
            )
        idem = token.idempotency_key
    else:
        idem = idempotency_key(
            definition_fp=definition_fp,
            step_id=token.node_id,
            action=action.name,
            input_fp=input_fp,
            nonce=f"{run.instance.pk}:{token.ordinal}",
        )
    nonce = f"{run.instance.pk}:{token.ordinal}:{token.attempt}:{token.poll}"
    record = dict(
        subject=subject_of(run),
        step_id=token.node_id,
        action=action.name,
        recovery_mode=action.recovery_mode,
        definition_fp=definition_fp,
        input_fp=input_fp,
        preview_fp=fingerprint_value(FingerprintKind.PREVIEW, preview),
        access_fp=fingerprint_value(FingerprintKind.ACCESS_CONTEXT, access),
        idempotency_fp=fingerprint_value(FingerprintKind.IDEMPOTENCY_KEY, idem),
        nonce=nonce,
        ordinal=token.attempt + token.poll,
        fence=run.fence,
    )
    key = operation_key(
        definition_fp=definition_fp,
        step_id=token.node_id,
        action=action.name,
        input_fp=input_fp,
        nonce=nonce,
    )
    phase = "poll" if token.poll else "execute"
    context = context_for(run, token, node, action, input_value, access, idem, phase)
    return Plan(token, node, action, record, key, idem, context)


def run_action(run: Run, token: Token, node: Mapping[str, Any]) -> None:
    deferred, run.deferred = run.deferred, None
    try:
        if deferred is not None and deferred[0] == token.pk:
            # Planned while the previous commit was open and left for its own commit.
            if isinstance(deferred[1], StepRejected):
                raise deferred[1]
            plan = deferred[1]
        else:
            plan = plan_action(run, token, node)
    except StepRejected as exc:
        block(run, token, exc.kind, str(exc))
        return
    if plan.action.recovery_mode == RecoveryMode.ATOMIC:
        run_atomic(run, plan)
    else:
        run_non_atomic(run, plan)


def dispatch(run: Run, plan: Plan) -> None:
    """The dispatch boundary's writes (inside the caller's step commit)."""
    run.update_token(
        plan.token,
        TokenState.READY,
        state=TokenState.EXECUTING,
        operation_key=plan.key,
        idempotency_key=plan.idem,
        not_before=None,
        wait_kind="",
    )
    operation_record(**plan.record, projection_fp=run.carry_projection())


def dispatch_next(run: Run) -> Plan | None:
    """Record the next step's dispatch in the commit that made it ready, when it can.

    Called inside a step commit that just completed a step. When the next step to run is
    a non-atomic action whose checks pass, its dispatch boundary (token ``executing`` +
    ledger operation) joins this commit, so a chain of steps costs one commit per step:
    the observation of step k and the dispatch of step k+1 are made durable together.
    Anything less plain (another kind of node, an atomic action, a backoff, a step that
    would be rejected, no budget left in this run) is left ready for the run's loop,
    which handles it in its own commits as before.
    """
    if not run.may_chain():
        return None
    ready = [
        t for t in run.active.values() if t.state == TokenState.READY and t.pk not in run.blocked
    ]
    if not ready:
        return None
    token = min(ready, key=lambda t: t.ordinal)
    node = run.spec.nodes[token.node_id]
    if token.not_before is not None or node["type"] != "action":
        return None
    action = registry.get(node["action"])
    if action is None or action.recovery_mode == RecoveryMode.ATOMIC:
        return None
    began = time.monotonic()
    try:
        plan = plan_action(run, token, node)
    except StepRejected as exc:
        # Not here: blocking is its own commit, made by the loop with this very reason
        # (the preview is not asked twice).
        run.deferred = (token.pk, exc)
        return None
    if time.monotonic() - began > lease_ttl() / 10:
        # A slow preview: the lease is renewed before this step is dispatched, in its own
        # commit, so the commit now open (another step's outcome) is not put at risk.
        run.deferred = (token.pk, plan)
        return None
    try:
        dispatch(run, plan)
    except IntegrityViolation as exc:
        exc.in_chained_dispatch = True  # the caller redoes its own commit without it
        raise
    return plan


def _call(action: ActionDefinition, context: ActionContext):
    fn = action.poll if context.phase == "poll" and action.poll else action.execute
    return fn(context)


def run_non_atomic(run: Run, plan: Plan) -> None:
    # Commit 1: the dispatch boundary. Nothing is called before it commits; the ledger
    # refuses it while an integrity incident is open or the effect is already in flight,
    # unknown or done (invariant I12).
    try:
        with run.commit():
            dispatch(run, plan)
    except IntegrityViolation as exc:
        stop_for_integrity(run, plan.token, exc)
        return
    call_and_settle(run, plan)


def stop_for_integrity(run: Run, token: Token, exc: IntegrityViolation, note: str = "") -> None:
    """The ledger refused a step for integrity: stop the instance for people, say why.

    The refused commit rolled back, so the run's view is read again first; the incident
    is opened (or found) outside any transaction so that it stays.
    """
    log.error("instance %s, step '%s': %s", run.instance.pk, token.node_id, exc)
    run.reload()
    message = integrity_stop_message(run, exc)
    block(run, run.active.get(token.pk, token), "integrity", f"{message}{note}"[:2000])


def call_and_settle(run: Run, plan: Plan) -> None:
    """Call the provider of a dispatched step (outside any transaction), then settle."""
    try:
        with run.kept_alive():
            result = _call(plan.action, plan.context)
    except Exception as exc:  # the effect may have happened: never guess
        log.warning(
            "action %s raised after dispatch (%s): outcome unknown",
            plan.action.name,
            type(exc).__name__,
        )
        result = Unknown(f"the provider raised {type(exc).__name__} after dispatch")
    settle(run, plan.token, plan.node, plan.action, plan.key, result)


def run_atomic(run: Run, plan: Plan) -> None:
    token, node, action, key = plan.token, plan.node, plan.action, plan.key
    failure: Any = None
    try:
        with run.commit():
            operation_record(**plan.record)
            result = action.execute(plan.context)
            if not isinstance(result, Succeeded):
                failure = result
                raise _RollBack
            _succeed(
                run,
                token,
                node,
                key,
                result,
                expected=TokenState.READY,
                extra={"operation_key": key, "idempotency_key": plan.idem},
            )
            run.release_if_ended()
        return
    except _RollBack:
        pass
    except IntegrityViolation as exc:
        # Refused before or at success: rolled back, so nothing happened.
        stop_for_integrity(run, token, exc)
        return
    except Exception as exc:  # rolled back: nothing happened, so it is retryable
        log.warning("atomic action %s raised %s; rolled back", action.name, type(exc).__name__)
        failure = Failed(f"raised {type(exc).__name__}; rolled back", permanent=False)
    if not isinstance(failure, Failed):
        failure = Failed(
            f"an atomic action must succeed or fail, not return "
            f"{type(failure).__name__}; rolled back",
            permanent=False,
        )
    _retry_or_fail(run, token, action, failure, expected=TokenState.READY, operation=None)


class _RollBack(Exception):
    pass


SETTLE_ATTEMPTS = 3


def settle(run, token, node, action, key, result) -> None:
    """Commit 2 of a non-atomic step: the observation and the projection together.

    The provider has answered, so this commit must not be lost to a benign race: if
    another writer appended to the instance's chain first (a decision requested on
    another step, say: ``ChainConflict``), the run's view is reloaded under the same fence
    and the commit is made again. Anything else that refuses it (a stale fence) ends the
    run as before, and rehydration decides the step.
    """
    if isinstance(result, Succeeded):
        # The output becomes variables: the same guard as every other way in. The effect
        # did happen, so an output that cannot be kept is an unknown outcome, never lost.
        try:
            input_guard(dict(result.output), max_bytes=payload_max_bytes())
        except CanonicalError as exc:
            result = Unknown(
                "the provider reported success with an output that is not JSON the engine "
                f"can keep ({exc.path}: {exc.problem})"
            )
        except (TypeError, ValueError):
            result = Unknown("the provider reported success with an output that is not JSON")
    if isinstance(result, Pending) and _poll_delay(result) is None:
        result = Unknown(
            f"the provider answered pending with poll_after="
            f"{result.poll_after!r}, not a number of seconds"
        )
    for attempt in range(1, SETTLE_ATTEMPTS + 1):
        try:
            _settle_commit(run, token, node, action, key, result)
            return
        except IntegrityViolation as exc:
            if getattr(exc, "in_chained_dispatch", False) and not run.no_chain:
                # Only the next step's dispatch was refused: record this outcome without
                # it; the loop then stops at that step in its own commit.
                run.no_chain = True
                token = _reloaded(run, token)
                continue
            # The outcome itself was refused (a success while an incident is open or the
            # chain is broken). The provider really answered: keep the answer for when
            # the incident is resolved, never turn it into outcome_unknown.
            keep_answer(run, token, key, result)
            stop_for_integrity(run, token, exc, KEPT_NOTE)
            return
        except ChainConflict:
            if attempt == SETTLE_ATTEMPTS:
                raise
            log.info(
                "instance %s: the chain moved during step '%s'; recording its outcome again",
                run.instance.pk,
                token.node_id,
            )
            token = _reloaded(run, token)


def _reloaded(run: Run, token: Token) -> Token:
    """Read the run again after a refused commit; the step must still be executing."""
    run.reload()
    fresh = run.active.get(token.pk)
    if fresh is None or fresh.state != TokenState.EXECUTING:
        from ..errors import EngineConflict

        raise EngineConflict(
            f"Step '{token.node_id}' (#{token.ordinal}) is no longer executing; someone else "
            "settled it. Nothing was changed."
        )
    return fresh


def keep_answer(run: Run, token: Token, key: str, result: Any) -> None:
    """Keep a provider's answer that could not be recorded now (its own commit)."""
    values: dict[str, Any] = {"instance_id": run.instance.pk, "token_id": token.pk}
    if isinstance(result, Succeeded):
        values.update(outcome=KeptAnswer.Outcome.SUCCEEDED, output=dict(result.output))
    elif isinstance(result, Failed):
        values.update(
            outcome=KeptAnswer.Outcome.FAILED,
            reason=str(result.reason)[:2000],
            permanent=bool(result.permanent),
        )
    elif isinstance(result, Pending):
        values.update(outcome=KeptAnswer.Outcome.PENDING, poll_after=_poll_delay(result))
    else:
        values.update(
            outcome=KeptAnswer.Outcome.UNKNOWN, reason=str(getattr(result, "reason", ""))[:2000]
        )
    KeptAnswer.objects.get_or_create(operation_key=key, defaults={**values, "received_at": clock()})


def settle_kept(run: Run, token: Token, key: str) -> bool:
    """Settle a dispatched step with the provider's kept answer; False if none was kept."""
    kept = KeptAnswer.objects.filter(operation_key=key, applied_at__isnull=True).first()
    if kept is None:
        return False
    node = run.spec.nodes[token.node_id]
    action = registry.get(node.get("action", ""))
    if action is None:
        return False  # rehydration decides: the provider is gone
    outcome = KeptAnswer.Outcome
    if kept.outcome == outcome.SUCCEEDED:
        result: Any = Succeeded(kept.output or {})
    elif kept.outcome == outcome.FAILED:
        result = Failed(kept.reason, permanent=kept.permanent)
    elif kept.outcome == outcome.PENDING:
        result = Pending(poll_after=kept.poll_after or 0)
    else:
        result = Unknown(kept.reason or "the provider's kept answer was not conclusive")
    log.info("instance %s: recording the kept answer for step '%s'", run.instance.pk, key)
    settle(run, token, node, action, key, result)
    KeptAnswer.objects.filter(pk=kept.pk).update(applied_at=clock())
    return True


def _settle_commit(run, token, node, action, key, result) -> None:
    chained = None
    with run.commit():
        if isinstance(result, Succeeded):
            _succeed(run, token, node, key, result, expected=TokenState.EXECUTING)
            chained = dispatch_next(run)
        elif isinstance(result, Failed):
            _retry_or_fail(run, token, action, result, expected=TokenState.EXECUTING, operation=key)
        elif isinstance(result, Pending):
            run.update_token(
                token,
                TokenState.EXECUTING,
                state=TokenState.READY,
                poll=token.poll + 1,
                wait_kind=WaitKind.POLL,
                not_before=after_seconds(_poll_delay(result)),
                reason="the provider is working on it; polling again later",
            )
            run.flush(Router(run))  # waiting, unless another branch can run now
            operation_observe(
                key=key,
                state=OperationState.PENDING,
                fence=run.fence,
                projection_fp=run.carry_projection(),
            )
        else:
            reason = (
                result.reason
                if isinstance(result, Unknown)
                else (f"the provider returned {type(result).__name__}, not a result")
            )
            _unknown(run, token, key, reason)
        run.release_if_ended()
    run.chained = chained


MAX_DELAY = 86400.0
"""Longest backoff or poll delay in seconds: doubling must not overflow a date-time."""


def _poll_delay(result: Pending) -> float | None:
    try:
        delay = float(result.poll_after)
    except (TypeError, ValueError):
        return None
    if math.isnan(delay):
        return None
    return min(max(0.0, delay), MAX_DELAY)


def _succeed(run, token, node, key, result: Succeeded, *, expected: str, extra=None) -> None:
    """The projection's writes first, then the observation that carries their fingerprint
    (one commit either way: the order only saves a checkpoint)."""
    output = dict(result.output)
    apply_output(run.variables, token.node_id, node.get("output"), output)
    run.update_token(token, expected, state=TokenState.COMPLETED, reason="", **(extra or {}))
    run.active.pop(token.pk, None)
    leave_or_block(run, token)
    operation_observe(
        key=key,
        state=OperationState.SUCCEEDED,
        fence=run.fence,
        result=output,
        projection_fp=run.carry_projection(),
    )


def _unknown(run, token, key, reason: str) -> None:
    message = (
        f"Outcome unknown: {reason}. The effect may or may not have happened; an "
        "operator must record effect confirmed or effect absent with evidence."
    )
    run.update_token(
        token, TokenState.EXECUTING, state=TokenState.OUTCOME_UNKNOWN, reason=message[:2000]
    )
    run.flush(Router(run), status=InstanceStatus.BLOCKED, reason=message[:2000])
    operation_observe(
        key=key,
        state=OperationState.OUTCOME_UNKNOWN,
        fence=run.fence,
        projection_fp=run.carry_projection(),
    )


def _retry_or_fail(run, token, action, failure: Failed, *, expected, operation) -> None:
    with run.commit():
        if operation is not None:
            operation_observe(
                key=operation,
                state=OperationState.FAILED,
                fence=run.fence,
                result={"permanent": failure.permanent},
            )
        reason = str(failure.reason)[:500]
        if not failure.permanent and token.attempt < action.retry_budget:
            delay = min(action.retry_backoff * (2.0 ** min(token.attempt, 64)), MAX_DELAY)
            run.update_token(
                token,
                expected,
                state=TokenState.READY,
                attempt=token.attempt + 1,
                wait_kind=WaitKind.RETRY,
                not_before=after_seconds(delay),
                reason=f"transient failure ({reason}); retry in {delay:g} s",
            )
            run.flush(Router(run))
            return
        why = (
            "permanent failure"
            if failure.permanent
            else (f"retry budget of {action.retry_budget} exhausted")
        )
        message = f"Step '{token.node_id}' failed ({why}): {reason}"
        run.update_token(token, expected, state=TokenState.FAILED, reason=message)
        run.active.pop(token.pk, None)
        run.incident(token, "step_failed", message)
        run.flush(Router(run), status=InstanceStatus.FAILED, reason=message)
        run.release_if_ended()


def settle_from_operation(run, token, operation) -> None:
    """A token left executing whose operation already ended (should not happen): block."""
    block(
        run,
        token,
        "inconsistent",
        f"Step '{token.node_id}' was left executing while its operation {operation.key} "
        f"is {operation.state}. An operator must look at it before anything moves on.",
    )


__all__ = [
    "SUBJECT_TYPE",
    "StepRejected",
    "run_chained",
    "run_token",
    "settle_from_operation",
    "subject_of",
]
