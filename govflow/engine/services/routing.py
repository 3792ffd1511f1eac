"""Moving tokens along transitions: what a commit will write besides the step itself.

Control nodes (gateways, splits, joins, end) and the set-up of wait nodes (timers,
triggers, approvals, external tasks) happen in the same commit as the step that led to
them: they have no external effect, so they cost no commit of their own. A ``Router``
only plans: it reads the run's definition, instance and active tokens, and collects what
to write in its ``writes``; ``Run.flush`` writes them, on the fence, in the caller's
commit. It reads the database once, for a message that arrived before its step waited.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
from dataclasses import dataclass, field
from typing import Any, Protocol

from django.utils.dateparse import parse_datetime, parse_duration

from ..db import ClockPlus, clock
from ..definitions import Spec
from ..models import (
    DeliveryState,
    Instance,
    InstanceStatus,
    Token,
    TokenState,
    TriggerDelivery,
    WaitKind,
)
from ..states import TOKEN_ACTIVE
from ..variables import MissingVariable, build_input, evaluate, lookup
from ..waitkeys import CORRELATION_MAX, WAIT_KEY_MAX, correlation_text, message_key

ACTIVE = TOKEN_ACTIVE


class RouteError(Exception):
    """The workflow cannot continue from here (e.g. no gateway branch matches)."""


@dataclass
class Writes:
    """The writes a router collected for its commit, waiting for ``Run.flush``.

    Not a provider's pending answer (``results.Pending``): rows to insert or update.
    """

    tokens: list[Token] = field(default_factory=list)
    timers: list[tuple[Token, Any]] = field(default_factory=list)
    completed_joins: list[int] = field(default_factory=list)
    deliveries: list[tuple[Token, TriggerDelivery]] = field(default_factory=list)
    tasks: list[tuple[Token, dict[str, Any]]] = field(default_factory=list)
    """External tasks to create: the waiting token, and the input its worker receives."""


def due_expression(node: dict[str, Any]):
    """The timer's due time as a database expression (database clock, invariant I9)."""
    if "at" in node:
        return parse_datetime(node["at"])
    return clock_plus(parse_duration(node["duration"]))


def after_seconds(seconds: float):
    """The database clock ``seconds`` from now, as a value to write (:func:`clock_plus`)."""
    return clock_plus(dt.timedelta(seconds=seconds))


def clock_plus(delta: dt.timedelta | None):
    """The database clock ``delta`` from now, as a value to write (``db.ClockPlus``: at the
    clock's own precision, so a step comes due exactly when the clock reaches it); the
    clock itself for no time (or less): a step due now is due at once."""
    if delta is not None and delta <= dt.timedelta(0):
        return clock()
    return ClockPlus(delta)


def new_row(model, **values: Any):
    """``model(**values)``, built as Django builds a row it reads (positional values in
    field order, the defaults filled in): the keyword path asks every field a few
    questions, and the engine makes a step row at every step."""
    args = [
        values.pop(field.attname) if field.attname in values else field.get_default()
        for field in model._meta.concrete_fields
    ]
    if values:
        raise TypeError(f"{model.__name__} has no field named {sorted(values)}")
    return model(*args)


class Routable(Protocol):
    """What a router reads of a run (``services.run.Run`` is one)."""

    spec: Spec
    instance: Instance
    active: dict[int, Token]


class Router:
    """Routes tokens for one instance within one commit; used for one ``Run.flush``.

    It reads ``run``'s definition, instance (its variables; it takes the next ordinals)
    and active tokens, and keeps no reference to the run.
    """

    def __init__(self, run: Routable) -> None:
        self.spec: Spec = run.spec
        self.instance = run.instance
        self.active = run.active
        self.writes = Writes()

    @property
    def variables(self) -> dict[str, Any]:
        return self.instance.variables

    def new_token(self, node_id: str, state: str, **extra: Any) -> Token:
        now = clock()
        token = new_row(
            Token,
            instance_id=self.instance.pk,
            node_id=node_id,
            state=state,
            ordinal=self.instance.next_ordinal,
            created_at=now,
            updated_at=now,
            **extra,
        )
        self.instance.next_ordinal += 1
        self.writes.tokens.append(token)
        return token

    def leave(self, node_id: str) -> None:
        """Follow the outgoing transitions of a node that just completed."""
        node = self.spec.nodes[node_id]
        outgoing = self.spec.outgoing[node_id]
        if node["type"] == "exclusive":
            chosen = None
            for transition in outgoing:
                if transition.when is not None and evaluate(transition.when, self.variables):
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
            return
        if kind in {"exclusive", "parallel_split"}:
            self.leave(node_id)
            return
        if kind == "parallel_join":
            self.arrive_at_join(node_id)
            return
        if kind in {"action", "linked_run"}:
            self.new_token(node_id, TokenState.READY)
            return
        if kind == "timer":
            token = self.new_token(node_id, TokenState.WAITING, wait_kind=WaitKind.TIMER)
            self.writes.timers.append((token, due_expression(node)))
            return
        if kind == "trigger":
            self.enter_trigger(node_id, node)
            return
        if kind == "approval":
            self.new_token(
                node_id,
                TokenState.WAITING,
                wait_kind=WaitKind.APPROVAL,
                wait_key=node["permission"],
            )
            return
        if kind == "external_task":
            self.enter_external_task(node_id, node)
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

    def enter_trigger(self, node_id: str, node: dict[str, Any]) -> None:
        """A step waiting for a message; one that arrived first is taken at once."""
        try:
            correlation = lookup(self.variables, node["correlation"])
        except MissingVariable as exc:
            raise RouteError(
                f"trigger '{node_id}': {exc}; it identifies the awaited message"
            ) from None
        text = correlation_text(correlation)
        if text is None:
            raise RouteError(
                f"trigger '{node_id}': the correlation value of '{node['correlation']}' is "
                f"{json.dumps(correlation)[:80]}; a message is correlated by a string or a whole "
                "number. Start the instance with such a value, or correlate by another variable."
            )
        wait_key = message_key(node["message"], text)
        if wait_key is None or len(text) > CORRELATION_MAX:
            raise RouteError(
                f"trigger '{node_id}': the correlation value of '{node['correlation']}' is "
                f"{len(text)} characters; a delivery carries at most {CORRELATION_MAX} (and "
                f"the message name with it at most {WAIT_KEY_MAX - 1}), so no message could "
                "reach this step. Correlate by a shorter value."
            )
        token = self.new_token(
            node_id, TokenState.WAITING, wait_kind=WaitKind.TRIGGER, wait_key=wait_key
        )
        buffered = (
            TriggerDelivery.objects.filter(
                message=node["message"],
                correlation=text,
                state=DeliveryState.RECEIVED,
                tenant__in=("", self.instance.tenant),
            )
            .order_by("received_at", "pk")
            .first()
        )
        if buffered is not None:
            self.writes.deliveries.append((token, buffered))

    def enter_external_task(self, node_id: str, node: dict[str, Any]) -> None:
        """A waiting token and the task a worker fetches (written by ``write_routed``)."""
        try:
            if "input" in node:
                task_input = build_input(node["input"], self.variables)
            else:
                task_input = copy.deepcopy(self.variables)
        except MissingVariable as exc:
            raise RouteError(f"external task '{node_id}': {exc}; its input needs it") from None
        token = self.new_token(
            node_id, TokenState.WAITING, wait_kind=WaitKind.EXTERNAL, wait_key=node["topic"]
        )
        self.writes.tasks.append((token, task_input))

    def arrive_at_join(self, node_id: str) -> None:
        arrived = [
            t for t in self.active.values() if t.node_id == node_id and t.wait_kind == WaitKind.JOIN
        ]
        arrived += [
            t for t in self.writes.tokens if t.node_id == node_id and t.wait_kind == WaitKind.JOIN
        ]
        needed = len(self.spec.incoming[node_id])
        if len(arrived) + 1 < needed:
            self.new_token(node_id, TokenState.WAITING, wait_kind=WaitKind.JOIN)
            return
        for token in arrived:
            if token.pk is None:
                self.writes.tokens.remove(token)
            else:
                self.writes.completed_joins.append(token.pk)
        self.leave(node_id)


def derive_status(active_tokens) -> str:
    """The instance status its active tokens imply. Pure."""
    active_tokens = list(active_tokens)
    states = {t.state for t in active_tokens}
    if TokenState.OUTCOME_UNKNOWN in states:
        return InstanceStatus.BLOCKED
    # A ready token that polls a pending provider (or watches a linked run) waits for
    # that provider, not for us.
    if any(
        t.state == TokenState.EXECUTING
        or (t.state == TokenState.READY and t.wait_kind not in (WaitKind.POLL, WaitKind.LINKED))
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
    "Routable",
    "RouteError",
    "Router",
    "Writes",
    "after_seconds",
    "derive_status",
    "due_expression",
]
