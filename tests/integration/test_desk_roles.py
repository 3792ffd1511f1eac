"""The desk's roles: groups made by a migration with their permissions (ADR 0018), and the
demo logins in them and in the demo tenant."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management import call_command

from govflow.engine.tenancy import ROLES, roles_of, sees_records, tenants_of

pytestmark = pytest.mark.django_db


def perms(group: str) -> set[str]:
    found = Group.objects.get(name=group).permissions.select_related("content_type")
    return {f"{p.content_type.app_label}.{p.codename}" for p in found}


def test_the_migration_made_the_four_roles_with_their_permissions():
    assert set(Group.objects.filter(name__in=ROLES).values_list("name", flat=True)) == set(ROLES)
    operator, approver = perms("Operator"), perms("Approver")
    auditor, administrator = perms("Auditor"), perms("Administrator")
    assert {"engine.operate_instance", "recovery.request_decision"} <= operator
    assert "recovery.approve_decision" not in operator
    assert {"recovery.approve_decision", "recovery.resolve_incident"} <= approver
    assert "recovery.request_decision" not in approver
    assert all(p.split(".")[1].startswith("view_") for p in auditor)
    assert {"recovery.view_checkpoint", "recovery.view_lease", "api.view_apikey"} <= auditor
    assert auditor <= administrator
    assert {"engine.publish_definition", "api.add_apikey", "auth.change_user"} <= administrator


def test_the_demo_logins_hold_their_roles_and_the_demo_tenant():
    call_command("demo_setup", "--password", "pw", verbosity=0)
    users = get_user_model().objects
    operator, approver, auditor = (
        users.get(username=name) for name in ("operator", "approver", "auditor")
    )
    assert roles_of(operator) == {"Operator"}
    assert roles_of(approver) == {"Operator", "Approver"}
    assert roles_of(auditor) == {"Auditor"}
    assert tenants_of(operator) == tenants_of(auditor) == {"demo-municipality"}
    assert approver.has_perm("govflow_demo.approve_permit")
    assert not operator.has_perm("govflow_demo.approve_permit")
    assert not sees_records(operator) and sees_records(auditor)
    # Run again (make run does, every time): the same, nothing doubled.
    call_command("demo_setup", "--password", "pw", verbosity=0)
    assert users.get(username="operator").groups.count() == 2
