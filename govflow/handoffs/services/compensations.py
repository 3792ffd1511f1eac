"""The desk's side of compensations: start them, approve them, settle an uncertain one.

Each reuses the recovery core's decisions (a request by one person, an approval by a
second, the four-eyes constraint and the permissions of decisions) and queues the
instance, whose saga (``govflow.engine.services.saga``) then runs what may run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from govflow.engine.db import engine_commit
from govflow.engine.errors import EngineConflict, InvalidRequest, NotPermitted
from govflow.engine.models import Instance, InstanceStatus
from govflow.engine.projection import instance_subject
from govflow.engine.queue import instance_mark_runnable
from govflow.engine.services.instances import InstanceHeld
from govflow.engine.services.saga import DONE, saga_plan
from recovery.api import (
    CompensationView,
    DecisionKind,
    OperationState,
    compensation_approve,
    compensations_of,
    decision_approve,
    decision_get,
    decision_request,
)

__all__ = [
    "compensation_approve_run",
    "compensation_outcome_approve",
    "compensation_outcome_request",
    "compensation_request_run",
    "compensations_start",
]

ENDED = (InstanceStatus.CANCELLED, InstanceStatus.FAILED)


def _instance(instance_id: int) -> Instance:
    instance = Instance.objects.filter(pk=instance_id).first()
    if instance is None:
        raise InvalidRequest(f"No instance has id {instance_id}.")
    return instance


def _of(instance: Instance, key: str) -> tuple[CompensationView, list[CompensationView]]:
    views = compensations_of(instance_subject(instance.pk))
    found = next((view for view in views if view.key == key), None)
    if found is None:
        raise InvalidRequest(f"Instance {instance.pk} has no compensation {key}.")
    return found, views


def _queue(instance_id: int) -> None:
    with engine_commit():
        instance_mark_runnable(instance_id)


def compensations_start(*, instance_id: int, actor) -> list[str]:
    """An operator starts the compensations of an ended instance (trigger ``operator``).

    Records an intent for every succeeded step whose node declares ``compensate_on`` and
    that has none yet; returns their keys. They then run as their policy says.
    """
    if not actor.has_perm("engine.operate_instance"):
        raise NotPermitted(f"{actor} may not start compensations.")
    with InstanceHeld(instance_id, actor) as run:
        if run.instance.status not in ENDED:
            raise EngineConflict(
                f"Instance {instance_id} is {run.instance.status}; compensations are started "
                "for a cancelled or failed instance only. Cancel it first."
            )
        with engine_commit():
            keys = saga_plan(run, "operator")
            if keys:
                instance_mark_runnable(instance_id)
    if not keys:
        raise EngineConflict(
            f"Instance {instance_id} has no succeeded step left to compensate: each one "
            "that declares a compensation has its compensation already (or none is declared)."
        )
    return keys


def compensation_request_run(*, instance_id: int, key: str, actor, rationale: str) -> Any:
    """Ask a second person to approve running compensation ``key`` (the next in line)."""
    instance = _instance(instance_id)
    view, views = _of(instance, key)
    if view.state != OperationState.PREPARED or view.approved:
        raise EngineConflict(
            f"Compensation {key} is {view.state}"
            f"{' and approved' if view.approved else ''}: there is nothing to approve."
        )
    ahead = [v for v in views[: views.index(view)] if v.state not in DONE]
    if ahead:
        raise EngineConflict(
            f"Compensation {ahead[0].key} (step '{ahead[0].step_id}') runs first; its "
            "approval would not hold once that one runs. Approve them in the order shown."
        )
    return decision_request(
        operation_key=key,
        kind=DecisionKind.COMPENSATE,
        rationale=rationale,
        requested_by=actor,
    )


def compensation_approve_run(
    *, decision_id: int, actor, instance_id: int, shown_revision: int, shown_preview_fp: str
) -> Any:
    """A second person approves running a compensation, bound to what they were shown:
    the instance's revision and the compensation's preview fingerprint on their page."""
    decision = decision_get(decision_id=decision_id, subject=instance_subject(instance_id))
    if decision is None:
        raise InvalidRequest(f"Instance {instance_id} has no decision {decision_id}.")
    instance = _instance(instance_id)
    approved = compensation_approve(
        decision_id=decision_id,
        approved_by=actor,
        shown_revision=shown_revision,
        shown_preview_fp=shown_preview_fp,
        tenant=instance.tenant,
    )
    _queue(instance.pk)
    return approved


def compensation_outcome_request(
    *,
    instance_id: int,
    key: str,
    kind: str,
    rationale: str,
    actor,
    evidence: Sequence = (),
    checks: dict[str, str] | None = None,
) -> Any:
    """Record what happened to a compensation of unknown outcome (needs a second person)."""
    view, _ = _of(_instance(instance_id), key)
    if view.state != OperationState.OUTCOME_UNKNOWN:
        raise EngineConflict(f"Compensation {key} is {view.state}, not of unknown outcome.")
    if kind not in (DecisionKind.EFFECT_CONFIRMED, DecisionKind.EFFECT_ABSENT):
        raise InvalidRequest("Record either effect confirmed or effect absent.")
    return decision_request(
        operation_key=key,
        kind=kind,
        rationale=rationale,
        requested_by=actor,
        evidence=evidence,
        checks=checks,
    )


def compensation_outcome_approve(*, decision_id: int, actor, instance_id: int) -> Any:
    """Approve another person's record of a compensation's outcome; the saga goes on."""
    decision = decision_get(decision_id=decision_id, subject=instance_subject(instance_id))
    if decision is None or not decision.operation.key.startswith("cmp-"):
        raise InvalidRequest(f"Instance {instance_id} has no compensation decision {decision_id}.")
    if decision.kind == DecisionKind.COMPENSATE:
        raise InvalidRequest("Approve running a compensation with what its preview shows.")
    approved = decision_approve(decision_id=decision_id, approved_by=actor)
    _queue(int(approved.operation.subject_id))
    return approved
