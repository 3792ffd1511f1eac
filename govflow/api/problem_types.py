"""The problem types of the REST API: one entry per ``type`` a client can meet.

Each is served as a page under ``/api/v1/problems/<code>/`` and listed in the OpenAPI
schema; :mod:`govflow.api.problems` maps errors to them.
"""

from __future__ import annotations

from dataclasses import dataclass

from .task_problems import TASK_PROBLEMS

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
            "has a value it cannot take, the endpoint does not take a query parameter that "
            "was sent (a misspelt filter), or a page cursor was not one this API gave out. "
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
            "has the wrong type, the body has a field the request does not take, variables "
            "do not match the definition's schema, or the "
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
