"""Definitions: list, read, validate without publishing, publish (an administrator's scope)."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.exceptions import ParseError
from rest_framework.response import Response

from govflow.engine.definitions import MAX_VERSION
from govflow.engine.services.definitions import definition_publish

from .. import selectors, serializers
from ..filters import DefinitionFilter, FilterBackend
from ..idempotency import idempotent
from ..pagination import IdCursorPagination
from ..schema import (
    IDEMPOTENCY_HEADER,
    LOCATION_HEADER,
    REPLAYED_HEADER,
    path_key,
    path_version,
)
from .base import ApiView
from .presenters import definition_detail, definition_summary

TAG = ["Definitions"]


class DefinitionList(ApiView):
    scopes = {"GET": "definitions:read", "POST": "definitions:publish"}
    pagination_class = IdCursorPagination
    filter_backends = [FilterBackend]
    filterset_class = DefinitionFilter

    def get_queryset(self):
        return selectors.definitions()

    @extend_schema(
        tags=TAG,
        operation_id="definitions_list",
        summary="List published definitions",
        description="Every published version, newest first. Scope: definitions:read.",
        responses=serializers.DefinitionSummary(many=True),
    )
    def get(self, request):
        page = self.paginate_queryset(self.filter_queryset(self.get_queryset()))
        data = [definition_summary(self, d) for d in page]
        return self.get_paginated_response(serializers.DefinitionSummary(data, many=True).data)

    @extend_schema(
        tags=TAG,
        operation_id="definitions_publish",
        summary="Publish a definition",
        description=(
            "Validate the document against the installed providers and publish it as a "
            "frozen version, its actions' contracts pinned. Publishing the same document "
            "again answers 200 with the existing version; a different document under a "
            "published key and version is a 409 naming the version to publish instead. "
            "Scope: definitions:publish (an administrator's scope: every tenant runs "
            "published definitions)."
        ),
        request=serializers.DefinitionDocument,
        parameters=[IDEMPOTENCY_HEADER, LOCATION_HEADER, REPLAYED_HEADER],
        responses={
            201: OpenApiResponse(serializers.DefinitionDetail, description="Published."),
            200: OpenApiResponse(
                serializers.DefinitionDetail,
                description="Already published with the same content.",
            ),
        },
    )
    @idempotent
    def post(self, request):
        document = request.data
        existed = (
            isinstance(document, dict)
            and isinstance(document.get("key"), str)
            and type(document.get("version")) is int
            and 1 <= document["version"] <= MAX_VERSION
            and selectors.definition_get(document["key"], document["version"]) is not None
        )
        principal = self.principal
        definition = definition_publish(
            document=document, source=f"REST API, {principal.label}"[:300], actor=principal.user
        )
        # Read back: the service returns the row as written (its times are SQL expressions).
        definition = selectors.definition_get(definition.key, definition.version)
        url = self.url("definition-version", definition.key, definition.version)
        return Response(
            serializers.DefinitionDetail(definition_detail(self, definition)).data,
            status=status.HTTP_200_OK if existed else status.HTTP_201_CREATED,
            headers={"Location": url},
        )


class DefinitionValidate(ApiView):
    scopes = {"POST": "definitions:read"}

    @extend_schema(
        tags=TAG,
        operation_id="definitions_validate",
        summary="Validate a definition without publishing it",
        description=(
            "Runs the same validation publishing runs, against the installed providers, "
            "and changes nothing. A valid document is answered with the fingerprint it "
            "would be published with and whether this key and version is published "
            "already; an invalid one is a 422 problem listing every problem in 'errors', "
            "as publishing would answer. Scope: definitions:read."
        ),
        request=serializers.DefinitionDocument,
        responses=serializers.DefinitionValidation,
    )
    def post(self, request):
        if request.stream is None:
            raise ParseError("Send the definition document as the JSON body.")
        result = selectors.definition_check(request.data)
        return Response(serializers.DefinitionValidation(result).data)


class DefinitionDetail(ApiView):
    scopes = {"GET": "definitions:read"}

    @extend_schema(
        tags=TAG,
        operation_id="definitions_latest",
        summary="Read the latest version of a definition",
        description="The latest published version of the key, with the list of all "
        "versions. Scope: definitions:read.",
        parameters=[path_key],
        responses=serializers.DefinitionDetail,
    )
    def get(self, request, key: str):
        definition = selectors.definition_get(key)
        if definition is None:
            raise self.not_found(f"The definition {key!r}")
        return Response(serializers.DefinitionDetail(definition_detail(self, definition)).data)


class DefinitionVersion(ApiView):
    scopes = {"GET": "definitions:read"}

    @extend_schema(
        tags=TAG,
        operation_id="definitions_read",
        summary="Read one version of a definition",
        description="Scope: definitions:read.",
        parameters=[path_key, path_version],
        responses=serializers.DefinitionDetail,
    )
    def get(self, request, key: str, version: str):
        number = int(version)
        definition = selectors.definition_get(key, number) if number <= MAX_VERSION else None
        if definition is None:
            raise self.not_found(f"Version {version} of the definition {key!r}")
        return Response(serializers.DefinitionDetail(definition_detail(self, definition)).data)
