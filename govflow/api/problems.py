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
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404, HttpRequest, JsonResponse
from rest_framework import exceptions
from rest_framework.response import Response

from govflow.engine.definitions import DefinitionInvalid
from govflow.engine.errors import NotPermitted
from recovery.api import ConflictError, IntegrityViolation, RecoveryValidationError

from .task_problems import TASK_PROBLEMS

log = logging.getLogger("govflow.api")

PROBLEM_JSON = "application/problem+json"
API_PREFIX = "/api/"
PROBLEMS_PATH = "/api/v1/problems/"


@dataclass(frozen=True)
class ProblemType:
    code: str
    status: int
    title: str
    description: str

    @property
    def uri(self) -> str:
        return f"{PROBLEMS_PATH}{self.code}/"


PROBLEM_TYPES: dict[str, ProblemType] = {
    p.code: p
    for p in (
        ProblemType(
            "malformed-request",
            400,
            "The request could not be read",
            "The body is not valid JSON (or nests too deeply, or holds a NUL character, a "
            "lone surrogate or a number JSON cannot carry), a query parameter or header "
            "has a value it cannot take, or a page cursor was not one this API gave out. "
            "Nothing was changed. Fix the request and send it again.",
        ),
        ProblemType(
            "not-authenticated",
            401,
            "Authentication is needed",
            "Send an API key as 'Authorization: Api-Key <key>', or sign in to the admin "
            "(browser sessions). A key that is unknown, revoked or expired is refused.",
        ),
        ProblemType(
            "permission-denied",
            403,
            "Not allowed",
            "The key lacks the scope this operation needs (the detail names it), the "
            "signed-in user lacks the model permission that stands for it, or a browser "
            "request came without its CSRF token. Nothing was changed.",
        ),
        ProblemType(
            "not-found",
            404,
            "Not found",
            "No such resource is visible to you. A resource of another tenant is "
            "answered exactly as one that does not exist.",
        ),
        ProblemType(
            "method-not-allowed",
            405,
            "Method not allowed",
            "The resource exists but does not take this HTTP method; the Allow header "
            "lists those it takes.",
        ),
        ProblemType(
            "not-acceptable",
            406,
            "No acceptable representation",
            "The Accept header asks for a media type this resource cannot return. The API "
            "answers application/json (and the audit export application/jsonl).",
        ),
        ProblemType(
            "conflict",
            409,
            "Conflict with the current state",
            "The resource's current state does not allow this change now (someone moved "
            "first, or a worker is advancing the instance). Nothing was changed. Read the "
            "resource again and decide; the detail says what stood in the way.",
        ),
        ProblemType(
            "idempotency-key-in-use",
            409,
            "The first request with this Idempotency-Key has not finished",
            "A request with the same Idempotency-Key is still being processed, or was "
            "interrupted by a server failure so that its outcome is unknown. Wait and "
            "send it again to get its answer; if it was interrupted, check the resource "
            "before sending the change again with a new key.",
        ),
        ProblemType(
            "payload-too-large",
            413,
            "The body is too large",
            "The request body is over the configured limit and was not read. Nothing was changed.",
        ),
        ProblemType(
            "unsupported-media-type",
            415,
            "The body is not JSON",
            "Send request bodies as 'Content-Type: application/json' (UTF-8).",
        ),
        ProblemType(
            "validation-failed",
            422,
            "The request is not valid",
            "The body was read but its content cannot be accepted: a field is missing or "
            "has the wrong type, variables do not match the definition's schema, or the "
            "engine refused the values (the detail is its own words; 'errors' names each "
            "field). Nothing was changed.",
        ),
        ProblemType(
            "idempotency-key-reused",
            422,
            "The Idempotency-Key was used for another request",
            "An Idempotency-Key identifies one request: the same key came with another "
            "method, path or body. Use a new key for a new request.",
        ),
        ProblemType(
            "integrity-stop",
            423,
            "Stopped by an integrity incident",
            "The engine's stored facts for this instance contradict each other, or were "
            "changed behind the ledger's back. Nothing moves on it until an operator "
            "investigates and resolves the incident; do not retry this request until then.",
        ),
        ProblemType(
            "rate-limited",
            429,
            "Too many requests",
            "This key (or user) sent more requests than its rate allows. Wait for the "
            "number of seconds in the Retry-After header, then send it again.",
        ),
        ProblemType(
            "server-error",
            500,
            "Internal server error",
            "Something failed on the server; it is logged. If the request changed "
            "something, read the resource before sending it again, or send it again with "
            "the same Idempotency-Key.",
        ),
        *(ProblemType(*task_problem) for task_problem in TASK_PROBLEMS),
    )
}

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
