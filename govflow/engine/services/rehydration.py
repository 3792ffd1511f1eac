"""Rehydration (invariant I10): what a previous holder of the lease left ``executing``.

``rehydrate`` runs first in every run and operator change, under the new lease: a step
that never crossed the dispatch boundary is ready again; a dispatched one is settled with
the provider's answer kept while an integrity incident stopped the instance, or else
becomes ``outcome_unknown`` (and, when its provider can be asked, waits for the
reconciliation ladder too). Moved out of ``settle`` as that module grew; nothing here
calls a provider.
"""

from __future__ import annotations

import logging
from typing import Any

from recovery.api import OperationState, OperationView, operation_get, operation_observe

from ..db import clock
from ..linked import step_action
from ..models import InstanceStatus, KeptAnswer, Token, TokenState
from ..results import Failed, Pending, Succeeded, Unknown
from .answers import ladder_wait
from .blocking import block
from .run import Run
from .settle import settle

__all__ = ["block_inconsistent", "rehydrate", "settle_kept"]

log = logging.getLogger("govflow.engine")


def settle_kept(run: Run, token: Token, key: str) -> bool:
    """Settle a dispatched step with the provider's kept answer; False if none was kept.

    Owns its commits (the settlement's, then marking the answer applied).
    """
    kept = KeptAnswer.objects.filter(operation_key=key, applied_at__isnull=True).first()
    if kept is None:
        return False
    node = run.spec.nodes[token.node_id]
    action = step_action(node)
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
    # Nothing is chained from here: rehydration runs before the run's step budget is set.
    settle(run, token, node, action, key, result)
    KeptAnswer.objects.filter(pk=kept.pk).update(applied_at=clock())
    return True


def rehydrate(run: Run) -> None:
    """Resolve tokens a previous holder left ``executing`` (invariant I10).

    Owns its commits, one per token. A dispatched step whose provider's answer was kept
    (it arrived while an integrity incident stopped the instance) is settled with that
    answer, never guessed unknown.
    """
    for token in [t for t in run.active.values() if t.state == TokenState.EXECUTING]:
        operation = operation_get(key=token.operation_key)
        dispatched = operation is not None and operation.state == OperationState.DISPATCHED
        if dispatched and settle_kept(run, token, operation.key):
            continue
        if operation is None or operation.state == OperationState.PREPARED:
            with run.commit():
                # Never crossed the dispatch boundary: no effect can have happened.
                run.update_token(
                    token,
                    TokenState.EXECUTING,
                    state=TokenState.READY,
                    attempt=token.attempt + 1,
                    operation_key="",
                    reason="resumed after a worker stopped before dispatch",
                )
                run.flush()
        elif dispatched:
            with run.commit():
                _unknown_after_restart(run, token, operation.key)
        else:
            block_inconsistent(run, token, operation)


def _unknown_after_restart(run: Run, token: Token, key: str) -> None:
    """A dispatched step its worker never settled (needs the caller's commit)."""
    message = (
        "The worker stopped after dispatching this action and before "
        "recording its outcome. The effect may or may not have happened: "
        "an operator must record effect confirmed or effect absent."
    )
    action = step_action(run.spec.nodes[token.node_id])
    run.update_token(
        token,
        TokenState.EXECUTING,
        state=TokenState.OUTCOME_UNKNOWN,
        reason=message,
        **ladder_wait(action),
    )
    run.flush(status=InstanceStatus.BLOCKED, reason=message)
    operation_observe(
        key=key,
        state=OperationState.OUTCOME_UNKNOWN,
        fence=run.fence,
        projection_fp=run.carry_projection(),
    )


def block_inconsistent(run: Run, token: Token, operation: OperationView) -> None:
    """Block a token left executing whose operation already ended (should not happen).

    Owns its commit (``block``). It settles nothing: an operator decides.
    """
    block(
        run,
        token,
        "inconsistent",
        f"Step '{token.node_id}' was left executing while its operation {operation.key} "
        f"is {operation.state}. An operator must look at it before anything moves on.",
    )
