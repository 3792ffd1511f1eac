"""Desk users bound to tenants (ADR 0018): tests' staff users work for the tenants the
tests start instances in, as the demo's do for the demo tenant."""

from __future__ import annotations

from django.contrib.auth.models import Group

from govflow.engine.tenancy import TENANT_GROUP_PREFIX, tenant_group_name

TEST_TENANTS = ("default", "city-hall", "t", "north", "south", "demo-municipality")


def bind_tenants(user, *tenants: str) -> None:
    """Make ``user`` work for ``tenants`` (every test tenant when none are named)."""
    for tenant in tenants or TEST_TENANTS:
        group, _ = Group.objects.get_or_create(name=tenant_group_name(tenant))
        user.groups.add(group)


def bind_only(user, *tenants: str) -> None:
    """Make ``user`` work for exactly ``tenants`` (none: for no tenant at all)."""
    user.groups.remove(*user.groups.filter(name__startswith=TENANT_GROUP_PREFIX))
    if tenants:
        bind_tenants(user, *tenants)
    user.__dict__.pop("_govflow_tenants", None)  # tenancy.tenants_of's cache
