"""Settling a step: what its provider answered (or did not), written with the projection.

``settle`` is commit 2 of a non-atomic step (protocol step 5 in ``runtime``): the
observation in the ledger and the token, next tokens and variables together — and, when
it can, the next step's dispatch (``dispatch.dispatch_next``), which it returns as the
loop's next move. ``rehydrate`` settles what a previous holder of the lease left
``executing`` (I10). Nothing here calls a provider.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from recovery.api import (
    CanonicalError,
    ChainConflict,
    ConflictError,
    IntegrityViolation,
    Observation,
    OperationState,
    input_guard,
    operation_observe,
)

from ..compensable import compensable_keep
from ..db import clock
from ..errors import EngineConflict
from ..limits import payload_max_bytes
from ..models import InstanceStatus, KeptAnswer, Token, TokenState, WaitKind
from ..outputs import output_problems
from ..registry import ActionDefinition
from ..results import Failed, Pending, Succeeded, Unknown
from .answers import ladder_wait, late_answer_keep
from .blocking import KEPT_NOTE, chained_refusal_kept, leave_or_block, stop_for_integrity
from .dispatch import Chain, ChainedDispatchRefused, Next, dispatch_next
from .linked_watch import is_linked_start, watch_begin
from .load import run_reload
from .reconnect import DROPPED, Reconnect
from .routing import after_seconds
from .run import Run
from .writes import ending_keep, held_take, rows_held

__all__ = [
    "MAX_DELAY",
    "complete_with_output",
    "keep_answer",
    "output_refusal",
    "result_admitted",
    "settle",
]

log = logging.getLogger("govflow.engine")

SETTLE_ATTEMPTS = 3

MAX_DELAY = 86400.0
"""Longest backoff or poll delay in seconds: doubling must not overflow a date-time."""


def settle(run: Run, token: Token, node, action: ActionDefinition, key: str, result) -> Next:
    """Commit 2 of a non-atomic step: the observation and the projection together.

    Owns its commit. The provider has answered, so a benign race must not lose it: after
    a chain append by another writer (``ChainConflict``, ``SETTLE_ATTEMPTS`` times) or a
    dropped database connection (``reconnect``: a fresh one, while the fence is current)
    the run's view is reloaded under the same fence and the commit is made again. A lost
    lease or an exhausted retry ends the run with the answer kept as a late observation.
    Returns what the loop does next.
    """
    result = result_admitted(result, action)
    try:
        return _settle_attempts(run, token, node, action, key, result)
    except ConflictError as exc:
        if not isinstance(exc, ChainConflict):
            # Too late to move the step (its fence lapsed, or it is outcome_unknown or
            # decided by now): the answer is evidence all the same, kept on its operation.
            late_answer_keep(key, token, result, type(exc).__name__)
        raise
    except DROPPED as exc:
        # The database stayed unreachable through every retry: keep it if it can be.
        late_answer_keep(key, token, result, f"no database connection ({type(exc).__name__})")
        raise


def _settle_attempts(run: Run, token: Token, node, action, key: str, result) -> Next:
    conflicts, reconnect, reload = 0, Reconnect(), False
    while True:
        try:
            if reload:
                token, reload = _reloaded(run, token), False
            return _settle_commit(run, token, node, action, key, result)
        except ChainedDispatchRefused as refused:
            # Only the next step's dispatch was refused: record this outcome without it;
            # the loop then stops at that step in its own commit (a broken chain's by the
            # incident opened now).
            chained_refusal_kept(run, refused.cause)
            run.no_chain, reload = True, True
        except IntegrityViolation as exc:
            # The outcome itself was refused (a success while an incident is open or the
            # chain is broken). The provider really answered: keep the answer for when
            # the incident is resolved, never turn it into outcome_unknown.
            keep_answer(run, token, key, result)
            stop_for_integrity(run, token, exc, KEPT_NOTE)
            return None
        except ChainConflict:
            conflicts += 1
            if conflicts >= SETTLE_ATTEMPTS:
                raise
            log.info(
                "instance %s: the chain moved during step '%s'; recording its outcome again",
                run.instance.pk,
                token.node_id,
            )
            reload = True
        except DROPPED as exc:
            if not reconnect.again(exc, str(run.instance.pk)):
                raise
            reload = True


def output_refusal(action: ActionDefinition, output: Any) -> str:
    """Why a success's ``output`` cannot become variables, or '' (the same guard as every
    other way in, then the action's output schema)."""
    try:
        input_guard(dict(output), max_bytes=payload_max_bytes())
    except CanonicalError as exc:
        return (
            "the provider reported success with an output that is not JSON the engine "
            f"can keep ({exc.path}: {exc.problem})"
        )
    except (TypeError, ValueError):
        return "the provider reported success with an output that is not JSON"
    problems = output_problems(action.output_schema, dict(output))
    if problems:
        return (
            "the provider reported success with an output that does not match the "
            f"action's output schema ({'; '.join(problems)[:500]})"
        )
    return ""


def result_admitted(result, action: ActionDefinition):
    """The provider's answer, or an unknown outcome when it cannot be kept as it is."""
    if isinstance(result, Succeeded):
        # The effect did happen, so an output that cannot be kept is an unknown outcome,
        # never lost: an operator confirms it with the values the output should have had.
        refusal = output_refusal(action, result.output)
        if refusal:
            return Unknown(refusal)
    if isinstance(result, Pending) and _poll_delay(result) is None:
        return Unknown(
            f"the provider answered pending with poll_after="
            f"{result.poll_after!r}, not a number of seconds"
        )
    return result


def _reloaded(run: Run, token: Token) -> Token:
    """Read the run again after a refused commit (reads); the step must still be
    executing."""
    run_reload(run)
    fresh = run.active.get(token.pk)
    if fresh is None or fresh.state != TokenState.EXECUTING:
        raise EngineConflict(
            f"Step '{token.node_id}' (#{token.ordinal}) is no longer executing; someone else "
            "settled it. Nothing was changed."
        )
    return fresh


def _settle_commit(run: Run, token: Token, node, action, key: str, result) -> Next:
    """One attempt of :func:`settle`'s commit (owns it)."""
    next_step: Next = None
    with run.commit():
        if isinstance(result, Succeeded):
            # Held back so that, when the next step is chained, both ledger writes go
            # together (one server call on PostgreSQL, ADR 0031); else written alone.
            observed = succeed(
                run, token, node, key, result, expected=TokenState.EXECUTING, held=True
            )
            # Nothing of this commit follows the chained dispatch: its call may be sent
            # as the whole commit (ADR 0051).
            next_step = dispatch_next(run, observed=observed, last=True)
            if not isinstance(next_step, Chain):
                # The rows held for a dispatch that did not come (ADR 0047) go in front of
                # the success's own call, or alone before it; when this commit ends the
                # instance, both go in the statement that releases the lease (ADR 0076).
                held = held_take(run)
                if not ending_keep(run, observed, held):
                    observed.write(first=held)
        elif isinstance(result, Failed):
            retry_or_fail(run, token, action, result, expected=TokenState.EXECUTING, operation=key)
        elif isinstance(result, Pending):
            _poll_later(run, token, key, result)
        else:
            reason = (
                result.reason
                if isinstance(result, Unknown)
                else (f"the provider returned {type(result).__name__}, not a result")
            )
            _unknown(run, token, key, reason, action)
    return next_step


def succeed(
    run,
    token,
    node,
    key,
    result: Succeeded,
    *,
    expected: str,
    extra=None,
    by: str = "",
    held: bool = False,
) -> Observation:
    """A step succeeded (needs the caller's commit): the projection's writes first, then
    the observation that carries their fingerprint (one commit either way: the order only
    saves a checkpoint). With ``by`` (``"provider"``: its reconcile settled an uncertain
    step) the operation becomes ``effect_confirmed`` on that authority. With ``held`` the
    observation is returned unwritten, and the step rows its routing writes are held
    (``run.held_rows``): the caller writes them in this commit, in front of the
    observation's own call (``write(first=held_take(run))``, ADR 0076) or with the next
    step's dispatch (``dispatch_next``, ADR 0047)."""
    output = dict(result.output)
    extra = dict(extra or {})
    reason = extra.pop("reason", "")
    run.success_follows = True  # an ending verifies its whole chain through it (ADR 0038)
    # Held too, the rows of the step routed next wait for the call that may dispatch it
    # (ADR 0047); the caller sends them with the observation when it does not. Not a
    # linked run's start: its watch step is moved by id right after its flush.
    try:
        with rows_held(run, held and not is_linked_start(node, token)):
            complete_with_output(
                run, token, node, output, expected=expected, reason=reason, extra=extra
            )
    finally:
        run.success_follows = False
    observation = Observation(
        key=key,
        state=OperationState.EFFECT_CONFIRMED if by else OperationState.SUCCEEDED,
        fence=run.fence,
        result=output,
        projection_fp=run.carry_projection(),
        by=by,
    )
    if not held:
        observation.write()
    return observation


def complete_with_output(
    run, token, node, output: dict[str, Any], *, expected: str, reason: str = "", extra=None
) -> None:
    """Complete a step with its output (needs the caller's commit): the node's output
    mapping into the variables, the step completed, the next steps routed.

    The one way a step's result becomes variables, whether a provider returned it
    (:func:`succeed`) or an operator confirmed it (``handoffs.services.desk``). A
    compensable action's input and output are kept first (``compensable``). A linked
    run's start is not routed on: its run is watched (``linked_watch``).
    """
    if is_linked_start(node, token):
        # A linked run's start: its output is the run's reference, not the node's result.
        watch_begin(run, token, node, output, expected=expected, reason=reason, extra=extra)
        return
    compensable_keep(run, token, node, output, key=(extra or {}).get("operation_key"))
    run.apply_output(token.node_id, node.get("output"), output)
    # The move rides in the flush's statement with the next step and the instance (0044).
    completed = {"state": TokenState.COMPLETED, "reason": reason, **(extra or {})}
    run.update_token(token, expected, later=True, **completed)
    run.active.pop(token.pk, None)
    leave_or_block(run, token)


def _poll_later(run: Run, token: Token, key: str, result: Pending) -> None:
    """The provider owns the outcome: poll it again later (needs the caller's commit)."""
    run.update_token(
        token,
        TokenState.EXECUTING,
        state=TokenState.READY,
        poll=token.poll + 1,
        wait_kind=WaitKind.POLL,
        not_before=after_seconds(_poll_delay(result)),
        reason="the provider is working on it; polling again later",
    )
    run.flush()  # waiting, unless another branch can run now
    operation_observe(
        key=key,
        state=OperationState.PENDING,
        fence=run.fence,
        projection_fp=run.carry_projection(),
    )


def _unknown(run: Run, token: Token, key: str, reason: str, action) -> None:
    """No conclusive answer after dispatch: outcome unknown (needs the caller's commit).

    An action whose provider can be asked (reconcile, automatic checks) is asked first:
    the step waits for the ladder (``services.reconcile``) as well as for an operator."""
    message = (
        f"Outcome unknown: {reason}. The effect may or may not have happened; an "
        "operator must record effect confirmed or effect absent with evidence."
    )
    run.update_token(
        token,
        TokenState.EXECUTING,
        state=TokenState.OUTCOME_UNKNOWN,
        reason=message[:2000],
        **ladder_wait(action),
    )
    run.flush(status=InstanceStatus.BLOCKED, reason=message[:2000])
    operation_observe(
        key=key,
        state=OperationState.OUTCOME_UNKNOWN,
        fence=run.fence,
        projection_fp=run.carry_projection(),
    )


def retry_or_fail(run, token, action, failure: Failed, *, expected, operation) -> None:
    """A conclusive failure (needs the caller's commit): ready again after a backoff while
    the retry budget lasts, or failed for good with an engine incident."""
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
        run.flush()
        return
    why = (
        "permanent failure"
        if failure.permanent
        else (f"retry budget of {action.retry_budget} exhausted")
    )
    message = f"Step '{token.node_id}' failed ({why}): {reason}"
    run.update_token(token, expected, state=TokenState.FAILED, reason=message)
    run.active.pop(token.pk, None)
    run.engine_incident_open(token, "step_failed", message)
    run.flush(status=InstanceStatus.FAILED, reason=message)


def _poll_delay(result: Pending) -> float | None:
    try:
        delay = float(result.poll_after)
    except (TypeError, ValueError):
        return None
    if math.isnan(delay):
        return None
    return min(max(0.0, delay), MAX_DELAY)


# -- answers kept while an integrity incident is open -----------------------------------


def keep_answer(run: Run, token: Token, key: str, result: Any) -> None:
    """Keep a provider's answer that could not be recorded now (owns its commit)."""
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
