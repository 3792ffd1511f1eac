"""``bench.noop``: a non-atomic action whose effect is nothing at all.

Non-atomic, so every step pays the engine's full price: the dispatch-boundary commit, the
provider call outside any transaction, and the settling commit.
"""

from __future__ import annotations

from govflow.engine.provider import ActionDefinition, Succeeded, Unknown, VerificationCheck

SCHEMA = {"type": "object", "additionalProperties": True}


def _preview(data):
    return {}


def _execute(context):
    return Succeeded({})


def _reconcile(context):
    return Unknown("a no-op leaves nothing to look up")


NOOP = ActionDefinition(
    name="bench.noop",
    recovery_mode="non_atomic",
    title="Do nothing (benchmark)",
    input_schema=SCHEMA,
    preview=_preview,
    execute=_execute,
    reconcile=_reconcile,
    checks=(VerificationCheck("nothing", "A no-op has no effect to look for."),),
    retry_budget=0,
    retry_backoff=1.0,
)
