"""Stopping an instance for a person: with a reason they can act on, on the fence.

A step that cannot go on — rejected before dispatch, no route out, refused by the ledger
for integrity — blocks the instance here. Nothing in this module dispatches or settles a
step; the modules that do call it.
"""

from __future__ import annotations

import logging

from recovery.api import (
    ChainBroken,
    IntegrityIncidentOpen,
    IntegrityViolation,
    incident_open,
    incident_report,
)

from ..db import in_transaction
from ..models import InstanceStatus, KeptAnswer, Token
from .load import run_reload
from .routing import RouteError, Router
from .run import Run, incident_message
from .writes import ROUTE_INCIDENT

__all__ = [
    "KEPT_NOTE",
    "block",
    "integrity_stop_message",
    "kept_note",
    "leave_or_block",
    "stop_for_integrity",
]

log = logging.getLogger("govflow.engine")

KEPT_NOTE = (
    " A provider's answer was received meanwhile and is kept; it is recorded when the "
    "incident is resolved."
)


def block(run: Run, token: Token | None, kind: str, message: str) -> None:
    """Stop the instance for an operator, with a clear reason, on the fence (owns its
    commit).

    A token that stays ready is not tried again in this run (it would only be rejected
    again); a later run (the sweep re-enqueues blocked instances with ready work) retries
    it, so a step rejected for a reason that went away moves on by itself. Blocking again
    for the same reason changes nothing and opens no second incident.
    """
    if token is not None:
        run.blocked.add(token.pk)
    run.block_reason = message
    if run.instance.status == InstanceStatus.BLOCKED and run.instance.reason == message:
        return
    with run.commit():
        run.engine_incident_open(token, kind, message, once=True)
        run.flush(status=InstanceStatus.BLOCKED, reason=message)
    log.warning("instance %s blocked: %s", run.instance.pk, message)


def leave_or_block(run: Run, token: Token) -> None:
    """Follow the transitions out of ``token``'s completed node, or block the instance.

    Needs the caller's commit, after the node's own facts (an observed success, merged
    output) were written in it: a gateway with no matching branch must not undo them. The
    instance is blocked with the reason instead, for an operator to cancel.
    """
    router = Router(run)
    try:
        router.leave(token.node_id)
    except RouteError as exc:
        message = f"The workflow cannot continue: {exc}."
        run.blocked.add(token.pk)
        run.block_reason = message
        run.engine_incident_open(token, ROUTE_INCIDENT, message, once=True)
        run.flush(status=InstanceStatus.BLOCKED, reason=message)
        log.warning("instance %s blocked: %s", run.instance.pk, message)
        return
    run.flush(router)


def kept_note(run: Run) -> str:
    """What to add to a stop's reason when a provider's answer is kept (reads only)."""
    kept = KeptAnswer.objects.filter(instance_id=run.instance.pk, applied_at__isnull=True)
    return KEPT_NOTE if kept.exists() else ""


def integrity_stop_message(run: Run, exc: IntegrityViolation) -> str:
    """Open (or find) the integrity incident behind ``exc`` and say why the instance
    stopped.

    Outside any transaction (each recovery call owns its commit): the incident must
    outlive the refused commit.
    """
    if isinstance(exc, IntegrityIncidentOpen) and exc.incident_id is not None:
        # Stopped by an incident that is already open (the instance's own, or the whole
        # ledger's): nothing new was found here, so no second incident is opened.
        where = "on the whole ledger" if exc.ledger_wide else "on this instance"
        return incident_message(exc.incident_id, str(exc)[:600], where=where)
    if isinstance(exc, ChainBroken):
        incident = incident_open(verification=exc.result)
    else:
        incident = incident_report(subject=run.subject, reason=str(exc))
    run.integrity_incident = incident.pk
    return incident_message(incident.pk, str(exc)[:600])


def chained_refusal_kept(run: Run, cause: IntegrityViolation) -> None:
    """After a chained dispatch was refused (``dispatch.ChainedDispatchRefused``; its commit
    rolled back, no transaction open): when the cause is a broken chain, found by the
    verification a run's first dispatch makes (ADR 0052), open its integrity incident now.
    The step's dispatch in a commit of its own verifies nothing (it only reads the head),
    so without the incident it would go out on a chain nobody can vouch for; with it, the
    ledger refuses that dispatch and the loop stops the instance."""
    if isinstance(cause, ChainBroken) and not in_transaction():
        run.integrity_incident = incident_open(verification=cause.result).pk


def stop_for_integrity(run: Run, token: Token, exc: IntegrityViolation, note: str = "") -> None:
    """The ledger refused a step for integrity: stop the instance for people, say why.

    Owns its commits. The refused commit rolled back, so the run's view is read again
    first; the incident is opened (or found) outside any transaction so that it stays.
    """
    log.error("instance %s, step '%s': %s", run.instance.pk, token.node_id, exc)
    run_reload(run)
    message = integrity_stop_message(run, exc)
    block(run, run.active.get(token.pk, token), "integrity", f"{message}{note}"[:2000])
