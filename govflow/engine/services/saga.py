"""Compensations (the saga): planned at their trigger, run in reverse, through the ledger.

The protocol, at its one home (docs/compensation.md):

1. **Planned once, at the trigger.** ``saga_plan`` records one compensation intent per
   succeeded original whose node's ``compensate_on`` names the trigger (``cancel`` in the
   cancel's own commit; ``failure`` in the first run after the instance failed;
   ``operator`` when a person asks), together with an ``engine.compensations_planned``
   fact. A trigger is planned once; rehydration never plans, so recovery never infers a
   missing compensation. The ledger refuses a second intent for the same original.
2. **Run in reverse.** ``saga_run`` takes the intents highest position first (the reverse
   of the order the originals succeeded in) and stops at the first that is not done: one
   awaiting an approval, one that failed or whose outcome is unknown (a handoff).
3. **The dispatch protocol.** Each compensation's input is rebuilt from the original's
   kept input and output (proved against the ledger's fingerprints) and must fingerprint
   to the intent's; then its ``cmp-`` operation crosses the dispatch boundary in a commit
   of its own, on the run's fence, only while its approval's binding holds
   (``compensation_dispatch``); then the provider is called outside any transaction; then
   its answer is recorded. An ``Unknown`` or invalid answer, an exception or a crash
   after the dispatch leaves it ``outcome_unknown``: never called again, never guessed.
4. **Pending is polled.** A ``Pending`` answer is recorded ``pending`` with the time of
   the next poll, and the instance is marked runnable for then (one commit); the run
   then stops there. Each poll is a new ``cmp-`` operation with the same idempotency
   key (``compensation_poll``), dispatched in its own commit before the provider's
   ``poll`` is called; the delay doubles per poll, and past ``Compensate.poll_budget``
   polls a ``Pending`` answer is an unknown outcome (``saga_polls``).
5. After a crash before the dispatch the same intent is used: same key, same input.

The instance has ended when its saga runs (cancelled or failed): these commits change no
variable and no step, only the ledger, under the instance's lease.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from recovery.api import (
    ChainBroken,
    CompensationDrift,
    CompensationRefused,
    CompensationView,
    DispatchRefused,
    FingerprintKind,
    IntegrityViolation,
    OperationState,
    compensation_dispatch,
    compensation_poll,
    compensation_record,
    compensations_of,
    fact_append,
    facts_read,
    fingerprint_value,
    idempotency_key,
    incident_open,
    operation_observe,
    operations_of,
    schema_validator,
)

from ..compensable import CompensableEffect, compensation_input, source_problem
from ..db import engine_commit
from ..emit import compensation_recorded
from ..models import InstanceStatus
from ..queue import instance_mark_runnable
from ..registry import ActionDefinition, registry
from ..results import ActionContext, Failed, Succeeded
from ..variables import MissingVariable
from .run import Run
from .saga_polls import poll_due_or_marked, poll_later
from .settle import result_admitted

__all__ = [
    "DONE",
    "PLANNED_FACT",
    "saga_due",
    "saga_enqueue_if_due",
    "saga_plan",
    "saga_plan_on_cancel",
    "saga_run",
]

log = logging.getLogger("govflow.engine")

S = OperationState
DONE = frozenset({S.SUCCEEDED, S.EFFECT_CONFIRMED})
PLANNED_FACT = "engine.compensations_planned"
TRIGGER_OF = {InstanceStatus.CANCELLED: "cancel", InstanceStatus.FAILED: "failure"}


class _NotPlanned(Exception):
    """One original cannot be compensated now; the reason is a short code."""


def planned_triggers(run: Run) -> set[str]:
    """The triggers already planned for this instance (reads its chain's facts)."""
    return {fact.get("trigger", "") for fact in facts_read(subject=run.subject, kind=PLANNED_FACT)}


def _declared(run: Run, trigger: str) -> Iterable[tuple[Any, dict]]:
    """The succeeded originals whose node asks for compensation on ``trigger`` (reads)."""
    for operation in operations_of(run.subject).filter(state__in=list(DONE)):
        if operation.key.startswith("cmp-"):
            continue
        node = run.spec.nodes.get(operation.step_id)
        when = (node or {}).get("compensate_on") or []
        if when and (trigger == "operator" or trigger in when):
            yield operation, node


def saga_plan(run: Run, trigger: str) -> list[str]:
    """Record the compensation intents ``trigger`` asks for; return their keys.

    Needs the caller's commit, under the instance's lease. A trigger already planned
    plans nothing (except ``operator``, which plans whatever is eligible and not yet
    compensated). Originals that cannot be compensated (no kept input, a missing action)
    are listed in the planned fact with the reason, for the desk.
    """
    if trigger != "operator" and trigger in planned_triggers(run):
        return []
    keys: list[str] = []
    skipped: list[list[str]] = []
    compensated = {view.original_key for view in compensations_of(run.subject)}
    for operation, _node in _declared(run, trigger):
        if operation.key in compensated:
            continue
        try:
            keys.append(_record(run, operation, trigger).key)
        except _NotPlanned as exc:
            log.warning("compensation of %s not planned: %s", operation.key, exc)
            skipped.append([operation.key, str(exc)])
    fact = {"trigger": trigger, "compensations": keys, "skipped": skipped}
    fact_append(subject=run.subject, kind=PLANNED_FACT, fact=fact)
    return keys


def _compensating(original) -> tuple[ActionDefinition, Any]:
    action = registry.get(original.action)
    spec = action.compensate if action is not None else None
    target = registry.get(spec.action) if spec is not None else None
    if target is None:
        raise _NotPlanned("its compensating action is not registered")
    return target, spec


def _built(run: Run, original) -> tuple[ActionDefinition, Any, dict, dict]:
    """The compensating action, its policy, input and preview for ``original`` (reads)."""
    target, spec = _compensating(original)
    effect = CompensableEffect.objects.filter(operation_key=original.key).first()
    problem = source_problem(effect, original)
    if problem:
        raise _NotPlanned(problem)
    try:
        input_value = compensation_input(spec, effect)
    except MissingVariable as exc:
        raise _NotPlanned(f"the original has no '{exc.path}' for its compensation") from None
    errors = list(schema_validator(target.input_schema).iter_errors(input_value))
    if errors:
        raise _NotPlanned(f"its compensation's input violates {target.name}: {errors[0].message}")
    try:
        preview = target.preview(input_value)
    except Exception as exc:  # a provider bug before dispatch: nothing happened outside
        raise _NotPlanned(f"the preview of {target.name} raised {type(exc).__name__}") from None
    return target, spec, input_value, preview


def _keys(run: Run, original, target: ActionDefinition, input_fp: str) -> str:
    return idempotency_key(
        definition_fp=run.definition_fp,
        step_id=original.step_id,
        action=target.name,
        input_fp=input_fp,
        nonce=f"compensation:{original.key}",
    )


def _access(run: Run) -> dict[str, Any]:
    return {**dict(run.instance.access or {}), "tenant": run.instance.tenant}


def _record(run: Run, original, trigger: str) -> CompensationView:
    target, spec, input_value, preview = _built(run, original)
    input_fp = fingerprint_value(FingerprintKind.INPUT, input_value)
    idem = _keys(run, original, target, input_fp)
    try:
        view = compensation_record(
            original_key=original.key,
            action=target.name,
            recovery_mode=target.recovery_mode,
            definition_fp=run.definition_fp,
            input_fp=input_fp,
            preview_fp=fingerprint_value(FingerprintKind.PREVIEW, preview),
            access_fp=fingerprint_value(FingerprintKind.ACCESS_CONTEXT, _access(run)),
            idempotency_fp=fingerprint_value(FingerprintKind.IDEMPOTENCY_KEY, idem),
            tenant=run.instance.tenant,
            trigger=trigger,
            approval=spec.approval,
            fence=run.fence,
        )
    except CompensationRefused as exc:
        raise _NotPlanned(exc.reason) from None
    compensation_recorded(
        run, key=view.key, original=original.key, action=target.name, trigger=trigger
    )
    return view


def declares(run: Run, trigger: str | None = None) -> bool:
    """Whether any node of the definition is compensated (on ``trigger``, if given)."""
    return any(
        "compensate_on" in node and (trigger is None or trigger in node["compensate_on"])
        for node in run.spec.nodes.values()
    )


def saga_due(run: Run) -> bool:
    """Whether the ended instance has a trigger still to plan (reads)."""
    trigger = TRIGGER_OF.get(run.instance.status)
    return trigger is not None and declares(run, trigger) and trigger not in planned_triggers(run)


def saga_enqueue_if_due(run: Run | None) -> None:
    """Queue the run that plans and runs an ended instance's compensations (own commit).

    Called after a run whose instance failed: the commit that failed it released the
    lease, so its saga runs in a run of its own (``instance_run`` of an ended instance).
    """
    if run is not None and run.instance.status == InstanceStatus.FAILED and saga_due(run):
        with engine_commit():
            instance_mark_runnable(run.instance.pk)


def saga_plan_on_cancel(run: Run) -> bool:
    """In the cancel's own commit: plan the compensations on cancel and queue their run.

    Needs the caller's commit; returns whether anything is to run.
    """
    if not declares(run, "cancel"):
        return False
    if saga_plan(run, "cancel"):
        instance_mark_runnable(run.instance.pk)
        return True
    return False


def saga_run(run: Run) -> int:
    """Plan a due trigger, then run the compensations in reverse order (owns its commits).

    For an ended instance, under its lease. Returns how many compensations were called.
    Stops at the first compensation that is not done and cannot run now.
    """
    if not declares(run) or run.integrity_problem():
        return 0  # no new effect while an integrity incident is open (I12)
    try:
        return _run_in_reverse(run)
    except IntegrityViolation as exc:
        # The ended instance stays as it is; the ledger's refusal stops its saga here.
        if isinstance(exc, ChainBroken):
            incident_open(verification=exc.result)  # after the refused commit rolled back
        log.error("instance %s: compensations stopped for integrity: %s", run.instance.pk, exc)
        return 0


def _run_in_reverse(run: Run) -> int:
    """Plan a due trigger, then each compensation in turn (owns its commits)."""
    if saga_due(run):
        with engine_commit():
            saga_plan(run, TRIGGER_OF[run.instance.status])
    called = 0
    for view in compensations_of(run.subject):
        if view.state in DONE:
            continue
        if view.state == S.DISPATCHED:
            # A previous holder dispatched it and never recorded the answer: unknown.
            with engine_commit():
                operation_observe(key=view.key, state=S.OUTCOME_UNKNOWN, fence=run.fence)
            return called
        if view.state == S.PENDING:
            # Its provider is working on it: polled when due (its mark brings it back).
            if not poll_due_or_marked(run, view) or not _poll_and_call(run, view):
                return called
            called += 1
            continue
        if view.state != S.PREPARED or view.awaiting_approval:
            return called  # failed, unknown, or waiting for a person: a handoff
        if not _dispatch_and_call(run, view):
            return called
        called += 1
    return called


def _dispatch_and_call(run: Run, view: CompensationView) -> bool:
    """Dispatch one prepared compensation and record its answer; False when it stopped."""
    original = next(op for op in operations_of(run.subject).filter(key=view.original_key))
    try:
        target, _spec, input_value, preview = _built(run, original)
    except _NotPlanned as exc:
        log.warning("compensation %s cannot be rebuilt: %s", view.key, exc)
        return False
    input_fp = fingerprint_value(FingerprintKind.INPUT, input_value)
    try:
        with engine_commit():
            outcome = compensation_dispatch(
                key=view.key,
                fence=run.fence,
                tenant=run.instance.tenant,
                input_fp=input_fp,
                preview_fp=fingerprint_value(FingerprintKind.PREVIEW, preview),
            )
    except CompensationDrift:
        return False  # it needs an approval first
    if isinstance(outcome, DispatchRefused):
        log.warning("instance %s: %s", run.instance.pk, outcome.message)
        return False
    context = _context(run, original, target, input_value, view.step_id, poll=0)
    return _settle(run, view.key, _call(run, target, context), original, polls=0)


def _poll_and_call(run: Run, view: CompensationView) -> bool:
    """Poll one pending compensation: its next operation dispatched (own commit), its
    provider's ``poll`` asked, its answer recorded; False when the saga stops here."""
    original = next(op for op in operations_of(run.subject).filter(key=view.original_key))
    try:
        target, _spec, input_value, _preview = _built(run, original)
    except _NotPlanned as exc:  # nothing is asked: it stays pending, visibly
        log.warning("compensation %s cannot be rebuilt to poll it: %s", view.key, exc)
        return False
    with engine_commit():
        polled = compensation_poll(key=view.key, fence=run.fence)
    context = _context(run, original, target, input_value, view.step_id, poll=view.polls + 1)
    return _settle(run, polled.key, _call(run, target, context), original, polls=view.polls + 1)


def _context(run: Run, original, target, input_value, step_id: str, *, poll: int):
    input_fp = fingerprint_value(FingerprintKind.INPUT, input_value)
    return ActionContext(
        action=target.name,
        input=input_value,
        idempotency_key=_keys(run, original, target, input_fp),
        tenant=run.instance.tenant,
        access=_access(run),
        instance_id=run.instance.pk,
        step_id=step_id,
        attempt=0,
        poll=poll,
        phase="poll" if poll else "execute",
    )


def _call(run: Run, target: ActionDefinition, context: ActionContext):
    fn = target.poll if context.phase == "poll" and target.poll else target.execute
    try:
        with run.kept_alive():
            return result_admitted(fn(context), target)
    except Exception as exc:  # the effect may have happened: never guess
        log.warning("compensation %s raised after dispatch: %s", target.name, type(exc).__name__)
        return None


def _settle(run: Run, key: str, result, original, *, polls: int) -> bool:
    """Record a compensation's answer (own commit): only a success lets the saga go on."""
    if isinstance(result, Succeeded):
        state, value = S.SUCCEEDED, dict(result.output)
    elif isinstance(result, Failed):
        state, value = S.FAILED, {"reason": result.reason}
    elif poll_later(run, key, result, _compensating(original)[1], polls=polls):
        return False  # pending: recorded with its next poll's time
    else:  # Unknown, an invalid answer, an exception, or pending past its budget
        state, value = S.OUTCOME_UNKNOWN, None
    with engine_commit():
        operation_observe(key=key, state=state, fence=run.fence, result=value)
    return state == S.SUCCEEDED
