"""Planning a step and recording its dispatch: everything up to the dispatch boundary.

``plan_action`` checks and prepares a module action (gates, input, schema, preview,
authority, fingerprints, keys) and records nothing. ``dispatch`` writes the boundary:
token ``executing`` and the ledger operation ``dispatched``. ``dispatch_next`` does the
same for the next step inside the commit of the step before it (protocol step 5 in
``runtime``) and returns what the loop must do next as a value: :class:`Chain`,
:class:`Defer`, or None.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import connection

from recovery.api import (
    CanonicalError,
    FingerprintKind,
    IntegrityViolation,
    Observation,
    RecoveryMode,
    canonical_bytes,
    fingerprint,
    fingerprint_value,
    idempotency_key,
    operation_get,
    operation_key,
    operation_observe_record,
    operation_record,
    schema_validator,
)

from ..conf import lease_ttl
from ..linked import step_action
from ..models import Token, TokenState
from ..registry import ActionDefinition, registry
from ..results import ActionContext
from ..variables import MissingVariable, build_input
from .run import Run
from .writes import closes_clean, first_writes, write_held

__all__ = [
    "Chain",
    "ChainedDispatchRefused",
    "Defer",
    "Next",
    "Plan",
    "StepRejected",
    "dispatch",
    "dispatch_next",
    "plan_action",
]

log = logging.getLogger("govflow.engine")


class StepRejected(Exception):
    """The step cannot be dispatched; nothing was recorded. The message says what to fix."""

    def __init__(self, kind: str, message: str) -> None:
        self.kind = kind
        super().__init__(message)


class ChainedDispatchRefused(Exception):
    """The ledger refused a dispatch chained into another step's commit (integrity).

    That whole commit rolled back. Its caller makes it again without the chained dispatch
    (``run.no_chain``); the loop then meets the refusal in that step's own commit, where
    it stops the instance. ``cause`` is the ledger's error.
    """

    def __init__(self, cause: IntegrityViolation) -> None:
        self.cause = cause
        super().__init__(str(cause))


@dataclass
class Plan:
    """Everything a step's dispatch needs, computed before anything is recorded."""

    token: Token
    node: Mapping[str, Any]
    action: ActionDefinition
    record: dict[str, Any]
    key: str
    idem: str
    context: ActionContext


@dataclass(frozen=True)
class Chain:
    """The last commit recorded this step's dispatch: call its provider next, whatever
    the run's budget says (the dispatch is durable)."""

    plan: Plan


@dataclass(frozen=True)
class Defer:
    """The last commit planned the next step but left it for a commit of its own.

    Either its ``plan`` (a slow preview: the lease is renewed first) or the ``refusal``
    that blocks it; the preview is not asked twice. Used only for ``token_pk``.
    """

    token_pk: int
    plan: Plan | None = None
    refusal: StepRejected | None = None


Next = Chain | Defer | None
"""What a step tells the loop: chain this dispatched plan, take this prepared one, or
nothing (pick the next runnable token)."""


@functools.cache
def _user_active_sql() -> str:
    """``SELECT is_active`` of one user by primary key, built once from the user model."""
    meta = get_user_model()._meta
    quote = connection.ops.quote_name
    return (
        f"SELECT {quote(meta.get_field('is_active').column)} FROM {quote(meta.db_table)} "
        f"WHERE {quote(meta.pk.column)} = %s"
    )


def _user_active(user_id: Any) -> bool:
    """Whether the user ``user_id`` exists and is active (one prepared statement, no ORM
    query building: every step of an instance a person started asks it)."""
    try:
        pk = get_user_model()._meta.pk.to_python(user_id)
    except ValidationError:
        return False
    with connection.cursor() as cursor:
        cursor.execute(_user_active_sql(), [pk])
        row = cursor.fetchone()
    return row is not None and bool(row[0])


def access_context(run: Run) -> dict[str, Any]:
    """The access context a step runs under, revalidated before every dispatch (reads)."""
    access = dict(run.instance.access or {})
    access["tenant"] = run.instance.tenant
    user_id = access.get("started_by")
    if user_id is not None and not _user_active(user_id):
        raise StepRejected(
            "access_revoked",
            f"The user who started this instance (id {user_id}) is no "
            "longer active, so its steps no longer have authority. An "
            "operator may cancel the instance or start it again.",
        )
    return access


def _checked_input(token: Token, node: Mapping[str, Any], action: ActionDefinition, run: Run):
    """The step's input, built from the variables and checked against the action's
    schema; raises StepRejected. Pure."""
    try:
        input_value = build_input(node.get("input", {}), run.variables)
    except MissingVariable as exc:
        raise StepRejected(
            "input",
            f"Step '{token.node_id}' needs the variable "
            f"'{exc.path}', which is not set; nothing was dispatched. Variables are not "
            "edited: cancel this instance and start the case again with the variable (or "
            "on a version whose input mapping does not need it).",
        ) from None
    errors = sorted(
        schema_validator(action.input_schema).iter_errors(input_value),
        key=lambda e: list(e.path),
    )
    if errors:
        detail = "; ".join(
            f"{'.'.join(map(str, e.path)) or '(input)'}: {e.message}" for e in errors[:5]
        )
        raise StepRejected(
            "input",
            f"The input of step '{token.node_id}' violates the "
            f"schema of {action.name}: {detail}. Nothing was dispatched.",
        )
    return input_value


def prepare(run: Run, token: Token, node: Mapping[str, Any], action: ActionDefinition):
    """Everything before the dispatch boundary; raises StepRejected (nothing recorded).

    Reads only; the provider's preview runs here (inside the caller's commit when the
    step is chained, so a preview must not write to the engine's database).
    """
    if action.gated_by and not str(node.get(action.gated_by) or "").strip():
        raise StepRejected(
            "gate",
            f"Action {action.name} is {action.recovery_mode} and the "
            f"node pins no '{action.gated_by}'; it was not dispatched.",
        )
    input_value = _checked_input(token, node, action, run)
    try:
        input_bytes = canonical_bytes(input_value, admitted=True)  # from admitted JSON
        preview = action.preview(input_value)
        preview_bytes = canonical_bytes(preview)
    except CanonicalError as exc:
        raise StepRejected("input", f"Step '{token.node_id}': {exc}") from None
    except Exception as exc:  # a provider bug before dispatch: nothing happened outside
        log.warning("preview of %s raised %s", action.name, type(exc).__name__)
        raise StepRejected(
            "preview",
            f"The preview of {action.name} for step "
            f"'{token.node_id}' raised {type(exc).__name__}; "
            "nothing was dispatched. Fix the provider or the "
            "input; the step is tried again later.",
        ) from None
    return Prepared(input_value, input_bytes, preview_bytes, access_context(run))


@dataclass(frozen=True)
class Prepared:
    """A step's input and preview, checked, with their canonical bytes (made once: the
    fingerprints are computed from these bytes, not from the values again)."""

    input: Any
    input_bytes: bytes
    preview_bytes: bytes
    access: dict[str, Any]


def context_for(run, token, node, action, input_value, access, idem, phase) -> ActionContext:
    return ActionContext(
        action=action.name,
        input=input_value,
        idempotency_key=idem,
        tenant=run.instance.tenant,
        access=access,
        instance_id=run.instance.pk,
        step_id=token.node_id,
        attempt=token.attempt,
        poll=token.poll,
        phase=phase,
        backup_ref=node.get("backup_ref"),
        approval_ref=node.get("approval_ref"),
    )


def _effect_key(run: Run, token: Token, action: ActionDefinition, input_fp: str) -> str:
    """The provider's idempotency key: the step's first one, kept across polls and
    retries (whose input must not have changed: raises StepRejected). Reads only."""
    if not token.idempotency_key:
        return idempotency_key(
            definition_fp=run.definition_fp,
            step_id=token.node_id,
            action=action.name,
            input_fp=input_fp,
            nonce=f"{run.instance.pk}:{token.ordinal}",
        )
    previous = operation_get(key=token.operation_key)
    if previous is not None and previous.input_fp != input_fp:
        raise StepRejected(
            "input_changed",
            f"The input of step '{token.node_id}' changed since its first attempt; "
            "retrying it would be a different effect. Cancel the instance or restore "
            "the variables.",
        )
    return token.idempotency_key


def plan_action(run: Run, token: Token, node: Mapping[str, Any]) -> Plan:
    """Check and prepare a step for dispatch; raises StepRejected (nothing recorded).

    Reads only (see :func:`prepare`).
    """
    action = step_action(node)  # a module action, or a linked run's start
    if action is None:
        name = node.get("action") or node.get("run_provider")
        raise StepRejected(
            "action_missing",
            f"No installed provider registers {name}; install its module.",
        )
    prepared = prepare(run, token, node, action)
    input_value, access = prepared.input, prepared.access
    definition_fp = run.definition_fp  # re-hashed from the stored definition, not copied
    input_fp = fingerprint(FingerprintKind.INPUT, prepared.input_bytes)
    idem = _effect_key(run, token, action, input_fp)
    nonce = f"{run.instance.pk}:{token.ordinal}:{token.attempt}:{token.poll}"
    record = dict(
        subject=run.subject,
        step_id=token.node_id,
        action=action.name,
        recovery_mode=action.recovery_mode,
        definition_fp=definition_fp,
        input_fp=input_fp,
        preview_fp=fingerprint(FingerprintKind.PREVIEW, prepared.preview_bytes),
        access_fp=fingerprint_value(FingerprintKind.ACCESS_CONTEXT, access, admitted=True),
        idempotency_fp=fingerprint_value(FingerprintKind.IDEMPOTENCY_KEY, idem, admitted=True),
        nonce=nonce,
        ordinal=token.attempt + token.poll,
        fence=run.fence,
    )
    key = operation_key(
        definition_fp=definition_fp,
        step_id=token.node_id,
        action=action.name,
        input_fp=input_fp,
        nonce=nonce,
    )
    phase = "poll" if token.poll else "execute"
    context = context_for(run, token, node, action, input_value, access, idem, phase)
    return Plan(token, node, action, record, key, idem, context)


def dispatch(run: Run, plan: Plan, observed: Observation | None = None, last: bool = False) -> None:
    """The dispatch boundary's writes (needs the caller's commit): token ``executing``,
    then the ledger operation ``dispatched``, which carries the projection's fingerprint
    and is refused while an integrity incident is open or the effect is unsettled (I12).

    With ``observed`` (the previous step's observation, held back for this), the token's
    write and both ledger writes go together: one server call on PostgreSQL (ADR 0031),
    or the rows a flush held in front of it, the step inserted ``executing`` (ADR 0047).
    ``last``: nothing follows in the caller's commit (``writes.closes_clean``: ADR 0051)."""
    values = dict(
        state=TokenState.EXECUTING,
        operation_key=plan.key,
        idempotency_key=plan.idem,
        not_before=None,
        wait_kind="",
    )
    executing = run.token_write(plan.token, TokenState.READY, **values)
    first = first_writes(run, plan.token, executing)  # in the ledger's statement (0053)
    if observed is None:
        record = dict(plan.record, follow=run.may_chain() and not plan.token.poll)  # ADR 0052
        operation_record(**record, projection_fp=run.carry_projection(), first=first)
        return
    operation_observe_record(
        observation=observed,
        record=plan.record,
        projection_fp=run.carry_projection(),
        first=first,
        last=last and closes_clean(run),  # after first_writes took the held rows
    )


def dispatch_next(run: Run, observed: Observation | None = None, last: bool = False) -> Next:
    """Record the next step's dispatch in the commit that made it ready, when it can.

    Needs the caller's commit: one that just completed a step. When the next step to run
    is a non-atomic action whose checks pass, its dispatch boundary (token ``executing`` +
    ledger operation) joins this commit, so a chain of steps costs one commit per step:
    the observation of step k and the dispatch of step k+1 are made durable together, and
    the loop is told to call it (:class:`Chain`). Anything less plain (another kind of
    node, an atomic action, a backoff, no budget left in this run) is left ready for the
    loop, which handles it in its own commits as before (None); a step that would be
    rejected, or whose preview was slow, is left with its plan or refusal (:class:`Defer`).
    Raises :class:`ChainedDispatchRefused` when the ledger refuses the chained dispatch.
    ``observed`` is the previous step's observation held back by the caller: it is
    written with the dispatch when one is chained (:class:`Chain`), else left to the
    caller; a refusal of the observation itself is raised as it is. Rows held for the call
    (``run.held_rows``, ADR 0047) go with a chained dispatch, are sent before a ``Defer``
    (which names its step by id), else are left to the caller (``writes.write_held``).
    ``last``: when a dispatch is chained, the caller writes nothing after it (``dispatch``).
    """
    if not run.may_chain():
        return None
    ready = [
        t for t in run.active.values() if t.state == TokenState.READY and t.pk not in run.blocked
    ]
    if not ready:
        return None
    token = min(ready, key=lambda t: t.ordinal)
    node = run.spec.nodes[token.node_id]
    if token.not_before is not None or node["type"] != "action":
        return None
    action = registry.get(node["action"])
    if action is None or action.recovery_mode == RecoveryMode.ATOMIC:
        return None
    began = time.monotonic()
    try:
        plan = plan_action(run, token, node)
    except StepRejected as exc:
        # Not here: blocking is its own commit, made by the loop with this very reason.
        write_held(run)
        return Defer(token.pk, refusal=exc)
    if time.monotonic() - began > lease_ttl() / 10:
        # A slow preview: the lease is renewed before this step is dispatched, in its own
        # commit, so the commit now open (another step's outcome) is not put at risk.
        write_held(run)
        return Defer(token.pk, plan=plan)
    try:
        dispatch(run, plan, observed, last)
    except IntegrityViolation as exc:
        if getattr(exc, "ledger_write", "record") == "observe":
            raise  # the previous step's outcome itself was refused: the caller's to handle
        raise ChainedDispatchRefused(exc) from exc
    return Chain(plan)
