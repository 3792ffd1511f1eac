"""The OpenAPI 3.1 description (drf-spectacular): auth schemes, shared parameters, problems.

Every operation documents its error responses as ``application/problem+json`` (the
``Problem`` component), including a ``default`` response: whatever the status, an error
has that shape. The schema is checked by ``manage.py check --deploy`` (drf-spectacular's
check: no warnings) and exercised by schemathesis in ``tests/api/test_schemathesis.py``.
"""

from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import OpenApiParameter

from .problems import PROBLEM_JSON, PROBLEM_TYPES

ID_SCHEMA = {"type": "integer", "minimum": 1, "maximum": 999_999_999_999_999_999}
KEY_PATTERN = r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$"


class ApiKeyScheme(OpenApiAuthenticationExtension):
    target_class = "govflow.api.auth.ApiKeyAuthentication"
    name = "ApiKeyAuth"
    match_subclasses = True

    def get_security_definition(self, auto_schema):
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": "An API key, sent as 'Authorization: Api-Key <key>'. Keys are "
            "made in the admin (REST API → API keys) and shown once.",
        }


IDEMPOTENCY_HEADER = OpenApiParameter(
    "Idempotency-Key",
    {
        "type": "string",
        "minLength": 1,
        "maxLength": 257,
        "pattern": r'^("[!-~]{1,255}"|[!-~]{1,255})$',
    },
    OpenApiParameter.HEADER,
    required=False,
    description="Makes this request safe to send again: the same key with the same body "
    "is answered with the stored response (header Idempotent-Replayed: true); the same "
    "key with another body is a 422; while the first is running, a 409. 1 to 255 "
    "visible ASCII characters, per API key; kept 24 hours.",
)
REPLAYED_HEADER = OpenApiParameter(
    "Idempotent-Replayed",
    str,
    OpenApiParameter.HEADER,
    response=[200, 201, 202],
    description="'true' when this is the stored response of an earlier request with the "
    "same Idempotency-Key.",
)
LOCATION_HEADER = OpenApiParameter(
    "Location",
    str,
    OpenApiParameter.HEADER,
    response=[200, 201, 202],
    description="The URL of the resource.",
)
path_key = OpenApiParameter(
    "key",
    {"type": "string", "pattern": KEY_PATTERN, "maxLength": 120},
    OpenApiParameter.PATH,
    description="A definition key, e.g. 'demo.building_permit'.",
)
path_version = OpenApiParameter(
    "version",
    {"type": "integer", "minimum": 1, "maximum": 2_147_483_647},
    OpenApiParameter.PATH,
    description="A published version number.",
)
path_id = OpenApiParameter("id", ID_SCHEMA, OpenApiParameter.PATH, description="The id.")
path_delivery_id = OpenApiParameter(
    "delivery_id",
    {"type": "string", "pattern": r"^[A-Za-z0-9._~-]{1,99}$"},
    OpenApiParameter.PATH,
    description="The delivery id you gave the message.",
)

PROBLEM_SCHEMA = {
    "type": "object",
    "description": "An RFC 9457 problem: what happened, and what to do.",
    "properties": {
        "type": {"type": "string", "description": "A URI reference naming the problem type."},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "code": {"type": "string", "enum": sorted(PROBLEM_TYPES)},
        "instance": {"type": "string"},
        "errors": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"field": {"type": "string"}, "detail": {"type": "string"}},
            },
        },
    },
    "required": ["type", "title", "status", "detail", "code"],
}

_READ = ("400", "401", "403", "404", "406", "429")
_WRITE = (*_READ, "409", "413", "415", "422", "423")
_PUBLIC = ("404", "406", "429")


def add_problem_responses(result, generator, request, public):
    """Postprocessing hook: the ``Problem`` component and the error responses of every
    operation, so that clients (and schemathesis) know the shape of every error."""
    result.setdefault("components", {}).setdefault("schemas", {})["Problem"] = PROBLEM_SCHEMA
    ref = {"$ref": "#/components/schemas/Problem"}
    for item in result.get("paths", {}).values():
        for method, operation in item.items():
            if method not in {"get", "post", "put", "patch", "delete"}:
                continue
            secured = operation.get("security") not in (None, [{}])
            codes = _PUBLIC if not secured else _READ if method == "get" else _WRITE
            responses = operation.setdefault("responses", {})
            for code in codes:
                title = _title(code)
                responses.setdefault(
                    code, {"description": title, "content": {PROBLEM_JSON: {"schema": ref}}}
                )
            if "429" in responses:
                responses["429"].setdefault(
                    "headers",
                    {
                        "Retry-After": {
                            "schema": {"type": "string"},
                            "description": "Seconds to wait before sending it again.",
                        }
                    },
                )
            responses.setdefault(
                "default",
                {
                    "description": "Any other error, as a problem.",
                    "content": {PROBLEM_JSON: {"schema": ref}},
                },
            )
    return result


def _title(code: str) -> str:
    titles = {p.status: p.title for p in reversed(PROBLEM_TYPES.values())}
    return titles.get(int(code), "Error")


__all__ = [
    "IDEMPOTENCY_HEADER",
    "LOCATION_HEADER",
    "REPLAYED_HEADER",
    "ApiKeyScheme",
    "add_problem_responses",
    "path_delivery_id",
    "path_id",
    "path_key",
    "path_version",
    "refuse_unknown_request_fields",
]


def refuse_unknown_request_fields(result, generator, request, public):
    """Postprocessing hook: a request body takes its fields and no others
    (``request_shape.RequestShape``; the definition document's by the engine's validation),
    so each request body's component says ``additionalProperties: false``."""
    schemas = result.get("components", {}).get("schemas", {})
    prefix = "#/components/schemas/"
    for item in result.get("paths", {}).values():
        for operation in item.values():
            body = operation.get("requestBody") if isinstance(operation, dict) else None
            for media in (body or {}).get("content", {}).values():
                ref = media.get("schema", {}).get("$ref", "")
                if ref.startswith(prefix) and ref[len(prefix) :] in schemas:
                    schemas[ref[len(prefix) :]]["additionalProperties"] = False
    return result
