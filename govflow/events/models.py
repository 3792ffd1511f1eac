"""The outbox's rows: events, each instance's event counter, subscriptions, deliveries.

Events hold ids, types, states and a per-instance sequence number — never a step's input,
output, error text or a secret (invariant I1 holds here too). A subscription stores no
secret: only the salt and key id its signing secret is derived from (``signing.py``).
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.utils.translation import gettext_lazy as _


class EventType(models.TextChoices):
    """Persisted names: stable, never renamed or reused."""

    INSTANCE_STARTED = "instance.started", _("Instance started")
    INSTANCE_COMPLETED = "instance.completed", _("Instance completed")
    INSTANCE_FAILED = "instance.failed", _("Instance failed")
    INSTANCE_CANCELLED = "instance.cancelled", _("Instance cancelled")
    STEP_BLOCKED = "step.blocked", _("Step blocked")
    STEP_UNBLOCKED = "step.unblocked", _("Step unblocked")
    HANDOFF_OPENED = "handoff.opened", _("Handoff opened")
    HANDOFF_DECIDED = "handoff.decided", _("Handoff decided")
    INCIDENT_OPENED = "incident.opened", _("Incident opened")
    INCIDENT_RESOLVED = "incident.resolved", _("Incident resolved")
    COMPENSATION_RECORDED = "compensation.recorded", _("Compensation recorded")


class Event(models.Model):
    """One engine event, written in the commit of the transition that caused it."""

    event_id = models.UUIDField(_("event id"), unique=True, default=uuid.uuid4, editable=False)
    type = models.CharField(_("type"), max_length=40, choices=EventType.choices)
    tenant = models.CharField(_("tenant"), max_length=100)
    instance_id = models.BigIntegerField(_("instance"))
    seq = models.PositiveIntegerField(_("sequence"))
    data = models.JSONField(_("data"), default=dict)
    created_at = models.DateTimeField(_("occurred at"))
    fanned_out = models.BooleanField(_("fanned out"), default=False)
    """The publisher made its deliveries (one per matching subscription)."""

    class Meta:
        verbose_name = _("event")
        verbose_name_plural = _("events")
        constraints = [
            models.UniqueConstraint(fields=["instance_id", "seq"], name="event_instance_seq"),
        ]
        indexes = [
            models.Index(
                fields=["id"],
                name="event_not_fanned_out",
                condition=models.Q(fanned_out=False),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.type} #{self.seq} of instance {self.instance_id}"


class EventCounter(models.Model):
    """The last sequence number given to an instance's events.

    Taken with an upsert in the event's own commit: its row lock orders two commits that
    emit events for the same instance, so a number is visible only after every smaller one
    of its instance has committed, and a rolled-back commit leaves no gap.
    """

    instance_id = models.BigIntegerField(primary_key=True)
    last_seq = models.PositiveIntegerField(default=0)

    class Meta:
        verbose_name = _("event counter")
        verbose_name_plural = _("event counters")

    def __str__(self) -> str:
        return f"instance {self.instance_id}: {self.last_seq}"


class Subscription(models.Model):
    """A webhook: where a tenant's events of some types are delivered, signed."""

    name = models.CharField(_("name"), max_length=100)
    url = models.CharField(_("URL"), max_length=2000)
    tenant = models.CharField(_("tenant"), max_length=100)
    event_types = models.JSONField(
        _("event types"),
        default=list,
        blank=True,
        help_text=_("The event types delivered; empty: every type."),
    )
    active = models.BooleanField(_("active"), default=True)
    secret_salt = models.CharField(max_length=64, editable=False)
    secret_key_id = models.CharField(max_length=32, editable=False)
    created_at = models.DateTimeField(_("created at"))
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        verbose_name=_("created by"),
    )
    created_by_key = models.CharField(_("created by API key"), max_length=100, blank=True)

    class Meta:
        verbose_name = _("webhook subscription")
        verbose_name_plural = _("webhook subscriptions")

    def __str__(self) -> str:
        return f"{self.name} ({self.tenant})"

    def wants(self, event_type: str) -> bool:
        return not self.event_types or event_type in self.event_types


class DeliveryState(models.TextChoices):
    PENDING = "pending", _("Pending")
    DELIVERED = "delivered", _("Delivered")
    DEAD = "dead", _("Dead letter")


class Delivery(models.Model):
    """One event for one subscription: attempted until delivered or dead-lettered."""

    subscription = models.ForeignKey(
        Subscription,
        on_delete=models.PROTECT,
        related_name="deliveries",
        verbose_name=_("subscription"),
    )
    event = models.ForeignKey(
        Event, on_delete=models.PROTECT, related_name="deliveries", verbose_name=_("event")
    )
    instance_id = models.BigIntegerField(_("instance"))
    seq = models.PositiveIntegerField(_("sequence"))
    state = models.CharField(
        _("state"), max_length=16, choices=DeliveryState.choices, default=DeliveryState.PENDING
    )
    attempts = models.PositiveIntegerField(_("attempts"), default=0)
    next_attempt_at = models.DateTimeField(_("next attempt at"))
    last_outcome = models.CharField(_("last outcome"), max_length=200, blank=True)
    created_at = models.DateTimeField(_("created at"))
    updated_at = models.DateTimeField(_("updated at"))
    delivered_at = models.DateTimeField(_("delivered at"), null=True, blank=True)
    dead_at = models.DateTimeField(_("dead-lettered at"), null=True, blank=True)
    redelivered_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        verbose_name=_("delivered again by"),
    )

    class Meta:
        verbose_name = _("webhook delivery")
        verbose_name_plural = _("webhook deliveries")
        constraints = [
            models.UniqueConstraint(
                fields=["subscription", "event"], name="delivery_subscription_event"
            ),
        ]
        indexes = [
            models.Index(fields=["state", "next_attempt_at"], name="delivery_due"),
            models.Index(
                fields=["subscription", "instance_id", "seq"], name="delivery_instance_order"
            ),
        ]
        permissions = [
            ("redeliver_delivery", _("Can deliver a dead-lettered webhook event again")),
        ]

    def __str__(self) -> str:
        return f"{self.event} → {self.subscription}"
