"""The one permission check of the API: the caller holds the operation's scope."""

from __future__ import annotations

from rest_framework import exceptions, permissions

from .auth import principal_of
from .scopes import SCOPES


def required_scope(view, method: str) -> str | None:
    scopes = getattr(view, "scopes", None) or {}
    return scopes.get(method) or (scopes.get("GET") if method in ("HEAD", "OPTIONS") else None)


class HasScope(permissions.BasePermission):
    """Authenticated, and holding the scope the view names for this method (``scopes``).

    Views list their scope per method: ``scopes = {"GET": "instances:read"}``. A method
    without a scope is refused (a view that forgets one is closed, never open).
    """

    def has_permission(self, request, view) -> bool:
        if request.method.lower() not in view.http_method_names or not hasattr(
            view, request.method.lower()
        ):
            return True  # the view answers 405 with the methods it takes
        principal = principal_of(request)
        if principal is None:
            raise exceptions.NotAuthenticated(
                "Authentication is needed: send 'Authorization: Api-Key <key>', or sign in "
                "to the admin first (browser sessions)."
            )
        scope = required_scope(view, request.method)
        if scope is None:
            raise exceptions.PermissionDenied("This operation is not open to any caller.")
        if principal.allows(scope):
            return True
        if principal.key is not None:
            raise exceptions.PermissionDenied(
                f"This API key lacks the scope {scope!r}, which this operation needs "
                f"({SCOPES[scope][1].rstrip('.')}). Ask an administrator to add it to "
                "the key, or use a key that has it."
            )
        raise exceptions.PermissionDenied(
            f"{principal.label} lacks the permission {SCOPES[scope][0]!r}, which stands for "
            f"the scope {scope!r} this operation needs."
        )


class Authenticated(permissions.BasePermission):
    """Any authenticated caller (for ``/me/``)."""

    def has_permission(self, request, view) -> bool:
        if principal_of(request) is None:
            raise exceptions.NotAuthenticated(
                "Authentication is needed: send 'Authorization: Api-Key <key>', or sign in "
                "to the admin first (browser sessions)."
            )
        return True
