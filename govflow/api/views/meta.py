"""The caller's identity, the problem catalogue, the schema, and 404 for unknown URLs."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.urls import Resolver404, resolve
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.utils import extend_schema
from drf_spectacular.views import SpectacularAPIView
from rest_framework.permissions import AllowAny
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response

from .. import serializers
from ..permissions import Authenticated
from ..problems import PROBLEM_JSON, PROBLEM_TYPES, problem_body
from ..scopes import SCOPES
from ..throttling import AnonRateThrottle, KeyRateThrottle
from .base import ApiView

TAG = ["About the API"]


class MeView(ApiView):
    permission_classes = [Authenticated]

    @extend_schema(
        tags=TAG,
        operation_id="me",
        summary="Who am I",
        description="The key (or signed-in user) this request was made with: its tenants "
        "and scopes. Any authenticated caller.",
        responses=serializers.Me,
    )
    def get(self, request):
        principal = self.principal
        if principal.key is not None:
            key = principal.key
            data = {
                "kind": "api_key",
                "name": key.name,
                "prefix": key.prefix,
                "tenant": key.tenant,
                "tenants": [key.tenant],
                "scopes": sorted(key.scopes or ()),
                "expires_at": key.expiry_date,
            }
        else:
            tenants = principal.tenants
            data = {
                "kind": "session",
                "name": principal.label,
                "prefix": None,
                "tenant": next(iter(tenants))
                if tenants is not None and len(tenants) == 1
                else None,
                "tenants": None if tenants is None else sorted(tenants),
                "scopes": sorted(s for s in SCOPES if principal.allows(s)),
                "expires_at": None,
            }
        return Response(serializers.Me(data).data)


class _Public(ApiView):
    authentication_classes: list = []
    permission_classes = [AllowAny]
    throttle_classes = [AnonRateThrottle]


def _problem_type(code: str) -> dict:
    kind = PROBLEM_TYPES[code]
    return {
        "type": kind.uri,
        "code": kind.code,
        "status": kind.status,
        "title": kind.title,
        "description": kind.description,
    }


class ProblemTypeList(_Public):
    @extend_schema(
        tags=TAG,
        operation_id="problems_list",
        summary="List problem types",
        description="Every problem type an error of this API can have. No authentication.",
        responses=serializers.ProblemType(many=True),
    )
    def get(self, request):
        data = [_problem_type(code) for code in PROBLEM_TYPES]
        return Response(serializers.ProblemType(data, many=True).data)


class ProblemTypeDetail(_Public):
    @extend_schema(
        tags=TAG,
        operation_id="problems_read",
        summary="Read a problem type",
        description="What a problem type means and what to do. No authentication.",
        responses=serializers.ProblemType,
    )
    def get(self, request, code: str):
        if code not in PROBLEM_TYPES:
            raise self._unknown(code)
        return Response(serializers.ProblemType(_problem_type(code)).data)

    @staticmethod
    def _unknown(code: str):
        from rest_framework.exceptions import NotFound

        return NotFound(f"There is no problem type {code!r}; /api/v1/problems/ lists them.")


class SchemaView(SpectacularAPIView):
    """The OpenAPI 3.1 document, JSON by default (YAML for ``Accept: application/yaml``)."""

    authentication_classes: list = []
    permission_classes = [AllowAny]
    throttle_classes = [AnonRateThrottle]
    renderer_classes = [
        r for r in SpectacularAPIView.renderer_classes if "json" in r.media_type
    ] + [r for r in SpectacularAPIView.renderer_classes if "json" not in r.media_type]


@csrf_exempt
def not_found(request: HttpRequest, rest: str = "") -> JsonResponse:
    """Any URL under /api/ that is no endpoint: a 404 problem, whatever the method."""
    detail = f"No endpoint is at {request.path}."
    if not request.path.endswith("/"):
        try:
            match = resolve(request.path + "/")
        except Resolver404:
            match = None
        if match is not None and match.func is not not_found:
            detail += f" Did you mean {request.path}/ ? Every API path ends with a slash."
    detail += " The API's endpoints are listed at /api/v1/docs/ (and /api/v1/schema/)."
    body = problem_body("not-found", detail, instance=request.get_full_path())
    return JsonResponse(body, status=404, content_type=PROBLEM_JSON)


__all__ = [
    "JSONRenderer",
    "KeyRateThrottle",
    "MeView",
    "ProblemTypeDetail",
    "ProblemTypeList",
    "SchemaView",
    "not_found",
]
