"""Desk users bound to tenants (ADR 0018): tests' staff users work for the tenants the
tests start instances in, as the demo's do for the demo tenant."""

from __future__ import annotations

from django.contrib.auth.models import Group

from govflow.engine.tenancy import tenant_group_name

TEST_TENANTS = ("default", "city-hall", "t", "north", "south", "demo-municipality")


def bind_tenants(user, *tenants: str) -> None:
    """Make ``user`` work for ``tenants`` (every test tenant when none are named)."""
    for tenant in tenants or TEST_TENANTS:
        group, _ = Group.objects.get_or_create(name=tenant_group_name(tenant))
        user.groups.add(group)
