"""An instance's ledger and checkpoint chain: read, verify, export. Fingerprints only.

No ledger row or checkpoint holds a raw input, output, error text or credential
(invariant I1): what is shown here is what the recovery core stores.
"""

from __future__ import annotations

import json

from django.http import StreamingHttpResponse
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.exceptions import ParseError
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.response import Response
from rest_framework.utils.encoders import JSONEncoder

from .. import selectors, serializers
from ..pagination import ChainCursorPagination, LedgerCursorPagination
from ..schema import path_id
from .base import ApiView
from .presenters import checkpoint, operation, verification

TAG = ["Ledger and audit"]
JSONL = "application/jsonl"


class _InstanceScoped(ApiView):
    scopes = {"GET": "audit:read"}

    def instance(self, pk: int):
        instance = selectors.instance_get(self.tenants, pk)
        if instance is None:
            raise self.not_found(f"Instance {pk}")
        return instance


class InstanceLedger(_InstanceScoped):
    pagination_class = LedgerCursorPagination

    @extend_schema(
        tags=TAG,
        operation_id="instances_ledger",
        summary="Read an instance's ledger operations",
        description="One ledger operation per invocation boundary (dispatch, poll, "
        "retry), oldest first, with fingerprints and states only. Scope: audit:read.",
        parameters=[path_id],
        responses=serializers.LedgerOperation(many=True),
    )
    def get(self, request, pk: int):
        instance = self.instance(pk)
        page = self.paginate_queryset(selectors.instance_operations(instance))
        data = [operation(op) for op in page]
        return self.get_paginated_response(serializers.LedgerOperation(data, many=True).data)


class InstanceChain(_InstanceScoped):
    pagination_class = ChainCursorPagination

    @extend_schema(
        tags=TAG,
        operation_id="instances_chain",
        summary="Read an instance's checkpoint chain",
        description="The keyed BLAKE3 hash chain of the instance's facts, in order. "
        "Scope: audit:read.",
        parameters=[path_id],
        responses=serializers.ChainCheckpoint(many=True),
    )
    def get(self, request, pk: int):
        instance = self.instance(pk)
        page = self.paginate_queryset(selectors.instance_checkpoints(instance))
        data = [checkpoint(cp) for cp in page]
        return self.get_paginated_response(serializers.ChainCheckpoint(data, many=True).data)


class InstanceChainVerify(_InstanceScoped):
    @extend_schema(
        tags=TAG,
        operation_id="instances_chain_verify",
        summary="Verify an instance's checkpoint chain",
        description=(
            "Recomputes every link with the chain keys and compares the chain with the "
            "ledger rows and with the instance's stored variables and steps. 'ok' false "
            "names the first broken checkpoint and why. A read: it opens no incident (the "
            "engine does, when it meets a broken chain). Scope: audit:read."
        ),
        parameters=[path_id],
        responses=serializers.ChainVerification,
    )
    def get(self, request, pk: int):
        instance = self.instance(pk)
        result = selectors.instance_verify(instance)
        return Response(serializers.ChainVerification(verification(instance, result)).data)


class JSONLinesRenderer(BaseRenderer):
    media_type = JSONL
    format = "jsonl"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        # Only errors reach this renderer (the export streams itself): one line.
        return json.dumps(data, cls=JSONEncoder, ensure_ascii=False).encode() + b"\n"


class InstanceAudit(_InstanceScoped):
    renderer_classes = [JSONRenderer, JSONLinesRenderer]
    query_parameters = {"GET": frozenset({"format"})}

    @extend_schema(
        tags=TAG,
        operation_id="instances_audit_export",
        summary="Export an instance's audit trail",
        description=(
            "Every checkpoint of the instance, oldest first, with the result of verifying "
            "the chain at the time of the export. `format=jsonl` (or `Accept: "
            "application/jsonl`) streams one checkpoint per line, each line naming the "
            "instance; the default is one JSON document. Scope: audit:read."
        ),
        parameters=[
            path_id,
            OpenApiParameter(
                "format",
                {"type": "string", "enum": ["json", "jsonl"]},
                OpenApiParameter.QUERY,
                description="json (default) or jsonl (one checkpoint per line).",
            ),
        ],
        responses={
            (200, "application/json"): serializers.AuditExport,
            (200, JSONL): OpenApiResponse(
                OpenApiTypes.STR, description="One checkpoint per line (JSON Lines)."
            ),
        },
    )
    def get(self, request, pk: int):
        instance = self.instance(pk)
        wanted = self.query_value("format")
        if wanted not in (None, "json", "jsonl"):
            raise ParseError("The query parameter 'format' is 'json' or 'jsonl'.")
        jsonl = wanted == "jsonl" or (wanted is None and request.accepted_media_type == JSONL)
        checkpoints = selectors.instance_checkpoints(instance).order_by("seq")
        if jsonl:
            return self._lines(instance, checkpoints)
        request.accepted_renderer, request.accepted_media_type = JSONRenderer(), "application/json"
        result = selectors.instance_verify(instance)
        data = {
            "instance": instance.pk,
            "subject": str(selectors.subject_of(instance)),
            "exported_at": timezone.now(),
            "verification": verification(instance, result),
            "checkpoints": [checkpoint(cp) for cp in checkpoints],
        }
        response = Response(serializers.AuditExport(data).data)
        response["Content-Disposition"] = f'inline; filename="instance-{pk}-audit.json"'
        return response

    def _lines(self, instance, checkpoints) -> StreamingHttpResponse:
        subject = str(selectors.subject_of(instance))

        def lines():
            for cp in checkpoints.iterator(chunk_size=500):
                row = serializers.ChainCheckpoint(checkpoint(cp)).data
                line = {"instance": instance.pk, "subject": subject, **row}
                yield json.dumps(line, cls=JSONEncoder, ensure_ascii=False) + "\n"

        response = StreamingHttpResponse(lines(), content_type=f"{JSONL}; charset=utf-8")
        response["Content-Disposition"] = f'inline; filename="instance-{instance.pk}-audit.jsonl"'
        return response
