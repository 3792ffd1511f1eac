"""What every API view shares: the body limit, the scope check, the caller's tenant."""

from __future__ import annotations

from django.urls import reverse
from rest_framework import exceptions
from rest_framework.generics import GenericAPIView

from ..auth import Principal, principal_of
from ..parsers import max_body_bytes
from ..permissions import HasScope
from ..problems import PayloadTooLarge


def declared_length(request) -> int:
    try:
        return int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return 0


class ApiView(GenericAPIView):
    """A thin view: parse, check the scope, call one service (or a selector), render.

    ``scopes`` names the scope each method needs; ``HasScope`` refuses the rest.
    """

    permission_classes = [HasScope]
    scopes: dict[str, str] = {}
    # No OPTIONS: the schema describes the API (and CORS is not offered).
    http_method_names = ["get", "post", "head"]

    def initial(self, request, *args, **kwargs):
        # Before anything else, authentication included: a body over the limit is never read.
        limit = max_body_bytes()
        if declared_length(request) > limit:
            raise PayloadTooLarge(limit)
        super().initial(request, *args, **kwargs)

    @property
    def principal(self) -> Principal:
        principal = principal_of(self.request)
        assert principal is not None, "HasScope lets authenticated callers through only"
        return principal

    @property
    def tenant(self) -> str | None:
        """The tenant whose objects this caller sees; None: every tenant."""
        return self.principal.tenant

    def acting_tenant(self, named: str | None) -> str:
        """The tenant a change is made for: the key's own, or the one a user names."""
        principal = self.principal
        if principal.tenant is not None:
            if named and named != principal.tenant:
                raise exceptions.PermissionDenied(
                    f"This API key acts for the tenant {principal.tenant!r} only; leave "
                    "'tenant' out or name that one."
                )
            return principal.tenant
        if not named:
            raise exceptions.ValidationError(
                {"tenant": ["Signed-in users act for every tenant: name the tenant this is for."]}
            )
        return named

    def url(self, name: str, *args) -> str:
        return self.request.build_absolute_uri(reverse(f"api:{name}", args=args))

    def not_found(self, what: str) -> exceptions.NotFound:
        who = "this API key" if self.principal.key is not None else "you"
        return exceptions.NotFound(f"{what} does not exist, or is not visible to {who}.")
