"""Starting, cancelling and retrying instances."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

from django.db import IntegrityError

from recovery.api import (
    FingerprintKind,
    LeaseHeld,
    LedgerDisagrees,
    Verification,
    default_db,
    fingerprint_value,
    incident_open,
    insert_row,
    insert_statement,
    lease_acquire,
    lease_release,
    lease_release_if_held,
    operations_for_effect,
    projection_record,
    projection_start_statement,
    sent_alone,
    untouched,
)

from ..conf import operator_lease_ttl
from ..db import clock, clock_read, engine_commit, engine_dialect, next_id_and_clock
from ..definitions import case_text, case_values, schema_errors
from ..emit import instance_started, instance_started_parts
from ..errors import EngineConflict, IntegrityStop, InvalidRequest, NotPermitted
from ..limits import admit_json, admit_text, variables_max_bytes
from ..liveness import worker_name
from ..models import (
    Definition,
    ExternalTask,
    Instance,
    InstanceStatus,
    TaskState,
    Token,
    TokenState,
)
from ..projection import instance_subject, projection_of
from ..queue import instance_mark_runnable
from ..states import TERMINAL_STATUSES
from .definitions import spec_of, start_refusal
from .linked import linked_cancel_record, linked_cancel_send
from .load import load_run
from .rehydration import rehydrate
from .routing import Router
from .run import Run, instance_lease_key
from .saga import saga_plan_on_cancel

__all__ = [
    "InstanceHeld",
    "instance_cancel",
    "instance_start",
    "resolve_definition",
    "step_retry",
]


def _require(actor, perm: str, doing: str) -> None:
    if actor is not None and not actor.has_perm(perm):
        raise NotPermitted(f"{actor} may not {doing}: the permission {perm!r} is required.")


def resolve_definition(key: str, version: int | None = None) -> Definition:
    qs = Definition.objects.filter(key=key)
    definition = (qs.filter(version=version) if version else qs.order_by("-version")).first()
    if definition is None:
        raise InvalidRequest(
            f"No published definition {key!r}"
            f"{f' version {version}' if version else ''}. Publish it first."
        )
    return definition


def instance_start(
    *,
    definition: Definition,
    variables: dict[str, Any] | None = None,
    tenant: str = "default",
    actor=None,
    access: dict[str, Any] | None = None,
) -> Instance:
    """Start an instance and enqueue its first run, in one commit.

    Malformed variables, variables that violate the definition's ``variables`` schema and
    definitions that no longer resolve are rejected before anything is recorded.
    """
    _require(actor, "engine.start_instance", "start instances")
    variables = {} if variables is None else variables
    access = _admitted_start(definition, variables, tenant, actor, access)
    if engine_dialect().next_id:
        return _start_in_one_statement(definition, variables, tenant, actor, access)
    with engine_commit():
        # The database clock, read once: the instance's and its start step's times and its
        # runnable mark are its value, so nothing is read back after the inserts.
        instance = _new_instance(definition, variables, tenant, actor, access, clock_read())
        insert_row(instance)
        start = _start_step(definition, instance)
        insert_row(start)
        # The projection is under the chain from its first commit (invariant I12); the
        # instance is new, so is its chain.
        projection_record(
            subject=instance_subject(instance.pk),
            projection_fp=projection_of(instance, [start]),
            new=True,
        )
        instance_started(instance, definition=definition.key, version=definition.version)
    return instance


def _start_in_one_statement(
    definition: Definition, variables: dict[str, Any], tenant: str, actor, access: dict
) -> Instance:
    """:func:`instance_start` on PostgreSQL (ADR 0058): the instance's id and the clock are
    read first, then its row, its start step, its chain's first checkpoint and its
    ``instance.started`` event are one statement — sent alone, in autocommit, when the
    caller has no transaction open: two round trips, not seven."""
    pk, now = next_id_and_clock(Instance)
    instance = _new_instance(definition, variables, tenant, actor, access, now)
    instance.pk = pk
    start = _start_step(definition, instance)
    subject = instance_subject(pk)
    parts: list[str] = []
    params: list[object] = []
    chain_start = projection_start_statement(subject, projection_of(instance, [start]))
    for name, (sql, values) in (
        ("instance_row", insert_statement(instance)),
        ("start_step", insert_statement(start)),
        ("chain_start", (chain_start.sql, chain_start.params)),
    ):
        parts.append(f"{name} AS ({sql})")
        params += values
    event, event_params = instance_started_parts(
        instance, definition=definition.key, version=definition.version
    )
    sql = f"WITH {', '.join([*parts, *event])} SELECT count(*) FROM event"
    db = default_db()
    outermost = not db.in_atomic_block  # a caller's transaction would go on
    with engine_commit(), db.cursor() as cursor:
        try:
            with sent_alone() if outermost and untouched() else nullcontext():
                cursor.execute(sql, [*params, *event_params])
        except IntegrityError as exc:
            conflict = chain_start.conflict(exc)
            if conflict is None:
                raise
            raise conflict from exc
    for row in (instance, start):
        row._state.adding = False
        row._state.db = db.alias
    return instance


def _new_instance(
    definition: Definition, variables, tenant: str, actor, access: dict, now
) -> Instance:
    return Instance(
        definition=definition,
        definition_fp=definition.fingerprint,
        tenant=tenant,
        variables=variables,
        access=access,
        started_by=actor,
        **_case(definition, variables),
        created_at=now,
        updated_at=now,
        next_ordinal=2,
        # Runnable from its start: the first mark (``queue.instances_mark_runnable``)
        # made in the insert itself.
        runnable_at=now,
        wakeups=1,
    )


def _start_step(definition: Definition, instance: Instance) -> Token:
    return Token(
        instance=instance,
        node_id=spec_of(definition).start,
        ordinal=1,
        state=TokenState.READY,
        created_at=instance.created_at,
        updated_at=instance.created_at,
    )


def _case(definition: Definition, variables: dict[str, Any]) -> dict[str, Any]:
    case = case_values(spec_of(definition).document, variables)
    return {"case": case, "case_text": case_text(case)}


def _admitted_start(
    definition: Definition, variables: Any, tenant: str, actor, access: dict[str, Any] | None
) -> dict[str, Any]:
    """Check what starting ``definition`` was given; return the access context to store.

    The same limits as the admin's form, whoever calls: nothing oversized, too deep or
    unstorable (U+0000 on PostgreSQL) reaches the database.
    """
    if not isinstance(variables, dict):
        raise InvalidRequest("Variables must be a JSON object mapping names to values.")
    admit_json(variables, what="Variables are malformed", max_bytes=variables_max_bytes())
    admit_text(tenant, name="tenant", max_length=100)
    access = dict(access or {})
    if actor is not None:
        access.setdefault("started_by", actor.pk)
    admit_json(access, what="The access context is malformed", max_bytes=variables_max_bytes())
    _check_variables(definition, variables)
    reason = start_refusal(definition)
    if reason:
        raise InvalidRequest(f"{definition} cannot run here: {reason}")
    return access


def _check_variables(definition: Definition, variables: dict[str, Any]) -> None:
    """Refuse variables that do not match the definition's ``variables`` schema."""
    document_schema = spec_of(definition).document.get("variables")
    if not document_schema:
        return
    try:
        errors = schema_errors(document_schema, variables)
    except ValueError as exc:
        raise InvalidRequest(
            f"{definition} cannot check variables: its 'variables' schema is unusable "
            f"({exc}). Publish a corrected version."
        ) from None
    if errors:
        detail = "; ".join(
            f"{'.'.join(map(str, e.path)) or '(variables)'}: {e.message}" for e in errors[:5]
        )
        raise InvalidRequest(f"Variables do not match {definition}: {detail}.")


class InstanceHeld:
    """The instance lease for an operator's change, released on exit.

    ``with InstanceHeld(instance_id, actor) as run:`` gives the loaded run under a fresh
    lease (``EngineConflict`` while a worker holds it, ``IntegrityStop`` while the instance
    is stopped by an integrity incident). The operator services of this module, of
    ``contract_migrations`` and of the handoffs app's desk make their change inside it.
    """

    def __init__(self, instance_id: int, actor) -> None:
        self.instance_id = instance_id
        self.holder = f"operator:{getattr(actor, 'pk', 'system')}:{worker_name()}"

    def __enter__(self) -> Run:
        try:
            self.fence = lease_acquire(
                key=instance_lease_key(self.instance_id),
                holder=self.holder,
                ttl=operator_lease_ttl(),
            )
        except LeaseHeld:
            raise EngineConflict(
                "A worker is advancing this instance right now; try again in a few seconds."
            ) from None
        run = load_run(self.instance_id, self.fence)
        if run is None:
            lease_release(fence=self.fence)
            raise InvalidRequest(f"No instance has id {self.instance_id}.")
        problem = run.integrity_problem()
        if problem:
            lease_release(fence=self.fence)
            raise IntegrityStop(problem)
        return run

    def __exit__(self, *exc) -> None:
        lease_release_if_held(fence=self.fence)


def instance_cancel(*, instance_id: int, actor, reason: str) -> Instance:
    """Cancel an instance: active tokens are cancelled; nothing external is undone.

    A step whose outcome is unknown is the exception: cancelling cannot say whether its
    effect happened, so it stays ``outcome_unknown`` (its ledger operation too) and its
    case stays open until someone records what happened (effect confirmed or absent). The
    instance's reason says so.
    """
    _require(actor, "engine.operate_instance", "cancel instances")
    reason = (reason or "").strip() if isinstance(reason, str) else reason
    if not reason:
        raise InvalidRequest("Say why the instance is cancelled.")
    admit_text(reason, name="reason", max_length=4000)
    with InstanceHeld(instance_id, actor) as run:
        if run.instance.status in TERMINAL_STATUSES:
            raise EngineConflict(f"Instance {instance_id} is already {run.instance.status}.")
        # A step a dead worker left executing is settled first, so the ledger says what is
        # known about it (outcome unknown if it was dispatched) rather than "dispatched".
        rehydrate(run)
        uncertain = [t for t in run.active.values() if t.state == TokenState.OUTCOME_UNKNOWN]
        note = f"Cancelled by {actor}: {reason}"
        if uncertain:
            steps = ", ".join(f"'{t.node_id}'" for t in uncertain)
            note += (
                f" The outcome of step {steps} is still unknown; its case stays open until "
                "someone records what happened."
            )
        with run.commit():
            for token in list(run.active.values()):
                if token.state == TokenState.OUTCOME_UNKNOWN:
                    continue  # its effect may have happened: the case stays open
                run.update_token(token, token.state, state=TokenState.CANCELLED)
                run.active.pop(token.pk)
            # Its external tasks are no work for anybody now: no worker fetches them.
            ExternalTask.objects.filter(
                instance_id=instance_id,
                state__in=[TaskState.OPEN, TaskState.LOCKED, TaskState.DEAD],
            ).update(state=TaskState.CANCELLED, ended_at=clock())
            run.flush(Router(run), status=InstanceStatus.CANCELLED, reason=note[:4000])
            # Compensations on cancel are recorded with the cancel, never inferred later.
            saga_plan_on_cancel(run)
            to_cancel = linked_cancel_record(run)
    # The other modules are asked to stop their runs after the cancel is durable.
    linked_cancel_send(to_cancel)
    return Instance.objects.get(pk=instance_id)


def step_retry(*, instance_id: int, token_id: int, actor) -> Instance:
    """Deliberately retry a failed step (never an ``outcome_unknown`` one: invariant I3)."""
    _require(actor, "engine.operate_instance", "retry steps")
    with InstanceHeld(instance_id, actor) as run:
        token = Token.objects.filter(pk=token_id, instance_id=instance_id).first()
        if token is None:
            raise InvalidRequest(f"Instance {instance_id} has no step {token_id}.")
        if token.state == TokenState.OUTCOME_UNKNOWN:
            raise EngineConflict(
                "Retry is unavailable while the outcome is unknown: the effect may already "
                "have happened. Record effect confirmed or effect absent with evidence first."
            )
        if token.state != TokenState.FAILED:
            raise EngineConflict(f"Only a failed step can be retried; this one is {token.state}.")
        if run.spec.nodes[token.node_id]["type"] == "external_task":
            # A bare retry would complete the wait without a result.
            raise EngineConflict(
                f"Step '{token.node_id}' waits for an external task: retry its dead-lettered "
                "task instead (external_results.task_retry), which creates a new task."
            )
        if run.instance.status in {InstanceStatus.CANCELLED, InstanceStatus.COMPLETED}:
            raise EngineConflict(
                f"Instance {instance_id} is {run.instance.status}; its steps "
                "are not retried. Start a new instance instead."
            )
        _ledger_allows_retry(run, token)
        with run.commit():
            # poll=0: a deliberate retry executes the action again (same idempotency key);
            # it does not poll an answer the earlier attempt may never have had.
            run.update_token(
                token,
                TokenState.FAILED,
                state=TokenState.READY,
                attempt=token.attempt + 1,
                poll=0,
                not_before=None,
                wait_kind="",
                reason=f"retry requested by {actor}",
            )
            run.active[token.pk] = token
            run.flush(Router(run), status=InstanceStatus.RUNNING, reason="")
            instance_mark_runnable(instance_id)
    return Instance.objects.get(pk=instance_id)


def _ledger_allows_retry(run: Run, token: Token) -> None:
    """Ask the ledger, not the step's row, whether this effect may be tried again.

    Every earlier operation of the effect (same idempotency key) must have ended in a way
    that allows a new attempt: failed, effect absent, or pending. Anything else — in
    flight, unknown, succeeded — means the row was changed behind the ledger's back: an
    integrity incident is opened and the retry refused.
    """
    if not token.idempotency_key:
        return
    effect = fingerprint_value(FingerprintKind.IDEMPOTENCY_KEY, token.idempotency_key)
    blocking = [op for op in operations_for_effect(idempotency_fp=effect) if not op.retryable]
    if not blocking:
        return
    op = blocking[-1]
    exc = LedgerDisagrees(
        f"step '{token.node_id}' is {token.state} in its row, but the ledger's operation "
        f"{op.key} for the same effect is {op.state}",
        operation=op.key,
        state=op.state,
    )
    incident = incident_open(verification=Verification(run.subject, False, 0, None, str(exc)))
    raise IntegrityStop(
        f"Retry refused: {exc}. The step's row was changed behind the ledger's back, so "
        f"integrity incident #{incident.pk} is open; nothing was dispatched."
    )
