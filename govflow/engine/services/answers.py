"""A provider's answer as evidence: its kept form, late answers, the ladder's first wait.

An answer that arrives when it can no longer move its step — the step turned
``outcome_unknown`` meanwhile, someone decided it, or the worker's fence lapsed during the
call — is never dropped: :func:`late_answer_keep` stores it on its operation as a late
observation (``recovery.api.observation_record``), chained and shown on the handoff page,
never applied by itself. :func:`ladder_wait` is what a step that turns ``outcome_unknown``
writes so that the engine asks its provider first (``services.reconcile``).
"""

from __future__ import annotations

import logging
from typing import Any

from recovery.api import ObservationKind, observation_record

from ..db import clock
from ..models import Token, WaitKind
from ..registry import ActionDefinition
from ..results import Failed, Pending, Succeeded

__all__ = ["answer_values", "ladder_wait", "late_answer_keep"]

log = logging.getLogger("govflow.engine")


def answer_values(result: Any) -> tuple[str, dict[str, Any], str]:
    """``(outcome, values, reason)`` of a provider's result, as an observation keeps it."""
    if isinstance(result, Succeeded):
        return "succeeded", dict(result.output), ""
    if isinstance(result, Failed):
        return "failed", {"permanent": bool(result.permanent)}, str(result.reason)[:2000]
    if isinstance(result, Pending):
        return (
            "pending",
            {},
            f"the provider is still working on it (poll after {result.poll_after})",
        )
    reason = getattr(result, "reason", None)
    if reason is None:
        reason = f"the provider returned {type(result).__name__}, not a result"
    return "unknown", {}, str(reason)[:2000]


def late_answer_keep(key: str, token: Token, result: Any, why: str) -> None:
    """Keep an answer its step could not take any more as a late observation (own commit).

    Never raises: the caller is already handling the refusal that made it late, and that
    refusal is what its run reports. A late answer that contradicts a recorded decision
    opens an integrity incident (``recovery.api.observation_record``).
    """
    outcome, values, reason = answer_values(result)
    try:
        observation_record(
            key=key,
            kind=ObservationKind.LATE,
            source="poll" if token.poll else "execute",
            outcome=outcome,
            values=values,
            reason=reason,
        )
    except Exception:  # evidence is kept when it can be; the refusal still ends the run
        log.exception("could not keep the late answer for operation %s", key)
        return
    log.warning("operation %s: the provider's answer arrived late (%s); it is kept", key, why)


def ladder_wait(action: ActionDefinition | None) -> dict[str, Any]:
    """The token fields of a step turning ``outcome_unknown`` whose provider is asked first.

    Written in the same statement as the state change, so the ladder costs the hot path
    nothing; an action with no reconcile hook and no automatic check gets none.
    """
    if action is None or not action.asks_provider or action.reconcile_budget < 1:
        return {}
    return {"wait_kind": WaitKind.RECONCILE, "not_before": clock()}
