"""Handoffs: where the engine waits for an operator or a provider. Read-only.

Deciding stays in the recovery desk (the admin), where evidence, the verification checks
and a second person's approval live; the API shows what waits and since when.
"""

from __future__ import annotations

import django_filters
from drf_spectacular.utils import extend_schema
from rest_framework.response import Response

from govflow.engine.models import Token

from .. import selectors, serializers
from ..filters import FilterBackend, IntegerFilter, StrictBooleanFilter
from ..pagination import IdCursorPagination
from ..schema import path_id
from .base import ApiView
from .presenters import handoff

TAG = ["Handoffs"]
KINDS = {
    "outcome_unknown": selectors.OUTCOME_UNKNOWN,
    "pending_provider": selectors.PENDING_PROVIDER,
}


class HandoffFilter(django_filters.FilterSet):
    kind = django_filters.ChoiceFilter(
        choices=[(k, k) for k in KINDS],
        method="by_kind",
        help_text="outcome_unknown or pending_provider.",
    )
    awaiting_approval = StrictBooleanFilter(
        method="by_approval",
        help_text="true: only those with a decision awaiting a second person's approval; "
        "false: only those without.",
    )
    instance = IntegerFilter(
        field_name="instance_id",
        min_value=1,
        max_value=999_999_999_999_999_999,
        help_text="Only the handoffs of this instance.",
    )

    class Meta:
        model = Token
        fields: list[str] = []

    def by_kind(self, queryset, name, value):
        return queryset.filter(KINDS[value]) if value else queryset

    def by_approval(self, queryset, name, value):
        return selectors.awaiting_approval(queryset, value == "true") if value else queryset


class HandoffList(ApiView):
    scopes = {"GET": "handoffs:read"}
    pagination_class = IdCursorPagination
    filter_backends = [FilterBackend]
    filterset_class = HandoffFilter

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # the schema generator's
            return Token.objects.none()
        return selectors.handoffs(self.tenants)

    @extend_schema(
        tags=TAG,
        operation_id="handoffs_list",
        summary="List handoffs",
        description=(
            "Steps of the tenant's instances that wait for someone: an unknown outcome "
            "(an operator records what happened, with evidence, and a second person "
            "approves; 'decision' shows a request awaiting approval) or a pending provider "
            "(the provider owns the outcome; the engine asks again at 'next_poll_at'). "
            "Newest first. Scope: handoffs:read."
        ),
        responses=serializers.Handoff(many=True),
    )
    def get(self, request):
        page = list(self.paginate_queryset(self.filter_queryset(self.get_queryset())))
        decisions = selectors.open_decisions(page)
        data = [handoff(self, t, decisions.get(t.operation_key)) for t in page]
        return self.get_paginated_response(serializers.Handoff(data, many=True).data)


class HandoffDetail(ApiView):
    scopes = {"GET": "handoffs:read"}

    @extend_schema(
        tags=TAG,
        operation_id="handoffs_read",
        summary="Read a handoff",
        description="One step waiting for someone (its id is the step's). A step that no "
        "longer waits is a 404. Scope: handoffs:read.",
        parameters=[path_id],
        responses=serializers.Handoff,
    )
    def get(self, request, pk: int):
        token = selectors.handoffs(self.tenants).filter(pk=pk).first()
        if token is None:
            raise self.not_found(f"Handoff {pk}")
        decision = selectors.open_decisions([token]).get(token.operation_key)
        return Response(serializers.Handoff(handoff(self, token, decision)).data)
