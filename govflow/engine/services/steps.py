"""One step of one token: a released wait, or a module action — and what comes next.

Each function here takes a step as far as it goes and returns the loop's next move
(``dispatch.Next``): a :class:`~.dispatch.Chain` when the step's last commit also recorded
the next step's dispatch, a :class:`~.dispatch.Defer` when it planned the next step but
left it for a commit of its own, or None. The only place a provider is called is
:func:`call_and_settle` (and an atomic action's ``execute``, inside its commit).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from recovery.api import IntegrityViolation, RecoveryMode, operation_record

from ..models import Token, TokenState
from ..registry import ActionDefinition
from ..results import ActionContext, Failed, Succeeded, Unknown
from .blocking import block, chained_refusal_kept, leave_or_block, stop_for_integrity
from .dispatch import (
    Chain,
    ChainedDispatchRefused,
    Defer,
    Next,
    Plan,
    StepRejected,
    dispatch,
    dispatch_next,
    plan_action,
)
from .linked import linked_look
from .linked_watch import is_linked_start
from .load import run_reload
from .routing import RouteError
from .run import Run
from .settle import output_refusal, retry_or_fail, settle, succeed
from .writes import ROUTE_INCIDENT, rows_held

__all__ = ["call_and_settle", "run_chained", "run_token"]

log = logging.getLogger("govflow.engine")


def run_token(run: Run, token: Token, prepared: Next = None) -> Next:
    """Take ``token``'s step (owns its commits). ``prepared`` is what the step before
    returned: a :class:`Defer` for this token is used instead of planning again."""
    node = run.spec.nodes[token.node_id]
    try:
        if node["type"] == "action":
            deferred = prepared if isinstance(prepared, Defer) else None
            return run_action(run, token, node, deferred)
        if node["type"] == "linked_run":
            # Its start is dispatched like an action; its watch only looks (``linked``).
            if is_linked_start(node, token):
                return run_action(run, token, node)
            return linked_look(run, token, node)
        return complete_wait(run, token, node)
    except RouteError as exc:
        block(run, token, ROUTE_INCIDENT, f"The workflow cannot continue: {exc}.")
        return None


def run_chained(run: Run, chained: Chain) -> Next:
    """Call the provider of the step whose dispatch the previous commit recorded, then
    settle it (owns its commit; the call is outside any)."""
    return call_and_settle(run, chained.plan)


def complete_wait(run: Run, token: Token, node: Mapping[str, Any]) -> Next:
    """A released wait (timer fired, message delivered, approval given) moves on.

    Owns its commit, which also records the next step's dispatch when it can.
    """
    try:
        with run.commit():
            # Only a delivered payload (message, approval, external result) is output: a
            # start or timer node writes nothing, so it cannot clobber a variable named like it.
            if token.payload is not None:
                run.apply_output(token.node_id, node.get("output"), token.payload)
            # The move rides in the flush's statement with the next step and the instance
            # (ADR 0044), as a step's success does.
            run.update_token(token, TokenState.READY, later=True, state=TokenState.COMPLETED)
            run.active.pop(token.pk, None)
            # The step routed next waits for the dispatch's statement, as after a success
            # (ADR 0047, 0053); sent alone when no dispatch takes it (``write_held``).
            with rows_held(run):
                leave_or_block(run, token)
            next_step = dispatch_next(run)
    except ChainedDispatchRefused as refused:
        # The next step's dispatch was refused: complete this wait again without it; the
        # loop then dispatches that step in its own commit, where the refusal stops it
        # (a broken chain's by the incident opened now).
        chained_refusal_kept(run, refused.cause)
        run.no_chain = True
        run_reload(run)
        return None
    return next_step


def run_action(
    run: Run, token: Token, node: Mapping[str, Any], deferred: Defer | None = None
) -> Next:
    """Plan (or take the deferred plan of) a module action, then run it (owns its
    commits). A step rejected before dispatch blocks the instance."""
    try:
        if deferred is not None and deferred.token_pk == token.pk:
            # Planned while the previous commit was open and left for its own commit.
            if deferred.refusal is not None:
                raise deferred.refusal
            plan = deferred.plan
        else:
            plan = plan_action(run, token, node)
    except StepRejected as exc:
        block(run, token, exc.kind, str(exc))
        return None
    if plan.action.recovery_mode == RecoveryMode.ATOMIC:
        run_atomic(run, plan)
        return None
    return run_non_atomic(run, plan)


def run_non_atomic(run: Run, plan: Plan) -> Next:
    """Commit 1 (the dispatch boundary), the provider call, commit 2 (``settle``).

    Owns its commits. Nothing is called before commit 1 commits; the ledger refuses it
    while an integrity incident is open or the effect is already in flight, unknown or
    done (invariant I12).
    """
    try:
        with run.commit():
            dispatch(run, plan)
    except IntegrityViolation as exc:
        stop_for_integrity(run, plan.token, exc)
        return None
    return call_and_settle(run, plan)


def _call(action: ActionDefinition, context: ActionContext):
    fn = action.poll if context.phase == "poll" and action.poll else action.execute
    return fn(context)


def call_and_settle(run: Run, plan: Plan) -> Next:
    """Call the provider of a dispatched step (outside any transaction), then settle it
    (its own commit). Returns what ``settle`` returns."""
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
    return settle(run, plan.token, plan.node, plan.action, plan.key, result)


class _RollBack(Exception):
    pass


def run_atomic(run: Run, plan: Plan) -> None:
    """An atomic action: the ledger record, the provider's writes and the projection in
    one commit (owns it); if anything fails, all of it rolls back and the step is
    retryable (I5), recorded in a commit of its own."""
    token, node, action, key = plan.token, plan.node, plan.action, plan.key
    failure: Any = None
    try:
        with run.commit():
            operation_record(**plan.record)
            result = action.execute(plan.context)
            if not isinstance(result, Succeeded):
                failure = result
                raise _RollBack
            refusal = output_refusal(action, result.output)
            if refusal:  # rolled back with the action's writes: nothing happened
                failure = Failed(f"{refusal}; rolled back", permanent=False)
                raise _RollBack
            extra = {"operation_key": key, "idempotency_key": plan.idem}
            succeed(run, token, node, key, result, expected=TokenState.READY, extra=extra)
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
    with run.commit():
        retry_or_fail(run, token, action, failure, expected=TokenState.READY, operation=None)
