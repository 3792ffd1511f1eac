"""Who is calling: an API key (``Authorization: Api-Key <key>``) or a signed-in user.

A key acts for its tenant with its scopes. A signed-in user (the admin's session, for the
browser; unsafe methods need the CSRF token) acts for the tenants the desk gives them
(their ``tenant:<name>`` groups, every tenant for a superuser: ADR 0018), and each scope
is checked as the model permission that stands for it (:mod:`govflow.api.scopes`).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django.db.models.functions import Now
from django.utils import timezone
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from govflow.engine.tenancy import tenants_of

from .models import ApiKey
from .scopes import SCOPES, TASK_PERMISSION, KeyActor

KEYWORD = "Api-Key"
REALM = 'Api-Key realm="GovFlow API"'
LAST_USED_EVERY = dt.timedelta(minutes=1)


class ApiKeyAuthentication(authentication.BaseAuthentication):
    """``Authorization: Api-Key <prefix>.<secret>``; the user is the key's :class:`KeyActor`."""

    def authenticate(self, request: Request):
        header = request.META.get("HTTP_AUTHORIZATION", "")
        if not header:
            return None
        scheme, _, key = header.partition(" ")
        if scheme.lower() != KEYWORD.lower():
            if scheme.lower() in {"bearer", "token"}:
                raise exceptions.AuthenticationFailed(
                    f"The Authorization scheme {scheme!r} is not used here. Send the API key "
                    f"as 'Authorization: {KEYWORD} <key>'."
                )
            return None  # e.g. Basic: not an API credential; the session may still apply
        key = key.strip()
        if not key:
            raise exceptions.AuthenticationFailed(
                f"The Authorization header names no key. Send 'Authorization: {KEYWORD} <key>'."
            )
        api_key = _usable_key(key)
        _touch(api_key)
        actor = KeyActor(
            name=api_key.name, prefix=api_key.prefix, scopes=frozenset(api_key.scopes or ())
        )
        return actor, api_key

    def authenticate_header(self, request: Request) -> str:
        return REALM


def _usable_key(key: str) -> ApiKey:
    prefix, dot, _ = key.partition(".")
    unknown = exceptions.AuthenticationFailed(
        "This API key is not valid: no key with this value exists. Check that the whole "
        "key was copied (it is shown once, when it is created)."
    )
    if not dot or not prefix or len(prefix) > 8:
        raise unknown
    api_key = ApiKey.objects.filter(prefix=prefix).first()
    if api_key is None or not api_key.is_valid(key):
        raise unknown
    if api_key.revoked:
        raise exceptions.AuthenticationFailed(
            f"This API key ({api_key.prefix}) was revoked and can no longer be used. Ask an "
            "administrator for a new key."
        )
    if api_key.has_expired:
        raise exceptions.AuthenticationFailed(
            f"This API key ({api_key.prefix}) expired at "
            f"{api_key.expiry_date.isoformat()}. Ask an administrator for a new key."
        )
    return api_key


def _touch(api_key: ApiKey) -> None:
    """Record when a key was last used, at most once a minute (one UPDATE then)."""
    if api_key.last_used_at is None or timezone.now() - api_key.last_used_at > LAST_USED_EVERY:
        ApiKey.objects.filter(pk=api_key.pk).update(last_used_at=Now())


@dataclass(frozen=True)
class Principal:
    """The caller, as the views need it: tenant, scopes, and who to name to services."""

    kind: str  # "api_key" or "session"
    label: str
    tenants: frozenset[str] | None  # None: every tenant (a superuser's session)
    key: ApiKey | None = None
    user: object | None = None  # the signed-in user; None for a key

    def allows(self, scope: str) -> bool:
        if self.key is not None:
            return scope in (self.key.scopes or ())
        permission = SCOPES[scope][0] if scope in SCOPES else TASK_PERMISSION
        return bool(self.user is not None and self.user.has_perm(permission))

    @property
    def owner(self) -> str:
        """Whose Idempotency-Keys these are: one namespace per key, one per user."""
        if self.key is not None:
            return f"api-key:{self.key.prefix}"
        return f"user:{self.user.pk}"

    @property
    def throttle_ident(self) -> str:
        return self.owner


def principal_of(request: Request) -> Principal | None:
    """The authenticated caller of ``request``, or None."""
    auth = request.auth
    if isinstance(auth, ApiKey):
        return Principal(
            kind="api_key",
            label=f"API key {auth.name!r} ({auth.prefix})",
            tenants=frozenset({auth.tenant}),
            key=auth,
        )
    user = request.user
    if user is not None and user.is_authenticated and not isinstance(user, KeyActor):
        return Principal(
            kind="session", label=user.get_username(), tenants=tenants_of(user), user=user
        )
    return None
