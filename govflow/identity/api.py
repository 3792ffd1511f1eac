"""Session authentication for the REST API that keeps the web's second-factor rule.

An API key is its own credential and is not affected. A browser session (Swagger UI) of a
privileged user without a second factor verified in this login may read, but not write:
otherwise the API would be a way around the admin's gate (publishing a definition, say).
"""

from __future__ import annotations

from drf_spectacular.authentication import SessionScheme
from rest_framework import exceptions
from rest_framework.authentication import SessionAuthentication
from rest_framework.permissions import SAFE_METHODS

from .policy import enrol_hint, is_privileged, is_verified


class SecondFactorSessionAuthentication(SessionAuthentication):
    def authenticate(self, request):
        result = super().authenticate(request)
        if result is None or request.method in SAFE_METHODS:
            return result
        user = result[0]
        if is_privileged(user) and not is_verified(request._request.user):
            raise exceptions.PermissionDenied(enrol_hint())
        return result


class SecondFactorSessionScheme(SessionScheme):
    """The OpenAPI schema describes it as the session cookie, like DRF's own."""

    target_class = "govflow.identity.api.SecondFactorSessionAuthentication"
