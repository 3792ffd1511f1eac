"""What a provider's action returns, and the context it receives."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["ActionContext", "Failed", "Pending", "Result", "Succeeded", "Unknown"]


@dataclass(frozen=True)
class Succeeded:
    """The effect happened; ``output`` (JSON) feeds the node's output mapping."""

    output: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Failed:
    """The effect did not happen. ``reason`` is a short message for operators.

    ``permanent`` failures stop the instance; transient ones are retried with backoff up to
    the action's retry budget, each under a new operation key and the same idempotency key.
    """

    reason: str
    permanent: bool = False


@dataclass(frozen=True)
class Pending:
    """The provider accepted the request and owns the outcome; poll again after a while."""

    poll_after: float = 5.0


@dataclass(frozen=True)
class Unknown:
    """Only from ``reconcile`` or ``poll``: the provider cannot say whether the effect happened."""

    reason: str = ""


Result = Succeeded | Failed | Pending | Unknown


@dataclass(frozen=True)
class ActionContext:
    """Everything a provider gets: never the engine's models.

    ``input`` is the canonical input (validated against the action's schema),
    ``idempotency_key`` is stable for the logical effect across polls and retries, and
    ``phase`` says which callable is running. ``backup_ref`` / ``approval_ref`` are the
    references the node pinned for gated actions.
    """

    action: str
    input: Mapping[str, Any]
    idempotency_key: str
    tenant: str
    access: Mapping[str, Any]
    instance_id: int
    step_id: str
    attempt: int
    poll: int
    phase: Literal["execute", "poll", "reconcile"] = "execute"
    backup_ref: str | None = None
    approval_ref: str | None = None
