"""Ledger operation states and the one table of allowed transitions.

Persisted values: never rename or reuse one. ``docs/recovery.md`` shows this table, and
``tests/unit/test_states.py`` enumerates it.
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _


class OperationState(models.TextChoices):
    PREPARED = "prepared", _("Prepared (held before the dispatch boundary)")
    DISPATCHED = "dispatched", _("Dispatched")
    SUCCEEDED = "succeeded", _("Succeeded")
    FAILED = "failed", _("Failed")
    PENDING = "pending", _("Pending (provider owns the outcome)")
    OUTCOME_UNKNOWN = "outcome_unknown", _("Outcome unknown")
    EFFECT_CONFIRMED = "effect_confirmed", _("Effect confirmed")
    EFFECT_ABSENT = "effect_absent", _("Effect absent")


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
    ATOMIC = "atomic", _("Atomic (shares the engine's transaction)")
    NON_ATOMIC = "non_atomic", _("Non-atomic (external effect)")
    SNAPSHOT_RESTORE = "snapshot_restore", _("Snapshot restore (needs a pinned backup)")
    IRREVERSIBLE = "irreversible", _("Irreversible (needs a pinned approval)")


class DecisionKind(models.TextChoices):
    EFFECT_CONFIRMED = "effect_confirmed", _("Effect confirmed")
    EFFECT_ABSENT = "effect_absent", _("Effect absent")
    CANCEL = "cancel", _("Cancel")


class DecisionState(models.TextChoices):
    REQUESTED = "requested", _("Awaiting approval")
    APPROVED = "approved", _("Approved")
    REJECTED = "rejected", _("Rejected")
    WITHDRAWN = "withdrawn", _("Withdrawn by its requester")


class IncidentStatus(models.TextChoices):
    OPEN = "open", _("Open")
    RESOLVED = "resolved", _("Resolved")


class ResolutionState(models.TextChoices):
    """Where a request to resolve an integrity incident stands."""

    REQUESTED = "requested", _("Awaiting approval")
    APPROVED = "approved", _("Approved (incident resolved)")
    REJECTED = "rejected", _("Rejected")
    WITHDRAWN = "withdrawn", _("Withdrawn by the requester")
