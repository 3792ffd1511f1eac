"""Request and response shapes of the webhook endpoints (``/api/v1/webhooks/…``)."""

from __future__ import annotations

from rest_framework import serializers

from govflow.events.models import EventType

from .request_shape import RequestShape
from .serializers import TenantField


class WebhookCreateRequest(RequestShape):
    name = serializers.CharField(max_length=100, help_text="What the receiving system is.")
    url = serializers.CharField(
        max_length=2000,
        help_text="Where events are POSTed: https://, a public host (see the guide).",
    )
    event_types = serializers.ListField(
        child=serializers.ChoiceField(choices=EventType.values),
        required=False,
        default=list,
        max_length=len(EventType.values),
        help_text="The event types to deliver; empty or left out: every type.",
    )
    tenant = TenantField()


class Webhook(serializers.Serializer):
    id = serializers.IntegerField()
    url = serializers.CharField(help_text="This subscription's own URL in the API.")
    name = serializers.CharField()
    target = serializers.CharField(help_text="Where events are delivered.")
    tenant = serializers.CharField()
    event_types = serializers.ListField(child=serializers.CharField())
    active = serializers.BooleanField()
    created_at = serializers.DateTimeField()
    pending = serializers.IntegerField(help_text="Deliveries waiting to be made.")
    dead_letters = serializers.IntegerField(
        help_text="Deliveries that failed for good: an operator delivers them again."
    )


class WebhookWithSecret(Webhook):
    secret = serializers.CharField(
        allow_null=True,
        help_text="The signing secret, shown in this answer only (GovFlow does not keep "
        "it). Null in a replayed answer: rotate the secret if the first answer was lost.",
    )
