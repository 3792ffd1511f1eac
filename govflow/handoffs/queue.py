"""The operator's work queue (the admin's home page): what needs a person, oldest first.

Reads only (selectors). Each section is a count and its oldest rows, read with a fixed
number of queries whatever the number of rows: a count and a ``LIMIT``-ed list per section,
narrowed to the user's tenants (:mod:`.tenants`) and the page's filters.
"""

from __future__ import annotations

from django.db.models import CharField, Count, Q, QuerySet, Value
from django.db.models.functions import Cast, Concat
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from govflow.engine.external_tasks import ExternalTask, TaskState
from govflow.engine.models import Definition, Incident, Token
from govflow.engine.projection import SUBJECT_TYPE
from govflow.engine.services.definitions import trusted_spec
from govflow.engine.states import InstanceStatus, TokenState, WaitKind
from govflow.engine.tenancy import instances_of, scope
from govflow.events.models import Delivery, DeliveryState
from recovery.api import (
    compensations_waiting,
    decisions_requested,
    incidents_open,
    leases_stale,
    operation_keys_of_action,
)

from . import queue_rows as rows
from .queue_rows import Filters, Section

LIMIT = 10
"""Rows listed per section; the count says how many there are."""

APPROVE_DECISION = "recovery.approve_decision"
REQUEST_DECISION = "recovery.request_decision"


class Queue:
    """The sections of one user's work queue under ``filters``."""

    def __init__(self, user, filters: Filters) -> None:
        self.user = user
        self.filters = filters
        self.cutoff = timezone.now() - filters.older_than if filters.older_than else None
        instances = instances_of(user)
        if filters.tenant:
            instances = instances.filter(tenant=filters.tenant)
        if filters.definition:
            instances = instances.filter(definition__key=filters.definition)
        self.instances = instances

    def subject_ids(self) -> QuerySet:
        return self.instances.annotate(sid=Cast("pk", CharField())).values("sid")

    def older(self, queryset: QuerySet, field_name: str) -> QuerySet:
        if self.cutoff is None:
            return queryset
        return queryset.filter(**{f"{field_name}__lte": self.cutoff})

    def sections(self) -> list[Section]:
        return [
            self.unknown(),
            self.decisions_to_approve(),
            self.batches_to_approve(),
            self.my_requests(),
            self.approvals(),
            self.compensations(),
            self.integrity_incidents(),
            self.engine_incidents(),
            self.stuck_instances(),
            self.stale_leases(),
            self.dead_tasks(),
            self.dead_webhooks(),
        ]

    @staticmethod
    def fill(section: Section, queryset: QuerySet, row) -> Section:
        section.count = queryset.count()
        section.rows = [row(item) for item in queryset[:LIMIT]] if section.count else []
        return section

    # -- the sections -------------------------------------------------------------------

    def unknown(self) -> Section:
        tokens = Token.objects.filter(
            state=TokenState.OUTCOME_UNKNOWN, instance__in=self.instances.values("pk")
        )
        if self.filters.action:
            tokens = tokens.filter(operation_key__in=operation_keys_of_action(self.filters.action))
        tokens = self.older(tokens, "updated_at").select_related("instance__definition")
        section = Section(
            "unknown",
            _("Outcome unknown"),
            _("Steps whose effect nobody knows: decide what happened, with evidence."),
            url=reverse("admin:engine_token_changelist") + "?state__exact=outcome_unknown",
            by_action=True,
        )
        return self.fill(section, tokens.order_by("updated_at", "pk"), rows.token_row)

    def _decisions(self) -> QuerySet:
        decisions = decisions_requested().filter(
            operation__subject_type=SUBJECT_TYPE, operation__subject_id__in=self.subject_ids()
        )
        if self.filters.action:
            decisions = decisions.filter(operation__action=self.filters.action)
        return self.older(decisions, "requested_at")

    def decisions_to_approve(self) -> Section:
        section = Section(
            "approve",
            _("Decisions awaiting my approval"),
            _("Another person's decision on an unknown outcome; never your own."),
            by_action=True,
        )
        if not self.user.has_perm(APPROVE_DECISION):
            return section
        decisions = self._decisions().exclude(requested_by=self.user)
        return self.fill(section, decisions, rows.decision_row)

    def batches_to_approve(self) -> Section:
        """Batches of decisions (bulk triage) another person asked me to approve whole."""
        from .models import BatchState, DecisionBatch

        section = Section(
            "batches",
            _("Batches awaiting my approval"),
            _("Several decisions of one kind, approved or rejected as a whole; never your own."),
            url=reverse("admin:handoffs_decisionbatch_changelist") + "?state__exact=requested",
        )
        if not self.user.has_perm(APPROVE_DECISION):
            return section
        batches = DecisionBatch.objects.filter(state=BatchState.REQUESTED).exclude(
            requested_by=self.user
        )
        if self.filters.tenant:
            batches = batches.filter(tenant=self.filters.tenant)
        if self.filters.definition:
            batches = batches.filter(definition__key=self.filters.definition)
        if self.filters.action:
            batches = batches.filter(action=self.filters.action)
        batches = scope(self.older(batches, "requested_at"), self.user)
        batches = batches.select_related("requested_by").annotate(n=Count("items"))
        return self.fill(section, batches.order_by("requested_at", "pk"), rows.batch_row)

    def my_requests(self) -> Section:
        section = Section(
            "requests",
            _("My open requests"),
            _("Decisions you asked for that a second person has not yet approved."),
            by_action=True,
        )
        if not self.user.has_perm(REQUEST_DECISION):
            return section
        decisions = self._decisions().filter(requested_by=self.user)
        return self.fill(section, decisions, rows.decision_row)

    def compensations(self) -> Section:
        """Compensations of ended instances that wait for a person (saga handoffs)."""
        section = Section(
            "compensations",
            _("Compensations waiting for a person"),
            _("Undoing an effect failed, has an unknown outcome, or needs two people."),
            by_action=True,
        )
        waiting = compensations_waiting(subject_type=SUBJECT_TYPE).filter(
            subject_id__in=self.subject_ids()
        )
        if self.filters.action:
            waiting = waiting.filter(operation__action=self.filters.action)
        return self.fill(
            section, self.older(waiting, "operation__updated_at"), rows.compensation_row
        )

    def approvals(self) -> Section:
        """Human tasks waiting for a decision the user holds the node's permission for."""
        section = Section(
            "approvals",
            _("Waiting approvals I may decide"),
            _("Human tasks (e.g. a permit) waiting for someone with the permission."),
        )
        waiting = Token.objects.filter(
            state=TokenState.WAITING,
            wait_kind=WaitKind.APPROVAL,
            instance__in=self.instances.values("pk"),
        )
        waiting = self.older(waiting, "updated_at")
        groups = list(
            waiting.values_list("instance__definition_id", "node_id").annotate(n=Count("pk"))
        )
        definitions = Definition.objects.in_bulk({pk for pk, _, _ in groups})
        allowed = Q(pk__in=[])
        for definition_id, node_id, _n in groups:
            node = trusted_spec(definitions[definition_id]).nodes.get(node_id, {})
            permission = node.get("permission")
            if permission and self.user.has_perm(permission):
                allowed |= Q(instance__definition_id=definition_id, node_id=node_id)
        tokens = waiting.filter(allowed).select_related("instance__definition")
        return self.fill(section, tokens.order_by("updated_at", "pk"), rows.token_row)

    def integrity_incidents(self) -> Section:
        incidents = incidents_open().filter(
            subject_type=SUBJECT_TYPE, subject_id__in=self.subject_ids()
        )
        section = Section(
            "integrity",
            _("Open integrity incidents"),
            _("A broken chain or contradictory fact: no success is recorded until resolved."),
            url=reverse("admin:recovery_integrityincident_changelist") + "?status__exact=open",
        )
        return self.fill(section, self.older(incidents, "detected_at"), rows.integrity_row)

    def engine_incidents(self) -> Section:
        incidents = Incident.objects.filter(
            resolved_at__isnull=True, instance__in=self.instances.values("pk")
        ).select_related("instance__definition")
        section = Section(
            "incidents",
            _("Open engine incidents"),
            _("Why an instance stopped: a failed step, a bad gate, a dead letter."),
            url=reverse("admin:engine_incident_changelist"),
        )
        incidents = self.older(incidents, "created_at").order_by("created_at", "pk")
        return self.fill(section, incidents, rows.incident_row)

    def stuck_instances(self) -> Section:
        stuck = self.instances.filter(
            status__in=[InstanceStatus.BLOCKED, InstanceStatus.FAILED]
        ).select_related("definition")
        section = Section(
            "stuck",
            _("Failed or blocked instances"),
            _("Instances that go no further without an operator."),
            url=reverse("admin:engine_instance_changelist") + "?status__in=blocked,failed",
        )
        stuck = self.older(stuck, "updated_at").order_by("updated_at", "pk")
        return self.fill(section, stuck, rows.instance_row)

    def stale_leases(self) -> Section:
        # The lease of instance N is "instance:N" (the engine's lease key).
        keys = self.instances.annotate(
            lease_key=Concat(Value("instance:"), Cast("pk", CharField()))
        ).values("lease_key")
        leases = leases_stale().filter(key__in=keys)
        section = Section(
            "leases",
            _("Stale leases"),
            _("Held by a worker that stopped before it expired; the sweep takes them over."),
        )
        return self.fill(section, self.older(leases, "expires_at"), rows.lease_row)

    def dead_tasks(self) -> Section:
        tasks = ExternalTask.objects.filter(
            state=TaskState.DEAD, instance__in=self.instances.values("pk")
        ).select_related("instance__definition")
        section = Section(
            "dead",
            _("Retries exhausted"),
            _("External tasks dead-lettered: retry the step or cancel the instance."),
        )
        tasks = self.older(tasks, "ended_at").order_by("ended_at", "pk")
        return self.fill(section, tasks, rows.task_row)

    def dead_webhooks(self) -> Section:
        deliveries = scope(
            Delivery.objects.filter(state=DeliveryState.DEAD), self.user, "subscription__tenant"
        ).select_related("event", "subscription")
        if self.filters.tenant:
            deliveries = deliveries.filter(subscription__tenant=self.filters.tenant)
        section = Section(
            "webhooks",
            _("Undeliverable webhook events"),
            _(
                "Events a receiving system did not accept within the budget: repair it, "
                "then deliver them again."
            ),
            url=reverse("admin:events_delivery_changelist") + "?state__exact=dead",
        )
        deliveries = self.older(deliveries, "dead_at").order_by("dead_at", "pk")
        return self.fill(section, deliveries, rows.webhook_row)
