"""Ledger operation states and the one table of allowed transitions.

Persisted values: never rename or reuse one. ``docs/recovery.md`` shows this table, and
``tests/unit/test_states.py`` enumerates it.
"""

from __future__ import annotations

from django.db import models


class OperationState(models.TextChoices):
    PREPARED = "prepared", "Prepared (held before the dispatch boundary)"
    DISPATCHED = "dispatched", "Dispatched"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    PENDING = "pending", "Pending (provider owns the outcome)"
    OUTCOME_UNKNOWN = "outcome_unknown", "Outcome unknown"
    EFFECT_CONFIRMED = "effect_confirmed", "Effect confirmed"
    EFFECT_ABSENT = "effect_absent", "Effect absent"


S = OperationState

TRANSITIONS: dict[str, frozenset[str]] = {
    # A prepared operation is held behind a gate; it either crosses the boundary or is
    # abandoned before it (failed), when nothing can have happened outside.
    S.PREPARED: frozenset({S.DISPATCHED, S.FAILED}),
    S.DISPATCHED: frozenset({S.SUCCEEDED, S.FAILED, S.PENDING, S.OUTCOME_UNKNOWN}),
    S.OUTCOME_UNKNOWN: frozenset({S.EFFECT_CONFIRMED, S.EFFECT_ABSENT}),
    # Terminal: a pending provider is polled by a *new* operation with the same
    # idempotency key, so a pending operation itself never moves again.
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset(),
    S.PENDING: frozenset(),
    S.EFFECT_CONFIRMED: frozenset(),
    S.EFFECT_ABSENT: frozenset(),
}

TERMINAL: frozenset[str] = frozenset(s for s, targets in TRANSITIONS.items() if not targets)
INITIAL: frozenset[str] = frozenset({S.PREPARED, S.DISPATCHED})


def can_transition(current: str, target: str) -> bool:
    return target in TRANSITIONS.get(current, frozenset())


class RecoveryMode(models.TextChoices):
    ATOMIC = "atomic", "Atomic (shares the engine's transaction)"
    NON_ATOMIC = "non_atomic", "Non-atomic (external effect)"
    SNAPSHOT_RESTORE = "snapshot_restore", "Snapshot restore (needs a pinned backup)"
    IRREVERSIBLE = "irreversible", "Irreversible (needs a pinned approval)"


class DecisionKind(models.TextChoices):
    EFFECT_CONFIRMED = "effect_confirmed", "Effect confirmed"
    EFFECT_ABSENT = "effect_absent", "Effect absent"
    CANCEL = "cancel", "Cancel"
    COMPENSATE = "compensate", "Run the compensation"


class CompensationApproval(models.TextChoices):
    """Whether a compensation runs by itself or after a second person approved it."""

    AUTOMATIC = "automatic", "Runs automatically"
    OPERATOR = "operator", "Needs an operator's approval (four eyes)"


class CompensationTrigger(models.TextChoices):
    """What made a compensation necessary. Persisted: never rename one."""

    CANCEL = "cancel", "The instance was cancelled"
    FAILURE = "failure", "A later step failed"
    OPERATOR = "operator", "An operator asked for it"


class DecisionState(models.TextChoices):
    REQUESTED = "requested", "Awaiting approval"
    APPROVED = "approved", "Approved"
    REJECTED = "rejected", "Rejected"
    WITHDRAWN = "withdrawn", "Withdrawn by its requester"


class IncidentStatus(models.TextChoices):
    OPEN = "open", "Open"
    RESOLVED = "resolved", "Resolved"


class ResolutionState(models.TextChoices):
    """Where a request to resolve an integrity incident stands."""

    REQUESTED = "requested", "Awaiting approval"
    APPROVED = "approved", "Approved (incident resolved)"
    REJECTED = "rejected", "Rejected"
    WITHDRAWN = "withdrawn", "Withdrawn by the requester"
