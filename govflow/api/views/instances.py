"""Instances: start, list and filter, read with steps in words, cancel with a reason."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.response import Response

from govflow.engine.models import Instance
from govflow.engine.services.instances import instance_cancel, instance_start

from .. import selectors, serializers
from ..filters import FilterBackend, InstanceFilter
from ..idempotency import idempotent
from ..pagination import IdCursorPagination
from ..schema import IDEMPOTENCY_HEADER, LOCATION_HEADER, REPLAYED_HEADER, path_id
from .base import ApiView
from .presenters import instance_detail, instance_summary

TAG = ["Instances"]


class InstanceList(ApiView):
    scopes = {"GET": "instances:read", "POST": "instances:start"}
    pagination_class = IdCursorPagination
    filter_backends = [FilterBackend]
    filterset_class = InstanceFilter
    case_variable_filters = True

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # the schema generator's
            return Instance.objects.none()
        return selectors.instances(self.tenants)

    @extend_schema(
        tags=TAG,
        operation_id="instances_list",
        summary="List instances",
        description=(
            "The tenant's instances, newest first, filtered by status, definition, "
            "dates and case variables. A case variable is filtered as "
            "`var.<path>=<value>`, e.g. `?var.applicant.name=Nowak`: the path is dotted "
            "names (letters, digits, '_'; at most 8 levels), at most 5 such filters; a "
            "value also matches the JSON true, false, null or integer it spells. A "
            "signed-in user sees their tenants'. Scope: instances:read."
        ),
        responses=serializers.InstanceSummary(many=True),
    )
    def get(self, request):
        page = self.paginate_queryset(self.filter_queryset(self.get_queryset()))
        data = [instance_summary(self, i) for i in page]
        return self.get_paginated_response(serializers.InstanceSummary(data, many=True).data)

    @extend_schema(
        tags=TAG,
        operation_id="instances_start",
        summary="Start an instance",
        description=(
            "Starts an instance of a published definition (its latest version unless "
            "'version' is given) for the key's tenant, and queues its first run. "
            "Variables that do not match the definition's schema are a 422 naming the "
            "field; an unknown definition is a 404; neither changes anything. Scope: "
            "instances:start."
        ),
        request=serializers.InstanceStartRequest,
        parameters=[IDEMPOTENCY_HEADER, LOCATION_HEADER, REPLAYED_HEADER],
        responses={201: serializers.InstanceDetail},
    )
    @idempotent
    def post(self, request):
        form = serializers.InstanceStartRequest(data=request.data)
        form.is_valid(raise_exception=True)
        data = form.validated_data
        tenant = self.acting_tenant(data.get("tenant"))
        definition = selectors.definition_get(data["definition"], data.get("version"))
        if definition is None:
            version = f" version {data['version']}" if data.get("version") else ""
            raise self.not_found(f"The definition {data['definition']!r}{version}")
        principal = self.principal
        access = {"via": "rest-api"}
        if principal.key is not None:
            access["api_key"] = principal.key.prefix
        instance = instance_start(
            definition=definition,
            variables=data["variables"],
            tenant=tenant,
            actor=principal.user,
            access=access,
        )
        instance = selectors.instance_get(None, instance.pk)
        return Response(
            serializers.InstanceDetail(instance_detail(self, instance)).data,
            status=status.HTTP_201_CREATED,
            headers={"Location": self.url("instance-detail", instance.pk)},
        )


class InstanceDetail(ApiView):
    scopes = {"GET": "instances:read"}

    @extend_schema(
        tags=TAG,
        operation_id="instances_read",
        summary="Read an instance",
        description="The instance with its variables and every step, each with its state "
        "in words. Scope: instances:read.",
        parameters=[path_id],
        responses=serializers.InstanceDetail,
    )
    def get(self, request, pk: int):
        instance = selectors.instance_get(self.tenants, pk)
        if instance is None:
            raise self.not_found(f"Instance {pk}")
        return Response(serializers.InstanceDetail(instance_detail(self, instance)).data)


class InstanceCancel(ApiView):
    scopes = {"POST": "instances:cancel"}

    @extend_schema(
        tags=TAG,
        operation_id="instances_cancel",
        summary="Cancel an instance",
        description=(
            "Cancels the instance's active steps; nothing external is undone. A step whose "
            "outcome is unknown is not cancelled here (409): it is cancelled through a "
            "decision in the recovery desk, where a second person approves it. An instance "
            "that already ended is a 409. Scope: instances:cancel."
        ),
        request=serializers.InstanceCancelRequest,
        parameters=[path_id, IDEMPOTENCY_HEADER, REPLAYED_HEADER],
        responses=serializers.InstanceDetail,
    )
    @idempotent
    def post(self, request, pk: int):
        form = serializers.InstanceCancelRequest(data=request.data)
        form.is_valid(raise_exception=True)
        # The service does not know tenants: the API checks the instance is the caller's.
        if selectors.instance_get(self.tenants, pk) is None:
            raise self.not_found(f"Instance {pk}")
        instance_cancel(
            instance_id=pk, actor=self.request.user, reason=form.validated_data["reason"]
        )
        instance = selectors.instance_get(None, pk)
        return Response(serializers.InstanceDetail(instance_detail(self, instance)).data)
