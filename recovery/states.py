"""Ledger operation states and the one table of allowed transitions.

Persisted values: never rename or reuse one. ``docs/recovery.md`` shows this table, and
``tests/unit/test_states.py`` enumerates it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from django.db import models
from django.utils.translation import gettext_lazy as _


class TransitionTable(Mapping[str, frozenset[str]]):
    """A closed table of the moves a persisted state may make, ``{from: {to, ...}}``.

    Closed: every target is itself a row, so a typo in a table fails at import. A state
    with no targets is terminal. A write that keeps the state is not a move and needs no
    row. Used for ledger operations here and for the engine's tokens.
    """

    def __init__(self, moves: Mapping[str, Iterable[str]]) -> None:
        self._moves = {state: frozenset(targets) for state, targets in moves.items()}
        strays = set().union(*self._moves.values()) - set(self._moves)
        if strays:
            raise ValueError(f"Targets without a row of their own: {sorted(strays)}.")
        self.terminal: frozenset[str] = frozenset(s for s, t in self._moves.items() if not t)

    def __getitem__(self, state: str) -> frozenset[str]:
        return self._moves[state]

    def __iter__(self) -> Iterator[str]:
        return iter(self._moves)

    def __len__(self) -> int:
        return len(self._moves)

    def allows(self, current: str, target: str) -> bool:
        """Whether the table lets ``current`` move to another state ``target``."""
        return target in self._moves.get(current, frozenset())


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

TRANSITIONS = TransitionTable(
    {
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
)

TERMINAL: frozenset[str] = TRANSITIONS.terminal
INITIAL: frozenset[str] = frozenset({S.PREPARED, S.DISPATCHED})
can_transition = TRANSITIONS.allows


class RecoveryMode(models.TextChoices):
    ATOMIC = "atomic", _("Atomic (shares the engine's transaction)")
    NON_ATOMIC = "non_atomic", _("Non-atomic (external effect)")
    SNAPSHOT_RESTORE = "snapshot_restore", _("Snapshot restore (needs a pinned backup)")
    IRREVERSIBLE = "irreversible", _("Irreversible (needs a pinned approval)")


OBSERVABLE: frozenset[str] = frozenset(OperationState.values) - INITIAL
"""States an observation may record. ``TextChoices.values`` builds a new list at every
access: the ledger asks at every step, so the sets are made once here."""
RECOVERY_MODES: frozenset[str] = frozenset(RecoveryMode.values)


class DecisionKind(models.TextChoices):
    EFFECT_CONFIRMED = "effect_confirmed", _("Effect confirmed")
    EFFECT_ABSENT = "effect_absent", _("Effect absent")
    CANCEL = "cancel", _("Cancel")
    COMPENSATE = "compensate", _("Run the compensation")


class CompensationApproval(models.TextChoices):
    """Whether a compensation runs by itself or after a second person approved it."""

    AUTOMATIC = "automatic", _("Runs automatically")
    OPERATOR = "operator", _("Needs an operator's approval (four eyes)")


class CompensationTrigger(models.TextChoices):
    """What made a compensation necessary. Persisted: never rename one."""

    CANCEL = "cancel", _("The instance was cancelled")
    FAILURE = "failure", _("A later step failed")
    OPERATOR = "operator", _("An operator asked for it")


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
