"""What every API view shares: the body limit, the scope check, the caller's tenant."""

from __future__ import annotations

from django.urls import reverse
from rest_framework import exceptions
from rest_framework.generics import GenericAPIView

from ..auth import Principal, principal_of
from ..filters import VAR_PREFIX
from ..parsers import max_body_bytes
from ..permissions import HasScope
from ..problems import ApiProblem, PayloadTooLarge

_READS = frozenset({"GET", "HEAD"})


def declared_length(request) -> int:
    try:
        return int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return 0


class ApiView(GenericAPIView):
    """A thin view: parse, check the scope, call one service (or a selector), render.

    ``scopes`` names the scope each method needs; ``HasScope`` refuses the rest.

    A query parameter the endpoint does not take is a 400 naming it, before the view does
    anything: a misspelt filter (``?statuss=waiting``) would otherwise be dropped silently
    and answered with the unfiltered list, which looks like an answer (ADR 0064).
    """

    permission_classes = [HasScope]
    scopes: dict[str, str] = {}
    query_parameters: dict[str, frozenset[str]] = {}
    """Query parameters a method takes besides its list's filters and pages (each is
    documented with ``extend_schema``), by method."""
    case_variable_filters = False
    """Whether a list takes ``var.<path>`` filters (``filters.filter_variables``)."""
    # No OPTIONS: the schema describes the API (and CORS is not offered).
    http_method_names = ["get", "post", "head"]

    def initial(self, request, *args, **kwargs):
        # Before anything else, authentication included: a body over the limit is never read.
        limit = max_body_bytes()
        if declared_length(request) > limit:
            raise PayloadTooLarge(limit)
        super().initial(request, *args, **kwargs)
        self.check_query(request)

    def accepted_query(self, method: str) -> frozenset[str]:
        """The query parameters ``method`` takes here (``var.*`` aside): its declared ones
        and, for a read of a list, its filters and its pages'."""
        names = set(self.query_parameters.get("GET" if method == "HEAD" else method, ()))
        if method in _READS:
            filterset = getattr(self, "filterset_class", None)
            if filterset is not None and getattr(self, "filter_backends", None):
                names.update(filterset.base_filters)
            paginator = self.paginator
            if paginator is not None:
                names.update(
                    name
                    for name in (
                        getattr(paginator, "cursor_query_param", None),
                        getattr(paginator, "page_size_query_param", None),
                    )
                    if name
                )
        return frozenset(names)

    def check_query(self, request) -> None:
        method = request.method.lower()
        if method not in self.http_method_names or not hasattr(self, method):
            return  # a method the endpoint lacks is a 405 (its Allow header), whatever it asks
        accepted = self.accepted_query(request.method)
        variables = self.case_variable_filters and request.method in _READS
        unknown = [
            name
            for name in request.query_params
            if name not in accepted and not (variables and name.startswith(VAR_PREFIX))
        ]
        if not unknown:
            return
        takes = sorted(accepted) + ([f"{VAR_PREFIX}<path>"] if variables else [])
        what = f"{request.method} {request.path}"
        offered = f"takes only {', '.join(takes)}" if takes else "takes no query parameters"
        raise ApiProblem(
            "malformed-request",
            f"{what} does not take the query parameter"
            f"{'s' if len(unknown) > 1 else ''} {', '.join(repr(n) for n in unknown)}: it "
            f"{offered}. Check the spelling (names are case-sensitive); nothing was done.",
            errors=[
                {"field": name, "detail": "not a query parameter of this endpoint"}
                for name in unknown
            ],
        )

    def query_value(self, name: str, *, max_length: int = 100) -> str | None:
        """The one value of the query parameter ``name``, or None when it is not given. Given
        twice, empty or too long, it is a 400 that says so: the last of two values winning
        silently would answer a question that was not asked."""
        values = self.request.query_params.getlist(name)
        if not values:
            return None
        value = values[0]
        if len(values) > 1 or not value or len(value) > max_length or "\x00" in value:
            raise exceptions.ParseError(
                f"The query parameter {name!r} is given once, with a value of 1 to "
                f"{max_length} characters (no NUL)."
            )
        return value

    @property
    def principal(self) -> Principal:
        principal = principal_of(self.request)
        assert principal is not None, "HasScope lets authenticated callers through only"
        return principal

    @property
    def tenants(self) -> frozenset[str] | None:
        """The tenants whose objects this caller sees; None: every tenant (a superuser)."""
        return self.principal.tenants

    def acting_tenant(self, named: str | None) -> str:
        """The tenant a change is made for: the key's own, or one of a user's (the one they
        name, or their only one)."""
        principal = self.principal
        if principal.key is not None:
            own = principal.key.tenant
            if named and named != own:
                raise exceptions.PermissionDenied(
                    f"This API key acts for the tenant {own!r} only; leave 'tenant' out or "
                    "name that one."
                )
            return own
        tenants = principal.tenants
        if tenants is not None and not tenants:
            raise exceptions.PermissionDenied(
                "You work for no tenant, so you can change nothing here. An administrator "
                "adds you to a tenant by its group 'tenant:<name>'."
            )
        if named:
            if tenants is not None and named not in tenants:
                raise exceptions.PermissionDenied(
                    f"You do not work for the tenant {named!r}; yours: "
                    f"{', '.join(sorted(tenants))}. Name one of them."
                )
            return named
        if tenants is not None and len(tenants) == 1:
            return next(iter(tenants))
        yours = "every tenant" if tenants is None else ", ".join(sorted(tenants))
        raise exceptions.ValidationError(
            {"tenant": [f"You act for several tenants ({yours}): name the one this is for."]}
        )

    def url(self, name: str, *args) -> str:
        return self.request.build_absolute_uri(reverse(f"api:{name}", args=args))

    def not_found(self, what: str) -> exceptions.NotFound:
        who = "this API key" if self.principal.key is not None else "you"
        return exceptions.NotFound(f"{what} does not exist, or is not visible to {who}.")
