"""Which tenants a desk user works for, and the desk's roles (ADR 0018).

A user is bound to a tenant by membership of the group ``tenant:<name>`` (e.g.
``tenant:demo-municipality``), managed on the admin's own Groups page; a superuser works for
every tenant. The roles are the groups Operator, Approver, Auditor and Administrator
(created by the migration ``handoffs.0001_desk_roles`` with their permissions); a
user may hold several. Everything the desk shows or acts on is narrowed to the user's
tenants: another tenant's object is not found (404), not forbidden.
"""

from __future__ import annotations

from django.contrib.auth.models import Group
from django.db.models import CharField, QuerySet
from django.db.models.functions import Cast

from govflow.engine.models import Instance

TENANT_GROUP_PREFIX = "tenant:"

OPERATOR = "Operator"
APPROVER = "Approver"
AUDITOR = "Auditor"
ADMINISTRATOR = "Administrator"
ROLES = (OPERATOR, APPROVER, AUDITOR, ADMINISTRATOR)
RECORDS_ROLES = frozenset({AUDITOR, ADMINISTRATOR})


def tenants_of(user) -> frozenset[str] | None:
    """The tenants ``user`` works for; None: every tenant (a superuser). Cached per user
    object, so a request asks the database once."""
    if not user.is_authenticated:
        return frozenset()
    if user.is_superuser:
        return None
    cached = getattr(user, "_govflow_tenants", None)
    if cached is None:
        names = user.groups.filter(name__startswith=TENANT_GROUP_PREFIX).values_list(
            "name", flat=True
        )
        cached = frozenset(name[len(TENANT_GROUP_PREFIX) :] for name in names)
        user._govflow_tenants = cached
    return cached


def tenant_group_name(tenant: str) -> str:
    return f"{TENANT_GROUP_PREFIX}{tenant}"


def tenant_choices(user) -> list[str]:
    """The tenants ``user`` may start an instance for, sorted: the tenants of their
    ``tenant:`` groups; for a superuser, every tenant a group names. Empty: none."""
    tenants = tenants_of(user)
    if tenants is None:
        names = Group.objects.filter(name__startswith=TENANT_GROUP_PREFIX).values_list(
            "name", flat=True
        )
        tenants = frozenset(name[len(TENANT_GROUP_PREFIX) :] for name in names)
    return sorted(t for t in tenants if t)


def roles_of(user) -> frozenset[str]:
    """The desk roles ``user`` holds (a superuser holds all)."""
    if user.is_superuser:
        return frozenset(ROLES)
    cached = getattr(user, "_govflow_roles", None)
    if cached is None:
        cached = frozenset(user.groups.filter(name__in=ROLES).values_list("name", flat=True))
        user._govflow_roles = cached
    return cached


def sees_records(user) -> bool:
    """Auditors and administrators see the raw tables (the "Records" section)."""
    return user.is_active and user.is_staff and bool(roles_of(user) & RECORDS_ROLES)


def scope(queryset: QuerySet, user, field: str = "tenant") -> QuerySet:
    """``queryset`` narrowed to the rows of ``user``'s tenants (``field`` names the tenant)."""
    tenants = tenants_of(user)
    if tenants is None:
        return queryset
    return queryset.filter(**{f"{field}__in": tenants})


def instances_of(user) -> QuerySet[Instance]:
    """The instances ``user`` may see."""
    return scope(Instance.objects.all(), user)


def instance_ids_of(user) -> QuerySet | None:
    """The ids (as text, the recovery subjects' ids) of ``user``'s instances, as a subquery;
    None: every instance."""
    if tenants_of(user) is None:
        return None
    return instances_of(user).annotate(sid=Cast("pk", CharField())).values("sid")
