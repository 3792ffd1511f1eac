"""The work queue's rows and sections: what one line of a section says and links to."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from govflow.engine.external_tasks import ExternalTask
from govflow.engine.models import Incident, Instance, Token
from recovery.api import DecisionKind


@dataclass(frozen=True)
class Filters:
    """The page's filters, already validated (empty: not filtered)."""

    tenant: str = ""
    definition: str = ""
    action: str = ""
    older_than: dt.timedelta | None = None


@dataclass
class Row:
    label: str
    detail: str
    url: str
    since: dt.datetime | None

    @property
    def age(self) -> dt.timedelta | None:
        return None if self.since is None else timezone.now() - self.since


@dataclass
class Section:
    key: str
    title: Any
    help: Any
    count: int = 0
    rows: list[Row] = field(default_factory=list)
    url: str = ""
    by_action: bool = False


def instance_url(instance_id: int | str) -> str:
    return reverse("admin:engine_instance_change", args=[instance_id])


def instance_label(instance: Instance) -> str:
    """How a row names its instance: "Building permit #3" (the definition's key when it
    has no title)."""
    return f"{instance.definition.title or instance.definition.key} #{instance.pk}"


def token_row(token: Token) -> Row:
    instance = token.instance
    return Row(
        instance_label(instance),
        f"{token.node_id} · {instance.tenant}",
        instance_url(instance.pk),
        token.updated_at,
    )


def decision_row(decision) -> Row:
    operation = decision.operation
    return Row(
        f"{decision.get_kind_display()} — {operation.action}",
        _("step %(step)s, asked by %(who)s")
        % {"step": operation.step_id, "who": decision.requested_by},
        instance_url(operation.subject_id),
        decision.requested_at,
    )


def batch_row(batch) -> Row:
    return Row(
        _("Batch %(id)s: %(kind)s on %(n)s step(s) of %(action)s")
        % {
            "id": batch.pk,
            "n": batch.n,
            "kind": DecisionKind(batch.kind).label,
            "action": batch.action,
        },
        _("tenant %(tenant)s, asked by %(who)s")
        % {"tenant": batch.tenant, "who": batch.requested_by},
        reverse("admin:handoffs_decisionbatch_change", args=[batch.pk]),
        batch.requested_at,
    )


def integrity_row(incident) -> Row:
    return Row(
        _("Instance %(id)s") % {"id": incident.subject_id},
        incident.reason[:120],
        reverse("admin:recovery_integrityincident_change", args=[incident.pk]),
        incident.detected_at,
    )


def incident_row(incident: Incident) -> Row:
    instance = incident.instance
    return Row(
        instance_label(instance),
        f"{incident.kind}: {incident.message[:120]}",
        instance_url(instance.pk),
        incident.created_at,
    )


def instance_row(instance: Instance) -> Row:
    return Row(
        instance_label(instance),
        f"{instance.get_status_display()} · {instance.tenant} · {instance.reason[:100]}",
        instance_url(instance.pk),
        instance.updated_at,
    )


def lease_row(lease) -> Row:
    instance_id = lease.key.removeprefix("instance:")
    return Row(
        _("Instance %(id)s") % {"id": instance_id},
        _("held by %(holder)s, fence %(fence)s") % {"holder": lease.holder, "fence": lease.fence},
        instance_url(instance_id),
        lease.expires_at,
    )


def task_row(task: ExternalTask) -> Row:
    instance = task.instance
    return Row(
        instance_label(instance),
        f"{task.topic}: {task.last_error[:100]}",
        instance_url(instance.pk),
        task.ended_at,
    )


def compensation_row(intent) -> Row:
    operation = intent.operation
    state = (
        _("awaiting approval")
        if operation.state == "prepared"
        else operation.get_state_display().lower()
    )
    return Row(
        _("Instance %(id)s") % {"id": intent.subject_id},
        _("undo '%(step)s' by %(action)s: %(state)s")
        % {"step": operation.step_id, "action": operation.action, "state": state},
        instance_url(intent.subject_id) + "#compensations-heading",
        operation.updated_at,
    )


def webhook_row(delivery) -> Row:
    event = delivery.event
    return Row(
        _("Webhook %(name)s: instance %(id)s")
        % {"name": delivery.subscription.name, "id": delivery.instance_id},
        f"{event.type} #{event.seq} · {delivery.last_outcome}",
        reverse("admin:events_delivery_change", args=[delivery.pk]),
        delivery.dead_at,
    )
