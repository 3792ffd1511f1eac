"""Trigger messages: deliver one (deduplicated by its delivery id), read what became of it.

Delivery ids are the caller's, one namespace per tenant: the engine stores them as
``<tenant>:<delivery id>``, so two tenants never collide, and a tenant never sees
another's deliveries. (API delivery ids hold no ':', so the stored id is unambiguous.)
"""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response

from govflow.engine.services.triggers import trigger_deliver

from .. import selectors, serializers
from ..idempotency import idempotent
from ..schema import IDEMPOTENCY_HEADER, LOCATION_HEADER, REPLAYED_HEADER, path_delivery_id
from .base import ApiView
from .presenters import delivery

TAG = ["Triggers"]


def stored_id(tenant: str, delivery_id: str) -> str:
    return f"{tenant}:{delivery_id}"


class TriggerDeliveries(ApiView):
    scopes = {"POST": "triggers:deliver"}

    @extend_schema(
        tags=TAG,
        operation_id="triggers_deliver",
        summary="Deliver a message",
        description=(
            "Records the message and hands it to the step of the tenant waiting for this "
            "message name and correlation value; if none waits yet, it is kept (state "
            "'received') until one does. Delivering the same delivery id again is answered "
            "as the first delivery was, with its current state; the same id with another "
            "message is a 409. A message is only ever handed to a step of the same tenant. "
            "Scope: triggers:deliver."
        ),
        request=serializers.TriggerDeliveryRequest,
        parameters=[IDEMPOTENCY_HEADER, LOCATION_HEADER, REPLAYED_HEADER],
        responses={202: serializers.TriggerDelivery},
    )
    @idempotent
    def post(self, request):
        form = serializers.TriggerDeliveryRequest(data=request.data)
        form.is_valid(raise_exception=True)
        data = form.validated_data
        tenant = self.acting_tenant(data.get("tenant"))
        full_id = stored_id(tenant, data["delivery_id"])
        if len(full_id) > 200:
            raise ValidationError(
                {
                    "delivery_id": [
                        "Too long for this tenant's name: use at most 99 minus "
                        "the tenant's length characters."
                    ]
                }
            )
        found = trigger_deliver(
            message=data["message"],
            correlation=data["correlation"],
            delivery_id=full_id,
            payload=data["payload"],
            tenant=tenant,
        )
        found = selectors.delivery_get(found.delivery_id)
        url = self.url("trigger-delivery-detail", data["delivery_id"])
        return Response(
            serializers.TriggerDelivery(delivery(self, found, data["delivery_id"], tenant)).data,
            status=status.HTTP_202_ACCEPTED,
            headers={"Location": url},
        )


class TriggerDeliveryDetail(ApiView):
    scopes = {"GET": "triggers:deliver"}
    query_parameters = {"GET": frozenset({"tenant"})}

    @extend_schema(
        tags=TAG,
        operation_id="triggers_delivery_read",
        summary="Read a delivery",
        description="What became of a message you delivered: kept, or handed to a step. "
        "Signed-in users of several tenants name one with ?tenant=. Scope: triggers:deliver.",
        parameters=[
            path_delivery_id,
            OpenApiParameter(
                "tenant",
                {"type": "string", "maxLength": 100},
                OpenApiParameter.QUERY,
                description="Signed-in users only: the tenant the delivery was made for (one of "
                "theirs; needed when they have several).",
            ),
        ],
        responses=serializers.TriggerDelivery,
    )
    def get(self, request, delivery_id: str):
        tenant = self.acting_tenant(self.query_value("tenant"))
        found = selectors.delivery_get(stored_id(tenant, delivery_id))
        if found is None:
            raise self.not_found(f"The delivery {delivery_id!r}")
        return Response(
            serializers.TriggerDelivery(delivery(self, found, delivery_id, tenant)).data
        )
