"""Engine states, and the one table of the moves a step (token) may make.

Persisted values: never rename or reuse one. ``docs/architecture.md`` ("Step states") shows
the token table, ``tests/unit/test_engine_states.py`` enumerates it, and every change of a
token's state the engine makes through ``Run.update_token`` is checked against it.
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from recovery.api import TransitionTable


class InstanceStatus(models.TextChoices):
    RUNNING = "running", _("Running")
    WAITING = "waiting", _("Waiting")
    BLOCKED = "blocked", _("Blocked (needs an operator)")
    COMPLETED = "completed", _("Completed")
    FAILED = "failed", _("Failed")
    CANCELLED = "cancelled", _("Cancelled")


TERMINAL_STATUSES = frozenset(
    {InstanceStatus.COMPLETED, InstanceStatus.FAILED, InstanceStatus.CANCELLED}
)
"""An instance in one of these has ended: nothing moves it again."""


class TokenState(models.TextChoices):
    READY = "ready", _("Ready")
    EXECUTING = "executing", _("Executing")
    WAITING = "waiting", _("Waiting")
    OUTCOME_UNKNOWN = "outcome_unknown", _("Outcome unknown")
    COMPLETED = "completed", _("Completed")
    FAILED = "failed", _("Failed")
    CANCELLED = "cancelled", _("Cancelled")


class WaitKind(models.TextChoices):
    TIMER = "timer", _("Timer")
    TRIGGER = "trigger", _("Trigger message")
    APPROVAL = "approval", _("Human approval")
    EXTERNAL = "external", _("External worker")
    POLL = "poll", _("Pending provider (poll)")
    RETRY = "retry", _("Retry backoff")
    JOIN = "join", _("Parallel join")
    RECONCILE = "reconcile", _("Asking the provider (reconcile)")
    LINKED = "linked", _("Linked run (asking the other module)")


class TimerState(models.TextChoices):
    SCHEDULED = "scheduled", _("Scheduled")
    FIRED = "fired", _("Fired")


class DeliveryState(models.TextChoices):
    RECEIVED = "received", _("Received (buffered until a step waits for it)")
    CONSUMED = "consumed", _("Consumed by a waiting step")


T = TokenState

TOKEN_TRANSITIONS = TransitionTable(
    {
        # Dispatched (non-atomic), completed in one commit (atomic success, a released wait),
        # failed for good before any effect (atomic failure), or cancelled.
        T.READY: frozenset({T.EXECUTING, T.COMPLETED, T.FAILED, T.CANCELLED}),
        # Never dispatched after a worker stopped, a pending provider or a transient failure
        # (ready again, later); the provider's conclusive answer; no conclusive answer. Cancelled
        # only by an approved cancel decision on another step of the instance.
        T.EXECUTING: frozenset({T.READY, T.COMPLETED, T.FAILED, T.OUTCOME_UNKNOWN, T.CANCELLED}),
        # Released (timer fired, message delivered, approval given, external task done), a
        # parallel join's earlier arrivals completed by the last one, cancelled, or failed
        # when its external task was dead-lettered (failed for good, or out of retries).
        T.WAITING: frozenset({T.READY, T.COMPLETED, T.CANCELLED, T.FAILED}),
        # Only an approved decision closes it (effect confirmed, effect absent, cancel: I3),
        # or the provider's reconcile when its action declares that its word settles.
        T.OUTCOME_UNKNOWN: frozenset({T.COMPLETED, T.FAILED, T.CANCELLED}),
        # A deliberate retry, after a failure or an effect recorded absent; for a
        # dead-lettered external task, waiting again for the new task the retry creates.
        T.FAILED: frozenset({T.READY, T.WAITING}),
        T.COMPLETED: frozenset(),
        T.CANCELLED: frozenset(),
    }
)
"""Every change of a token's state the engine makes, as ``{from: {to, ...}}``.

A write that keeps the state (a retry of a step that never left ``ready``: attempt + 1,
a back-off) is not a move and needs no row here."""

TOKEN_TERMINAL: frozenset[str] = TOKEN_TRANSITIONS.terminal
TOKEN_ACTIVE: frozenset[str] = frozenset({T.READY, T.EXECUTING, T.WAITING, T.OUTCOME_UNKNOWN})
"""A token in one of these holds its instance open (``failed`` waits for a retry, but
does not keep the instance running)."""

token_may_move = TOKEN_TRANSITIONS.allows
"""Whether the table lets a token go from ``current`` to another state ``target``."""
