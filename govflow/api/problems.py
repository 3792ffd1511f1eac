"""Every error under ``/api/`` is an RFC 9457 problem (``application/problem+json``).

A problem says what happened (``title``, the same for every occurrence of its ``type``),
this occurrence in words (``detail``: for errors the engine raises, the engine's own
words), the HTTP ``status``, and the request it answers (``instance``). Validation
problems list each field in ``errors``. ``type`` is a path under ``/api/v1/problems/``
that describes the problem type; clients compare it (or ``code``, its last part).

Errors map to statuses in one place, :func:`problem_for`:

=====================================================  ======  ======================
raised                                                  status  type
=====================================================  ======  ======================
unreadable body or query (``ParseError``, bad cursor)  400     malformed-request
missing or bad credentials                              401     not-authenticated
missing scope, CSRF, ``NotPermitted``                   403     permission-denied
unknown resource, another tenant's resource             404     not-found
wrong method                                            405     method-not-allowed
no acceptable representation                            406     not-acceptable
``ConflictError`` (someone moved first; reload)         409     conflict
``Idempotency-Key`` still in flight or interrupted      409     idempotency-key-in-use
body over the limit, before it is read                  413     payload-too-large
body that is not JSON                                   415     unsupported-media-type
fields, schema, ``RecoveryValidationError``             422     validation-failed
``Idempotency-Key`` reused for another request          422     idempotency-key-reused
``IntegrityViolation`` (stopped for an operator)        423     integrity-stop
a refused external-task report (``task_problems``)      409     task-…
too many requests (``Retry-After``)                     429     rate-limited
anything else (logged)                                  500     server-error
=====================================================  ======  ======================
"""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404, HttpRequest, JsonResponse
from rest_framework import exceptions
from rest_framework.response import Response

from govflow.engine.definitions import DefinitionInvalid
from govflow.engine.errors import NotPermitted
from recovery.api import ConflictError, IntegrityViolation, RecoveryValidationError

from .problem_types import PROBLEM_TYPES, PROBLEMS_PATH, ProblemType

__all__ = [
    "API_PREFIX",
    "PROBLEMS_PATH",
    "PROBLEM_JSON",
    "PROBLEM_TYPES",
    "ApiProblem",
    "PayloadTooLarge",
    "ProblemType",
    "exception_handler",
    "handler400",
    "handler403",
    "handler404",
    "handler500",
    "problem_body",
    "problem_for",
    "problem_response",
]

log = logging.getLogger("govflow.api")

PROBLEM_JSON = "application/problem+json"
API_PREFIX = "/api/"


_BY_STATUS = {
    400: "malformed-request",
    401: "not-authenticated",
    403: "permission-denied",
    404: "not-found",
    405: "method-not-allowed",
    406: "not-acceptable",
    409: "conflict",
    413: "payload-too-large",
    415: "unsupported-media-type",
    422: "validation-failed",
    423: "integrity-stop",
    429: "rate-limited",
}


class ApiProblem(exceptions.APIException):
    """An error this API raises itself, of a named problem type."""

    def __init__(
        self,
        code: str,
        detail: str,
        *,
        errors: list[dict[str, str]] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.problem = PROBLEM_TYPES[code]
        self.status_code = self.problem.status
        self.errors = errors
        self.headers = headers or {}
        super().__init__(detail, code)


def PayloadTooLarge(limit: int) -> ApiProblem:
    return ApiProblem(
        "payload-too-large",
        f"The request body is over {limit} bytes, the limit of this API "
        "(GOVFLOW_API_MAX_BODY_BYTES). It was not read; nothing was changed.",
    )


def problem_body(
    code: str, detail: str, *, instance: str = "", errors: list[dict[str, str]] | None = None
) -> dict[str, Any]:
    kind = PROBLEM_TYPES[code]
    body: dict[str, Any] = {
        "type": kind.uri,
        "title": kind.title,
        "status": kind.status,
        "detail": detail,
        "code": kind.code,
    }
    if instance:
        body["instance"] = instance
    if errors:
        body["errors"] = errors
    return body


def _field_errors(detail: Any, prefix: str = "") -> list[dict[str, str]]:
    """Flatten DRF's nested validation detail into ``[{"field": "a.b", "detail": …}]``."""
    found: list[dict[str, str]] = []
    if isinstance(detail, dict):
        for key, value in detail.items():
            name = f"{prefix}.{key}" if prefix else str(key)
            if key == "non_field_errors":
                name = prefix
            found.extend(_field_errors(value, name))
    elif isinstance(detail, list):
        if all(not isinstance(item, (dict, list)) for item in detail):
            found.extend({"field": prefix, "detail": str(item)} for item in detail)
        else:
            for index, item in enumerate(detail):
                found.extend(_field_errors(item, f"{prefix}[{index}]"))
    else:
        found.append({"field": prefix, "detail": str(detail)})
    return found


def _validation_detail(errors: list[dict[str, str]]) -> str:
    parts = [f"{e['field']}: {e['detail']}" if e["field"] else e["detail"] for e in errors[:5]]
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    return "; ".join(parts) + more


Problem = tuple[str, str, list[dict[str, str]] | None, dict[str, str]]


def problem_for(exc: BaseException) -> Problem | None:
    """(problem code, detail, field errors, headers) for an exception; None if unknown.

    Engine and recovery errors keep their own words as the detail.
    """
    headers: dict[str, str] = {}
    if isinstance(exc, ApiProblem):
        return exc.problem.code, str(exc.detail), exc.errors, dict(exc.headers)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound(*exc.args)
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied(*exc.args)
    if isinstance(exc, NotPermitted):  # before RecoveryValidationError: it is one
        return "permission-denied", str(exc), None, headers
    if isinstance(exc, DefinitionInvalid):
        errors = [{"field": "", "detail": p} for p in exc.problems]
        return "validation-failed", str(exc), errors, headers
    if isinstance(exc, RecoveryValidationError):
        errors = [{"field": exc.path, "detail": exc.problem}] if hasattr(exc, "path") else None
        return "validation-failed", str(exc), errors, headers
    if isinstance(exc, IntegrityViolation):
        return "integrity-stop", str(exc), None, headers
    if isinstance(exc, ConflictError):
        return "conflict", str(exc), None, headers
    if isinstance(exc, exceptions.ValidationError):
        errors = _field_errors(exc.detail)
        return "validation-failed", _validation_detail(errors), errors, headers
    if isinstance(exc, exceptions.APIException):
        if getattr(exc, "auth_header", None):
            headers["WWW-Authenticate"] = exc.auth_header
        if isinstance(exc, exceptions.Throttled):
            wait = exc.wait if exc.wait is not None else 1
            headers["Retry-After"] = str(max(1, int(wait)))
            return (
                "rate-limited",
                f"Too many requests: this key or user is over its rate. Retry after "
                f"{headers['Retry-After']} seconds.",
                None,
                headers,
            )
        if isinstance(exc, exceptions.UnsupportedMediaType):
            return (
                "unsupported-media-type",
                f"{exc.detail} Send the body as JSON with 'Content-Type: application/json'.",
                None,
                headers,
            )
        code = _BY_STATUS.get(exc.status_code)
        if code is None:
            return None
        return code, str(exc.detail), None, headers
    return None


def problem_response(
    request_path: str,
    code: str,
    detail: str,
    errors: list[dict[str, str]] | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    body = problem_body(code, detail, instance=request_path, errors=errors)
    return Response(body, status=body["status"], headers=headers or {}, content_type=PROBLEM_JSON)


def exception_handler(exc: BaseException, context: dict[str, Any]) -> Response:
    """DRF's ``EXCEPTION_HANDLER``: every exception becomes a problem, never a bare 500."""
    # Imported here: rest_framework.views reads the API settings, which name this module.
    from rest_framework.views import set_rollback

    request = context.get("request")
    path = request.get_full_path() if request is not None else ""
    set_rollback()
    problem = problem_for(exc)
    if problem is None:
        log.error("Unhandled error answering %s", path, exc_info=exc)
        return problem_response(
            path,
            "server-error",
            "Something failed on the server while answering this request; it was "
            "logged. Read the resource before sending a change again, or send it again "
            "with the same Idempotency-Key.",
        )
    return problem_response(path, *problem)


# Django's handlers (``handler404`` and friends in the root URLconf): problems under /api/,
# Django's own pages elsewhere.


def _django_problem(request: HttpRequest, code: str, detail: str) -> JsonResponse:
    body = problem_body(code, detail, instance=request.get_full_path())
    return JsonResponse(body, status=body["status"], content_type=PROBLEM_JSON)


def _is_api(request: HttpRequest) -> bool:
    return request.path.startswith(API_PREFIX)


def handler400(request, exception=None):
    if _is_api(request):
        return _django_problem(request, "malformed-request", "The request could not be read.")
    from django.views.defaults import bad_request

    return bad_request(request, exception)


def handler403(request, exception=None):
    if _is_api(request):
        return _django_problem(request, "permission-denied", "This request is not allowed.")
    from django.views.defaults import permission_denied

    return permission_denied(request, exception)


def handler404(request, exception=None):
    if _is_api(request):
        return _django_problem(request, "not-found", f"No resource is at {request.path}.")
    from django.views.defaults import page_not_found

    return page_not_found(request, exception)


def handler500(request):
    if _is_api(request):
        return _django_problem(
            request,
            "server-error",
            "Something failed on the server while answering this request; it was logged.",
        )
    from django.views.defaults import server_error

    return server_error(request)


__all__ = [
    "PROBLEM_JSON",
    "PROBLEM_TYPES",
    "ApiProblem",
    "PayloadTooLarge",
    "exception_handler",
    "handler400",
    "handler403",
    "handler404",
    "handler500",
    "problem_body",
    "problem_for",
]
