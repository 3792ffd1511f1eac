"""An instance's compensations: list them, and start those of an ended instance.

Approving a compensation (and recording what happened to one of unknown outcome) stays on
the desk, where one person requests it and a second approves what the instance page shows
(a decision bound to the ledger revision and the preview: ADR 0028); the API shows each
compensation's open decision and where to approve it.
"""

from __future__ import annotations

from typing import Any

from django.urls import reverse
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.response import Response

from govflow.engine.selectors import instance_subject
from govflow.engine.services.definitions import trusted_spec
from govflow.handoffs.services.compensations import compensations_start
from recovery.api import (
    CompensationView,
    DecisionState,
    OperationState,
    compensations_of,
    decisions_of,
)

from .. import selectors
from ..compensation_serializers import CompensationList, CompensationStartRequest
from ..idempotency import idempotent
from ..schema import IDEMPOTENCY_HEADER, LOCATION_HEADER, REPLAYED_HEADER, path_id
from .base import ApiView

TAG = ["Compensations"]
WORDS = {
    OperationState.PREPARED: "to run: a worker runs it when the compensations before it are done",
    OperationState.DISPATCHED: "running now",
    OperationState.PENDING: "pending: its provider is working on it; GovFlow polls it again "
    "(past its poll budget it becomes an unknown outcome for a person)",
    OperationState.SUCCEEDED: "done",
    OperationState.EFFECT_CONFIRMED: "done (confirmed by a decision)",
    OperationState.FAILED: "failed: it did not undo the effect and is never run again; a "
    "person undoes the effect outside GovFlow",
    OperationState.OUTCOME_UNKNOWN: "outcome unknown: it is never called again; an operator "
    "records on the desk whether it happened, with evidence, and a second person approves",
    OperationState.EFFECT_ABSENT: "did not happen (decided absent): a person undoes the effect "
    "outside GovFlow",
}
AWAITING = "awaiting approval: one person requests it on the desk, a second person approves it"


def _present(order: int, view: CompensationView, titles, decision) -> dict[str, Any]:
    state_text = AWAITING if view.awaiting_approval else WORDS.get(view.state, view.state)
    return {
        "order": order,
        "key": view.key,
        "undoes": {
            "operation_key": view.original_key,
            "step": view.step_id,
            "step_title": titles.get(view.step_id, view.step_id),
            "action": view.original_action,
        },
        "action": view.action,
        "state": view.state,
        "state_text": state_text,
        "trigger": view.trigger,
        "approval": view.approval,
        "awaiting_approval": view.awaiting_approval,
        "approved": view.approved,
        "open_decision": None
        if decision is None
        else {
            "id": decision.pk,
            "kind": decision.kind,
            "requested_by": str(decision.requested_by),
            "requested_at": decision.requested_at,
        },
        "input_fp": view.input_fp,
        "preview_fp": view.preview_fp,
        "idempotency_fp": view.idempotency_fp,
    }


class InstanceCompensations(ApiView):
    scopes = {"GET": "compensations:read", "POST": "compensations:start"}

    def listing(self, instance) -> dict[str, Any]:
        subject = instance_subject(instance.pk)
        nodes = trusted_spec(instance.definition).nodes
        titles = {nid: str(n.get("title") or nid) for nid, n in nodes.items()}
        open_by_key = {
            d.operation.key: d for d in decisions_of(subject).filter(state=DecisionState.REQUESTED)
        }
        views = compensations_of(subject)
        desk = reverse("admin:engine_instance_change", args=[instance.pk])
        return {
            "instance": instance.pk,
            "desk_url": self.request.build_absolute_uri(desk) + "#compensations-heading",
            "compensations": [
                _present(n, v, titles, open_by_key.get(v.key)) for n, v in enumerate(views, 1)
            ],
        }

    def instance(self, pk: int):
        instance = selectors.instance_get(self.tenants, pk)
        if instance is None:
            raise self.not_found(f"Instance {pk}")
        return instance

    @extend_schema(
        tags=TAG,
        operation_id="instances_compensations_list",
        summary="List an instance's compensations",
        description=(
            "Each compensation recorded for the instance, in the order they run (the "
            "reverse of the steps they undo), with its state in words and any decision "
            "awaiting a second person's approval. Fingerprints only: no input or output. "
            "Scope: compensations:read."
        ),
        parameters=[path_id],
        responses=CompensationList,
    )
    def get(self, request, pk: int):
        return Response(CompensationList(self.listing(self.instance(pk))).data)

    @extend_schema(
        tags=TAG,
        operation_id="instances_compensations_start",
        summary="Start the compensations of an ended instance",
        description=(
            "For a cancelled or failed instance: records a compensation for every "
            "succeeded step whose node declares one (`compensate_on`) and has none yet, "
            "as an operator starting them on the desk would (trigger `operator`). Each "
            "then runs as its policy says: `automatic` ones by themselves, in reverse "
            "order; `operator` ones once one person requests and a second approves them "
            "on the desk (`desk_url`). An instance that has not ended, or has nothing "
            "left to compensate, is a 409; nothing is recorded then. Scope: "
            "compensations:start."
        ),
        request=CompensationStartRequest,
        parameters=[path_id, IDEMPOTENCY_HEADER, LOCATION_HEADER, REPLAYED_HEADER],
        responses={201: CompensationList},
    )
    @idempotent
    def post(self, request, pk: int):
        CompensationStartRequest(data=request.data).is_valid(raise_exception=True)
        # The service does not know tenants: the API checks the instance is the caller's.
        instance = self.instance(pk)
        compensations_start(instance_id=instance.pk, actor=request.user)
        return Response(
            CompensationList(self.listing(instance)).data,
            status=status.HTTP_201_CREATED,
            headers={"Location": self.url("instance-compensations", instance.pk)},
        )
