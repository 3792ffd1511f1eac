"""Moving tokens along transitions inside the caller's fenced transaction.

Control nodes (gateways, splits, joins, end) and the set-up of wait nodes (timers,
triggers, approvals, external tasks) happen in the same commit as the step that led to
them: they have no external effect, so they cost no commit of their own.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from django.db.models import DateTimeField, ExpressionWrapper, Value
from django.utils.dateparse import parse_datetime, parse_duration

from ..definitions import Spec
from ..dialect import clock
from ..models import (
    DeliveryState,
    InstanceStatus,
    Timer,
    Token,
    TokenState,
    TriggerDelivery,
    WaitKind,
)
from ..states import TOKEN_ACTIVE
from ..variables import MissingVariable, evaluate, lookup

ACTIVE = TOKEN_ACTIVE


class RouteError(Exception):
    """The workflow cannot continue from here (e.g. no gateway branch matches)."""


@dataclass
class Pending:
    """What one commit will write besides the step itself (collected, then flushed)."""

    tokens: list[Token] = field(default_factory=list)
    timers: list[tuple[Token, Any]] = field(default_factory=list)
    completed_joins: list[int] = field(default_factory=list)
    deliveries: list[tuple[Token, TriggerDelivery]] = field(default_factory=list)


def due_expression(node: dict[str, Any]):
    """The timer's due time as a database expression (database clock, invariant I9)."""
    if "at" in node:
        return parse_datetime(node["at"])
    duration = parse_duration(node["duration"])
    return ExpressionWrapper(clock() + Value(duration), output_field=DateTimeField())


def after_seconds(seconds: float):
    return ExpressionWrapper(
        clock() + Value(dt.timedelta(seconds=seconds)), output_field=DateTimeField()
    )


class Router:
    """Routes tokens for one instance within one commit. ``run`` is the owning Run."""

    def __init__(self, run) -> None:
        self.run = run
        self.spec: Spec = run.spec
        self.pending = Pending()

    def new_token(self, node_id: str, state: str, **extra: Any) -> Token:
        run = self.run
        token = Token(
            instance_id=run.instance.pk,
            node_id=node_id,
            state=state,
            ordinal=run.instance.next_ordinal,
            created_at=run.now_expr(),
            updated_at=run.now_expr(),
            **extra,
        )
        run.instance.next_ordinal += 1
        self.pending.tokens.append(token)
        return token

    def leave(self, node_id: str) -> None:
        """Follow the outgoing transitions of a node that just completed."""
        node = self.spec.nodes[node_id]
        outgoing = self.spec.outgoing[node_id]
        if node["type"] == "exclusive":
            chosen = None
            for transition in outgoing:
                if transition.when is not None and evaluate(transition.when, self.run.variables):
                    chosen = transition
                    break
            if chosen is None:
                chosen = next((t for t in outgoing if t.default), None)
            if chosen is None:
                raise RouteError(
                    f"gateway '{node_id}': no condition matches the variables "
                    "and there is no default branch"
                )
            self.enter(chosen.target, via=node_id)
            return
        for transition in outgoing:
            self.enter(transition.target, via=node_id)

    def enter(self, node_id: str, *, via: str) -> None:
        node = self.spec.nodes[node_id]
        kind = node["type"]
        if kind == "end":
            self.run.reached_end = True
            return
        if kind in {"exclusive", "parallel_split"}:
            self.leave(node_id)
            return
        if kind == "parallel_join":
            self.arrive_at_join(node_id)
            return
        if kind == "action":
            self.new_token(node_id, TokenState.READY)
            return
        if kind == "timer":
            token = self.new_token(node_id, TokenState.WAITING, wait_kind=WaitKind.TIMER)
            self.pending.timers.append((token, due_expression(node)))
            return
        if kind == "trigger":
            try:
                correlation = lookup(self.run.variables, node["correlation"])
            except MissingVariable as exc:
                raise RouteError(
                    f"trigger '{node_id}': {exc}; it identifies the awaited message"
                ) from None
            wait_key = f"{node['message']}:{correlation}"
            token = self.new_token(
                node_id, TokenState.WAITING, wait_kind=WaitKind.TRIGGER, wait_key=wait_key[:300]
            )
            buffered = (
                TriggerDelivery.objects.filter(
                    message=node["message"],
                    correlation=str(correlation),
                    state=DeliveryState.RECEIVED,
                )
                .order_by("received_at", "pk")
                .first()
            )
            if buffered is not None:
                self.pending.deliveries.append((token, buffered))
            return
        if kind == "approval":
            self.new_token(
                node_id,
                TokenState.WAITING,
                wait_kind=WaitKind.APPROVAL,
                wait_key=node["permission"],
            )
            return
        if kind == "external":
            self.new_token(
                node_id,
                TokenState.WAITING,
                wait_kind=WaitKind.EXTERNAL,
                wait_key=node["topic"][:300],
            )
            return
        raise RouteError(f"node '{node_id}' of type {kind!r} cannot be entered")

    def arrive_at_join(self, node_id: str) -> None:
        run = self.run
        arrived = [
            t for t in run.active.values() if t.node_id == node_id and t.wait_kind == WaitKind.JOIN
        ]
        arrived += [
            t for t in self.pending.tokens if t.node_id == node_id and t.wait_kind == WaitKind.JOIN
        ]
        needed = len(self.spec.incoming[node_id])
        if len(arrived) + 1 < needed:
            self.new_token(node_id, TokenState.WAITING, wait_kind=WaitKind.JOIN)
            return
        for token in arrived:
            if token.pk is None:
                self.pending.tokens.remove(token)
            else:
                self.pending.completed_joins.append(token.pk)
        self.leave(node_id)


def derive_status(active_tokens) -> str:
    active_tokens = list(active_tokens)
    states = {t.state for t in active_tokens}
    if TokenState.OUTCOME_UNKNOWN in states:
        return InstanceStatus.BLOCKED
    # A ready token that polls a pending provider waits for that provider, not for us.
    if any(
        t.state == TokenState.EXECUTING
        or (t.state == TokenState.READY and t.wait_kind != WaitKind.POLL)
        for t in active_tokens
    ):
        return InstanceStatus.RUNNING
    if TokenState.READY in states:
        return InstanceStatus.WAITING
    if TokenState.WAITING in states:
        return InstanceStatus.WAITING
    return InstanceStatus.COMPLETED


__all__ = [
    "ACTIVE",
    "Pending",
    "RouteError",
    "Router",
    "Timer",
    "after_seconds",
    "derive_status",
    "due_expression",
]
