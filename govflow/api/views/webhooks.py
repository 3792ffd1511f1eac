"""Webhook subscriptions: register, read, pause and resume, rotate the secret.

The outbox's services (``govflow.events.services``) do the work; this view checks the
scope and the tenant. The secret is in the answer of a create or a rotation only: the
idempotency record keeps that answer without it (``not_kept``).
"""

from __future__ import annotations

from django.db.models import Count, Q
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response

from govflow.events.models import DeliveryState, Subscription
from govflow.events.services import (
    SubscriptionCreated,
    SubscriptionRefused,
    subscription_create,
    subscription_rotate_secret,
    subscription_set_active,
)

from .. import webhook_serializers as shapes
from ..idempotency import idempotent
from ..pagination import IdCursorPagination
from ..schema import IDEMPOTENCY_HEADER, LOCATION_HEADER, REPLAYED_HEADER, path_id
from .base import ApiView

TAG = ["Webhooks"]
SCOPE = "webhooks:manage"


def subscriptions(tenants: frozenset[str] | None):
    rows = Subscription.objects.annotate(
        pending=Count("deliveries", filter=Q(deliveries__state=DeliveryState.PENDING)),
        dead_letters=Count("deliveries", filter=Q(deliveries__state=DeliveryState.DEAD)),
    )
    return rows if tenants is None else rows.filter(tenant__in=tenants)


class WebhookView(ApiView):
    def present(self, row: Subscription) -> dict:
        return {
            "id": row.pk,
            "url": self.url("webhook-detail", row.pk),
            "name": row.name,
            "target": row.url,
            "tenant": row.tenant,
            "event_types": row.event_types,
            "active": row.active,
            "created_at": row.created_at,
            "pending": getattr(row, "pending", 0),
            "dead_letters": getattr(row, "dead_letters", 0),
        }

    def own(self, pk: int) -> Subscription:
        row = subscriptions(self.tenants).filter(pk=pk).first()
        if row is None:
            raise self.not_found(f"Webhook subscription {pk}")
        return row

    def with_secret(self, made: SubscriptionCreated, code: int, **headers) -> Response:
        row = subscriptions(None).get(pk=made.subscription.pk)
        data = shapes.WebhookWithSecret({**self.present(row), "secret": made.secret}).data
        response = Response(data, status=code, headers=headers)
        response.not_kept = ("secret",)
        return response


class WebhookList(WebhookView):
    scopes = {"GET": SCOPE, "POST": SCOPE}
    pagination_class = IdCursorPagination

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # the schema generator's
            return Subscription.objects.none()
        return subscriptions(self.tenants)

    @extend_schema(
        tags=TAG,
        operation_id="webhooks_list",
        summary="List webhook subscriptions",
        description="The tenant's subscriptions, newest first. Scope: webhooks:manage.",
        responses=shapes.Webhook(many=True),
    )
    def get(self, request):
        page = list(self.paginate_queryset(self.get_queryset()))
        data = [self.present(row) for row in page]
        return self.get_paginated_response(shapes.Webhook(data, many=True).data)

    @extend_schema(
        tags=TAG,
        operation_id="webhooks_create",
        summary="Register a webhook",
        description=(
            "Events of the tenant (of the types named; none: every type) are POSTed to "
            "the URL, signed with the secret in this answer, which is shown only here. "
            "The URL must be https:// and its host public; a refused URL is a 422 saying "
            "why, and nothing is recorded. Scope: webhooks:manage."
        ),
        request=shapes.WebhookCreateRequest,
        parameters=[IDEMPOTENCY_HEADER, LOCATION_HEADER, REPLAYED_HEADER],
        responses={201: shapes.WebhookWithSecret},
    )
    @idempotent
    def post(self, request):
        form = shapes.WebhookCreateRequest(data=request.data)
        form.is_valid(raise_exception=True)
        data = form.validated_data
        tenant = self.acting_tenant(data.get("tenant"))
        key = self.principal.key
        try:
            made = subscription_create(
                name=data["name"],
                url=data["url"],
                tenant=tenant,
                event_types=data["event_types"],
                actor=None if key is not None else request.user,
                api_key=key.prefix if key is not None else "",
            )
        except SubscriptionRefused as exc:
            raise ValidationError({exc.field or "non_field_errors": [str(exc)]}) from None
        location = self.url("webhook-detail", made.subscription.pk)
        return self.with_secret(made, status.HTTP_201_CREATED, Location=location)


class WebhookDetail(WebhookView):
    scopes = {"GET": SCOPE}

    @extend_schema(
        tags=TAG,
        operation_id="webhooks_read",
        summary="Read a webhook subscription",
        description="One subscription (never its secret). Scope: webhooks:manage.",
        parameters=[path_id],
        responses=shapes.Webhook,
    )
    def get(self, request, pk: int):
        return Response(shapes.Webhook(self.present(self.own(pk))).data)


def _set_active_schema(operation_id: str, summary: str, description: str):
    return extend_schema(
        tags=TAG,
        operation_id=operation_id,
        summary=summary,
        description=f"{description} Scope: webhooks:manage.",
        request=None,
        parameters=[path_id, IDEMPOTENCY_HEADER, REPLAYED_HEADER],
        responses=shapes.Webhook,
    )


class WebhookChange(WebhookView):
    scopes = {"POST": SCOPE}

    def actor(self):
        return None if self.principal.key is not None else self.request.user

    def set_active(self, pk: int, active: bool) -> Response:
        self.own(pk)
        subscription_set_active(subscription_id=pk, active=active, actor=self.actor())
        return Response(shapes.Webhook(self.present(self.own(pk))).data)


class WebhookActivate(WebhookChange):
    @_set_active_schema(
        "webhooks_activate",
        "Resume a webhook subscription",
        "It gets new events again; the deliveries that waited are made, in order.",
    )
    @idempotent
    def post(self, request, pk: int):
        return self.set_active(pk, True)


class WebhookDeactivate(WebhookChange):
    @_set_active_schema(
        "webhooks_deactivate",
        "Pause a webhook subscription",
        "Paused, it gets no new events; deliveries already due wait until it is resumed.",
    )
    @idempotent
    def post(self, request, pk: int):
        return self.set_active(pk, False)


class WebhookRotateSecret(WebhookChange):
    @extend_schema(
        tags=TAG,
        operation_id="webhooks_rotate_secret",
        summary="Give a webhook subscription a new secret",
        description=(
            "The new secret is in this answer only; the old one stops signing at once. "
            "Scope: webhooks:manage."
        ),
        request=None,
        parameters=[path_id, IDEMPOTENCY_HEADER, REPLAYED_HEADER],
        responses=shapes.WebhookWithSecret,
    )
    @idempotent
    def post(self, request, pk: int):
        self.own(pk)
        made = subscription_rotate_secret(subscription_id=pk, actor=self.actor())
        return self.with_secret(made, status.HTTP_200_OK)
