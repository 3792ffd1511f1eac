"""``Idempotency-Key`` for POSTs that create or change something (as Stripe does it).

The semantics of the IETF draft "The Idempotency-Key HTTP Header Field":

1. A request may carry ``Idempotency-Key`` (1-255 visible ASCII characters; a quoted
   structured-field string is accepted too). Keys are scoped to their owner: one API key,
   or one signed-in user. Without the header a request runs as usual.
2. The body is parsed and the caller authenticated and authorised first: a request that
   is refused before that never claims its key.
3. Its fingerprint is taken over the canonical bytes of ``{method, path, body}``
   (``recovery.api.fingerprint_value``), and a record ``in_progress`` is inserted. The
   unique constraint on (owner, key) decides races: exactly one request inserts it.
4. A request that finds the record instead:
   - different fingerprint (another method, path or body) → 422 ``idempotency-key-reused``;
   - ``in_progress`` (the first is still running) or ``interrupted`` (it failed on the
     server, so its outcome is unknown) → 409 ``idempotency-key-in-use``;
   - ``completed`` → the stored response, replayed with ``Idempotent-Replayed: true``.
5. The handler runs. A success (2xx) is stored with its status, body and ``Location``. A
   refusal (4xx: the engine changed nothing) deletes the record, so the same request may
   be sent again once the cause is fixed. An unexpected error marks it ``interrupted``:
   the change may have happened, and GovFlow does not guess.
6. Records older than ``GOVFLOW_API_IDEMPOTENCY_TTL`` seconds (default 24 hours) are
   expired: a request finding one replaces it, and ``manage.py api_idempotency_purge``
   deletes them.
"""

from __future__ import annotations

import datetime as dt
import functools
from dataclasses import dataclass

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import DateTimeField, ExpressionWrapper, Value
from django.db.models.fields import DurationField
from django.db.models.functions import Now
from rest_framework.exceptions import ParseError
from rest_framework.response import Response

from recovery.api import CanonicalError, FingerprintKind, fingerprint_value

from .auth import principal_of
from .models import IdempotencyRecord, IdempotencyState
from .problems import ApiProblem

HEADER = "Idempotency-Key"
REPLAYED = "Idempotent-Replayed"
_META = "HTTP_IDEMPOTENCY_KEY"
_STORED_HEADERS = ("Location",)


def ttl() -> dt.timedelta:
    return dt.timedelta(seconds=float(getattr(settings, "GOVFLOW_API_IDEMPOTENCY_TTL", 86400)))


def expired_before():
    """The database time before which a record is expired (database clock)."""
    return ExpressionWrapper(
        Now() - Value(ttl(), output_field=DurationField()), output_field=DateTimeField()
    )


def key_from(request) -> str | None:
    """The request's Idempotency-Key, or None; a malformed one is a 400."""
    raw = request.META.get(_META)
    if raw is None:
        return None
    value = raw.strip()
    if len(value) >= 2 and value[0] == value[-1] == '"':
        value = value[1:-1]
    if not 1 <= len(value) <= 255 or any(not 0x21 <= ord(c) <= 0x7E for c in value):
        raise ParseError(
            f"The {HEADER} header must be 1 to 255 visible ASCII characters (a UUID is a "
            "good choice)."
        )
    return value


def request_fingerprint(method: str, path: str, body) -> str:
    try:
        return fingerprint_value(
            FingerprintKind.INPUT,
            {"api": "idempotent-request", "method": method, "path": path, "body": body},
        )
    except CanonicalError as exc:  # the parser refuses such bodies already
        raise ParseError(f"The body cannot be accepted: {exc}") from None


@dataclass
class Claim:
    """What ``claim`` found: a fresh record to run under, or a stored response."""

    record: IdempotencyRecord
    replay: bool


def claim(*, owner: str, key: str, method: str, path: str, fp: str) -> Claim:
    """Insert the in-progress record, or return the one already there (see module doc)."""
    for _ in range(3):
        try:
            with transaction.atomic():
                record = IdempotencyRecord.objects.create(
                    owner=owner,
                    key=key,
                    method=method,
                    path=path[:400],
                    request_fp=fp,
                    created_at=Now(),
                )
            return Claim(record, replay=False)
        except IntegrityError:
            pass
        existing = IdempotencyRecord.objects.filter(owner=owner, key=key).first()
        if existing is None:
            continue  # purged meanwhile: insert again
        if IdempotencyRecord.objects.filter(
            pk=existing.pk, created_at__lt=expired_before()
        ).delete()[0]:
            continue  # expired: this request starts afresh
        if existing.request_fp != fp:
            raise ApiProblem(
                "idempotency-key-reused",
                f"The {HEADER} {key!r} was already used for another request "
                f"({existing.method} {existing.path}, with another body). A key identifies "
                "one request: use a new key for a new request.",
            )
        if existing.state == IdempotencyState.COMPLETED:
            return Claim(existing, replay=True)
        if existing.state == IdempotencyState.INTERRUPTED:
            raise ApiProblem(
                "idempotency-key-in-use",
                f"The first request with {HEADER} {key!r} failed on the server after it "
                "started, so whether it took effect is unknown. Read the resource to see "
                "what happened; to send the change again, use a new key.",
            )
        raise ApiProblem(
            "idempotency-key-in-use",
            f"The first request with {HEADER} {key!r} has not finished yet (or was "
            "interrupted: it started at "
            f"{existing.created_at.isoformat()}). Send this request again in a few "
            "seconds to get its answer.",
            headers={"Retry-After": "2"},
        )
    raise ApiProblem(
        "idempotency-key-in-use",
        f"Requests with {HEADER} {key!r} keep racing each other; send it again.",
        headers={"Retry-After": "1"},
    )


def complete(record: IdempotencyRecord, response: Response) -> None:
    headers = {h: response[h] for h in _STORED_HEADERS if response.has_header(h)}
    # Fields a view will not have stored (a secret shown once) are kept as null.
    data = {**response.data, **dict.fromkeys(getattr(response, "not_kept", ()))}
    IdempotencyRecord.objects.filter(pk=record.pk, state=IdempotencyState.IN_PROGRESS).update(
        state=IdempotencyState.COMPLETED,
        status_code=response.status_code,
        response_data=data if getattr(response, "not_kept", ()) else response.data,
        response_headers=headers,
        completed_at=Now(),
    )


def release(record: IdempotencyRecord) -> None:
    """The request was refused and changed nothing: the key may be used again."""
    IdempotencyRecord.objects.filter(pk=record.pk, state=IdempotencyState.IN_PROGRESS).delete()


def interrupt(record: IdempotencyRecord) -> None:
    IdempotencyRecord.objects.filter(pk=record.pk, state=IdempotencyState.IN_PROGRESS).update(
        state=IdempotencyState.INTERRUPTED, completed_at=Now()
    )


def replay(record: IdempotencyRecord) -> Response:
    return Response(
        record.response_data,
        status=record.status_code,
        headers={**record.response_headers, REPLAYED: "true"},
    )


# Errors after which nothing was changed: the services' typed refusals and the API's own.
def _refused(exc: BaseException) -> bool:
    from rest_framework.exceptions import APIException

    from govflow.engine.definitions import DefinitionInvalid
    from recovery.api import RecoveryError

    return isinstance(exc, (APIException, RecoveryError, DefinitionInvalid))


def idempotent(handler):
    """Decorate a view's ``post``: honour ``Idempotency-Key`` as the module doc says."""

    @functools.wraps(handler)
    def wrapped(view, request, *args, **kwargs):
        key = key_from(request)
        if key is None:
            return handler(view, request, *args, **kwargs)
        body = request.data  # parse first: an unreadable body never claims a key
        fp = request_fingerprint(request.method, request.path, body)
        principal = principal_of(request)
        found = claim(
            owner=principal.owner, key=key, method=request.method, path=request.path, fp=fp
        )
        if found.replay:
            return replay(found.record)
        try:
            response = handler(view, request, *args, **kwargs)
        except BaseException as exc:
            (release if _refused(exc) else interrupt)(found.record)
            raise
        if 200 <= response.status_code < 300:
            complete(found.record, response)
        else:
            release(found.record)
        return response

    wrapped.idempotent = True
    return wrapped


def purge_expired() -> int:
    """Delete the records older than the window; returns how many."""
    return IdempotencyRecord.objects.filter(created_at__lt=expired_before()).delete()[0]
