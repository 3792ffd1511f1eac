"""The engine's events: what a transition an integration may subscribe to writes.

Each function writes one event row through ``govflow.events`` inside the caller's commit
(the transition's own), so the event commits or rolls back with it (ADR 0032). They are
called from the few places those transitions are committed: ``Run.commit`` for an
instance's status (completed, failed, cancelled, blocked and unblocked), ``Run.update_token``
for a step entering or leaving ``outcome_unknown`` (a handoff opened or decided),
``Run.engine_incident_open``, ``instance_start``, the saga's intent and the desk's
resolution of incidents. A plain step that succeeds and moves on emits nothing: the
checks here are comparisons of values the run already holds.

Events carry ids, names and states only: never variables, inputs, outputs, reasons or
error texts.
"""

from __future__ import annotations

from typing import Any

from govflow.events.record import EventType, event_parts, event_record

from .models import Incident, Instance, Token
from .projection import SUBJECT_TYPE
from .states import InstanceStatus, TokenState, WaitKind

__all__ = [
    "compensation_recorded",
    "incident_opened",
    "incident_resolved",
    "instance_started",
    "instance_started_parts",
    "integrity_incident_opened",
    "integrity_incident_resolved",
    "moves_a_handoff",
    "status_changed",
    "status_changed_parts",
    "token_moved",
]

_ENDED = {
    InstanceStatus.COMPLETED: EventType.INSTANCE_COMPLETED,
    InstanceStatus.FAILED: EventType.INSTANCE_FAILED,
    InstanceStatus.CANCELLED: EventType.INSTANCE_CANCELLED,
}
_STOPPED = (TokenState.OUTCOME_UNKNOWN, TokenState.FAILED)


def _emit(instance: Instance, type: str, **data: Any) -> None:
    event_record(
        type=type,
        instance_id=instance.pk,
        tenant=instance.tenant,
        data={"instance": instance.pk, **data},
    )


def _parts(instance: Instance, type: str, **data: Any) -> tuple[list[str], list[object]]:
    """:func:`_emit`'s event as ``WITH`` parts, not written (``events.record.event_parts``)."""
    return event_parts(
        type=type,
        instance_id=instance.pk,
        tenant=instance.tenant,
        data={"instance": instance.pk, **data},
    )


def instance_started(instance: Instance, *, definition: str, version: int) -> None:
    """``instance.started`` (needs the start's commit)."""
    _emit(
        instance,
        EventType.INSTANCE_STARTED,
        definition=definition,
        version=version,
        status=str(instance.status),
    )


def instance_started_parts(
    instance: Instance, *, definition: str, version: int
) -> tuple[list[str], list[object]]:
    """:func:`instance_started`'s writes as ``WITH`` parts of the start's one statement
    (PostgreSQL, ADR 0058; ``events.record.event_parts``), not run."""
    return _parts(
        instance,
        EventType.INSTANCE_STARTED,
        definition=definition,
        version=version,
        status=str(instance.status),
    )


def status_changed(run, before: str) -> None:
    """The event of an instance's status moving from ``before``, if any (needs the commit).

    Ended: ``instance.<status>``; blocked: ``step.blocked`` with the steps that stopped;
    moving again after a block: ``step.unblocked``. Running and waiting are no events.
    """
    found = _status_event(run, before)
    if found is not None:
        _emit(run.instance, found[0], **found[1])


def status_changed_parts(run, before: str) -> tuple[list[str], list[object]] | None:
    """:func:`status_changed`'s event as ``WITH`` parts, not written (PostgreSQL): for the
    commit that ends an instance, in the statement of its lease's release (ADR 0059).
    None when the move is no event."""
    found = _status_event(run, before)
    if found is None:
        return None
    return _parts(run.instance, found[0], **found[1])


def _status_event(run, before: str) -> tuple[str, dict[str, Any]] | None:
    after = str(run.instance.status)
    if after == before:
        return None
    # Read from the document with .get: a run that stops because its stored definition
    # was changed or garbled (ADR 0008) still emits its event.
    key, version = run.spec.document.get("key"), run.spec.document.get("version")
    common = {
        "definition": key if isinstance(key, str) else None,
        "version": version if isinstance(version, int) else None,
        "status": after,
        "previous_status": before,
    }
    if after in _ENDED:
        return _ENDED[after], common
    if after == InstanceStatus.BLOCKED:
        steps = sorted(
            {t.node_id for t in run.active.values() if t.pk in run.blocked or t.state in _STOPPED}
        )
        return EventType.STEP_BLOCKED, {"steps": steps, **common}
    if before == InstanceStatus.BLOCKED:
        return EventType.STEP_UNBLOCKED, common
    return None


def moves_a_handoff(token: Token, expected: str, target: str, wait_kind: Any) -> bool:
    """Whether a step's move opens or closes a handoff (compares values in hand only)."""
    if target == expected:
        return False
    return (
        TokenState.OUTCOME_UNKNOWN in (target, expected)
        or wait_kind == WaitKind.POLL
        or (expected == TokenState.EXECUTING and token.poll > 0)
    )


def token_moved(run, token: Token, expected: str, target: str, wait_kind: Any = None) -> None:
    """The handoff events of a step's move (needs the caller's commit; before the token
    takes the new values).

    Two kinds of handoff, as the REST API lists them: ``outcome_unknown`` opens when a
    step's outcome becomes unknown and is decided when it leaves that state (confirmed,
    absent, cancelled, or settled by its provider); ``pending_provider`` opens when a
    provider first answers pending and is decided when a poll's answer ends the waiting
    (the step completed, failed, or its outcome became unknown: then the unknown outcome's
    handoff opens right after it). Further polls and a retry's wait are no events.
    """
    unknown = TokenState.OUTCOME_UNKNOWN
    common = {"step": token.node_id, "token": token.pk, "operation": token.operation_key or None}
    polled = expected == TokenState.EXECUTING and token.poll > 0
    if wait_kind == WaitKind.POLL and target == TokenState.READY and not polled:
        _emit(
            run.instance,
            EventType.HANDOFF_OPENED,
            kind="pending_provider",
            state="pending",
            **common,
        )
    if polled and target in (TokenState.COMPLETED, TokenState.FAILED, unknown):
        _emit(
            run.instance,
            EventType.HANDOFF_DECIDED,
            kind="pending_provider",
            state=str(target),
            **common,
        )
    if unknown in (target, expected):
        type = EventType.HANDOFF_OPENED if target == unknown else EventType.HANDOFF_DECIDED
        _emit(run.instance, type, kind="outcome_unknown", state=str(target), **common)


def incident_opened(instance: Instance, incident: Incident) -> None:
    """``incident.opened`` for an engine incident (needs the caller's commit)."""
    _emit(
        instance,
        EventType.INCIDENT_OPENED,
        incident=incident.pk,
        kind=incident.kind,
        step=incident.token.node_id if incident.token is not None else None,
    )


def incident_resolved(instance: Instance, *, incident: int, kind: str) -> None:
    """``incident.resolved`` (needs the resolution's commit)."""
    _emit(instance, EventType.INCIDENT_RESOLVED, incident=incident, kind=kind)


def integrity_incident_opened(incident) -> None:
    """``incident.opened`` for an integrity incident the recovery core opened on an
    instance's subject, in the commit that opened it (``recovery.api.incident_listen``;
    that commit may be the core's own). ``integrity_incident`` is the core's incident id,
    which the desk's resolution names; ``incident`` is null (no engine incident)."""
    if incident.subject_type != SUBJECT_TYPE or not str(incident.subject_id).isdecimal():
        return
    instance = Instance.objects.filter(pk=int(incident.subject_id)).only("pk", "tenant").first()
    if instance is None:
        return
    _emit(
        instance,
        EventType.INCIDENT_OPENED,
        incident=None,
        integrity_incident=incident.pk,
        kind="integrity",
        step=None,
    )


def integrity_incident_resolved(instance: Instance, *, incident: int) -> None:
    """``incident.resolved`` for the recovery core's integrity incident (needs the
    resolution's commit)."""
    _emit(
        instance,
        EventType.INCIDENT_RESOLVED,
        incident=None,
        integrity_incident=incident,
        kind="integrity",
    )


def compensation_recorded(run, *, key: str, original: str, action: str, trigger: str) -> None:
    """``compensation.recorded``: an intent to undo an effect (needs the saga's commit)."""
    _emit(
        run.instance,
        EventType.COMPENSATION_RECORDED,
        compensation=key,
        original=original,
        action=action,
        trigger=trigger,
    )
