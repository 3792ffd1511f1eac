"""Rights changes in the trail, and four eyes on grants (issue 14 part 3, ADR 0025).

Each rule as an administrator meets it on the admin's pages: a grant waits, its requester
cannot confirm it, a second verified administrator confirms it (applied and chained), a
removal applies at once (chained), no one grants rights to themselves, API keys are
chained, changes made outside the web are recorded, and a tampered fact is found.
"""

from __future__ import annotations

import io
import json

import pytest
from django.contrib.auth.models import Group, Permission
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from govflow.api.models import ApiKey
from govflow.handoffs.roles import roles_install
from govflow.identity.models import RightsChange
from govflow.identity.rights.services import (
    RightsChangeError,
    rights_change_confirm,
    rights_change_request,
)
from govflow.identity.rights.trail import TRAIL
from recovery import api
from recovery.models import Checkpoint
from tests.identity import verified_login

pytestmark = pytest.mark.django_db


def trail(kind: str) -> list[dict]:
    return api.facts_read(subject=TRAIL, kind=f"rights.{kind}")


def role(name: str) -> Group:
    return Group.objects.get(name=name)


def perm(label: str) -> Permission:
    app, code = label.split(".")
    return Permission.objects.get(content_type__app_label=app, codename=code)


@pytest.fixture(autouse=True)
def roles():
    roles_install(Group, Permission)


@pytest.fixture
def ada(django_user_model):
    """The subject: a member of staff with no rights yet."""
    return django_user_model.objects.create_user(username="ada", password="pw", is_staff=True)


def administrator(django_user_model, name: str, *, superuser: bool = False):
    user = django_user_model.objects.create_user(
        username=name, password="pw", is_staff=True, is_superuser=superuser
    )
    user.groups.add(role("Administrator"))
    return django_user_model.objects.get(pk=user.pk)


@pytest.fixture
def bert(django_user_model):
    return administrator(django_user_model, "bert")


@pytest.fixture
def cleo(django_user_model):
    return administrator(django_user_model, "cleo")


def user_form(user, *, groups=(), perms=(), superuser=False, staff=True) -> dict:
    data = {
        "username": user.username,
        "first_name": "",
        "last_name": "",
        "email": "",
        "is_active": "on",
        "groups": [g.pk for g in groups],
        "user_permissions": [p.pk for p in perms],
        "date_joined_0": "2026-12-01",
        "date_joined_1": "10:00:00",
        "last_login_0": "",
        "last_login_1": "",
        "_save": "Save",
    }
    if staff:
        data["is_staff"] = "on"
    if superuser:
        data["is_superuser"] = "on"
    return data


def change_user(client: Client, user, **form):
    url = reverse("admin:auth_user_change", args=[user.pk])
    return client.post(url, user_form(user, **form), follow=True)


def confirm(client: Client, change: RightsChange):
    url = reverse("admin:identity_rightschange_confirm", args=[change.pk])
    return client.post(url, follow=True)


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def test_adding_a_user_to_approver_in_the_admin_waits_for_a_second_administrator(ada, bert):
    response = change_user(verified_login(Client(), bert), ada, groups=[role("Approver")])
    assert response.status_code == 200
    assert not ada.groups.filter(name="Approver").exists()
    change = RightsChange.objects.get()
    assert (change.state, change.user, change.group, change.requested_by) == (
        "pending",
        ada,
        role("Approver"),
        bert,
    )
    assert (
        "This change gives ada the Approver role; it takes effect when a second "
        "administrator confirms it under Rights changes" in " ".join(messages_of(response))
    )
    [requested] = trail("change_requested")
    assert (requested["user"], requested["group_name"], requested["by"]) == (
        ada.pk,
        "Approver",
        bert.pk,
    )
    assert requested["via"] == "web" and requested["at"]


def test_a_form_saved_twice_asks_for_the_grant_once(ada, bert):
    client = verified_login(Client(), bert)
    change_user(client, ada, groups=[role("Approver")])
    change_user(client, ada, groups=[role("Approver")])
    assert RightsChange.objects.count() == 1
    assert len(trail("change_requested")) == 1


def test_the_requester_cannot_confirm_their_own_rights_change(ada, bert):
    client = verified_login(Client(), bert)
    change_user(client, ada, groups=[role("Approver")])
    change = RightsChange.objects.get()
    response = confirm(client, change)
    assert "You requested this change, so you cannot confirm it" in " ".join(messages_of(response))
    change.refresh_from_db()
    assert change.state == "pending" and not ada.groups.filter(name="Approver").exists()
    assert trail("change_confirmed") == []


def test_a_second_verified_administrator_confirms_and_the_grant_is_applied_and_chained(
    ada, bert, cleo
):
    change_user(verified_login(Client(), bert), ada, groups=[role("Approver")])
    change = RightsChange.objects.get()
    pending_list = verified_login(Client(), cleo).get(
        reverse("admin:identity_rightschange_changelist")
    )
    assert "ada joins the Approver role" in pending_list.content.decode()
    response = confirm(verified_login(Client(), cleo), change)
    assert "confirmed and applied" in " ".join(messages_of(response))
    assert ada.groups.filter(name="Approver").exists()
    change.refresh_from_db()
    assert (change.state, change.decided_by) == ("confirmed", cleo)
    [confirmed] = trail("change_confirmed")
    assert (confirmed["requested_by"], confirmed["confirmed_by"]) == (bert.pk, cleo.pk)
    added = [f for f in trail("group_added") if f["user"] == ada.pk]
    assert added[-1] | {"at": None} == {
        "user": ada.pk,
        "group": role("Approver").pk,
        "group_name": "Approver",
        "right": True,
        "change": change.pk,
        "requested_by": bert.pk,
        "by": cleo.pk,
        "via": "confirmed",
        "at": None,
    }
    assert api.chain_verify(TRAIL).ok


def test_a_confirmation_without_a_verified_second_factor_is_refused(ada, bert, cleo):
    change_user(verified_login(Client(), bert), ada, groups=[role("Approver")])
    client = Client()
    client.force_login(cleo)
    response = confirm(client, RightsChange.objects.get())
    assert response.redirect_chain[-1][0] == reverse("admin:identity_enrol")
    assert not ada.groups.filter(name="Approver").exists()


def test_no_one_confirms_a_grant_to_themselves(bert, cleo):
    change = rights_change_request(
        requested_by=bert, kind="group_add", user=cleo, group=role("Approver")
    )
    with pytest.raises(RightsChangeError, match="gives you a right"):
        rights_change_confirm(change_id=change.pk, actor=cleo)
    assert not cleo.groups.filter(name="Approver").exists()


def test_removing_a_user_from_a_role_applies_at_once_and_is_chained(ada, bert):
    ada.groups.add(role("Approver"))
    response = change_user(verified_login(Client(), bert), ada, groups=[])
    assert response.status_code == 200
    assert not ada.groups.exists()
    assert not RightsChange.objects.exists()
    removed = trail("group_removed")[-1]
    assert (removed["user"], removed["group_name"], removed["by"], removed["via"]) == (
        ada.pk,
        "Approver",
        bert.pk,
        "web",
    )


def test_no_one_grants_rights_to_themselves(bert):
    response = change_user(
        verified_login(Client(), bert),
        bert,
        superuser=True,
        groups=[role("Administrator"), role("Approver")],
    )
    assert "No one grants rights to themselves" in response.content.decode()
    bert.refresh_from_db()
    assert not bert.is_superuser and not bert.groups.filter(name="Approver").exists()
    assert not RightsChange.objects.exists()
    with pytest.raises(RightsChangeError, match="No one grants rights to themselves"):
        rights_change_request(requested_by=bert, kind="flag_set", user=bert, flag="is_superuser")


def test_superuser_status_waits_and_only_a_superuser_confirms_it(
    django_user_model, ada, bert, cleo
):
    change_user(verified_login(Client(), bert), ada, superuser=True)
    ada.refresh_from_db()
    assert not ada.is_superuser
    change = RightsChange.objects.get(flag="is_superuser")
    response = confirm(verified_login(Client(), cleo), change)
    assert "Only a superuser may confirm" in " ".join(messages_of(response))
    root = administrator(django_user_model, "root", superuser=True)
    confirm(verified_login(Client(), root), change)
    ada.refresh_from_db()
    assert ada.is_superuser
    flag = trail("flag_set")[-1]
    assert (flag["user"], flag["flag"], flag["by"], flag["change"]) == (
        ada.pk,
        "is_superuser",
        root.pk,
        change.pk,
    )


def test_a_permission_for_a_group_waits_and_reading_applies_at_once(bert, cleo):
    auditor = role("Auditor")
    url = reverse("admin:auth_group_change", args=[auditor.pk])
    before = list(auditor.permissions.all())
    data = {
        "name": "Auditor",
        "permissions": [p.pk for p in before]
        + [perm("engine.publish_definition").pk, perm("auth.view_permission").pk],
    }
    response = verified_login(Client(), bert).post(url, data, follow=True)
    assert "This change gives Auditor the permission engine.publish_definition" in " ".join(
        messages_of(response)
    )
    assert auditor.permissions.filter(codename="view_permission").exists()
    assert not auditor.permissions.filter(codename="publish_definition").exists()
    change = RightsChange.objects.get()
    confirm(verified_login(Client(), cleo), change)
    assert auditor.permissions.filter(codename="publish_definition").exists()
    granted = [f["permission"] for f in trail("permission_granted") if f.get("group") == auditor.pk]
    assert granted[-2:] == ["auth.view_permission", "engine.publish_definition"]


def test_a_tenant_is_a_right_and_a_view_only_role_applies_at_once(ada, bert):
    tenant = Group.objects.create(name="tenant:north")
    change_user(verified_login(Client(), bert), ada, groups=[tenant, role("Auditor")])
    assert list(ada.groups.values_list("name", flat=True)) == ["Auditor"]
    assert RightsChange.objects.get().group == tenant
    auditor_fact = trail("group_added")[-1]
    assert (auditor_fact["group_name"], auditor_fact["right"]) == ("Auditor", False)


@pytest.mark.parametrize(
    ("old", "new"),
    [("Harmless", "tenant:north"), ("tenant:north", "Northerners"), ("tenant:north", "tenant:x")],
)
def test_a_group_is_not_renamed_into_or_out_of_a_tenant(ada, bert, old, new):
    """One administrator must not give a tenant to a group's members by renaming it."""
    group = Group.objects.create(name=old)
    ada.groups.add(group)
    url = reverse("admin:auth_group_change", args=[group.pk])
    response = verified_login(Client(), bert).post(url, {"name": new, "permissions": []})
    assert response.status_code == 200  # the form again, with the reason
    assert "cannot be renamed" in response.content.decode()
    group.refresh_from_db()
    assert group.name == old
    assert list(ada.groups.values_list("name", flat=True)) == [old]


def test_a_group_outside_the_tenants_is_renamed_at_once(bert):
    group = Group.objects.create(name="Night shift")
    url = reverse("admin:auth_group_change", args=[group.pk])
    verified_login(Client(), bert).post(url, {"name": "Late shift", "permissions": []})
    group.refresh_from_db()
    assert group.name == "Late shift"


def test_api_key_creation_and_revocation_are_chained(bert):
    key, _ = ApiKey.objects.create_key(
        name="registry", tenant="north", scopes=["instances:read"], created_by=bert
    )
    created = trail("api_key_created")[-1]
    assert (created["key"], created["tenant"], created["created_by"]) == (
        key.prefix,
        "north",
        bert.pk,
    )
    bert.groups.add(Group.objects.create(name="tenant:north"))
    response = verified_login(Client(), bert).post(
        reverse("admin:api_apikey_changelist"),
        {"action": "revoke", "_selected_action": [key.pk]},
        follow=True,
    )
    assert response.status_code == 200
    revoked = trail("api_key_revoked")[-1]
    assert (revoked["key"], revoked["by"]) == (key.prefix, bert.pk)


def test_a_change_made_outside_the_web_is_recorded_without_an_actor(ada):
    ada.groups.add(role("Approver"))  # a shell, a data fix
    fact = trail("group_added")[-1]
    assert (fact["user"], fact["group_name"], fact["by"], fact["via"]) == (
        ada.pk,
        "Approver",
        None,
        "orm",
    )
    ada.user_permissions.add(perm("recovery.approve_decision"))
    assert trail("permission_granted")[-1]["permission"] == "recovery.approve_decision"
    ada.user_permissions.clear()
    assert trail("permission_revoked")[-1]["user"] == ada.pk


def test_the_first_administrator_is_recorded_as_a_bootstrap_fact(monkeypatch, django_user_model):
    monkeypatch.setenv("DJANGO_SUPERUSER_PASSWORD", "a long bootstrap password")
    call_command(
        "createsuperuser",
        "--noinput",
        username="first",
        email="f@example.org",
        stdout=io.StringIO(),
    )
    first = django_user_model.objects.get(username="first")
    [fact] = [f for f in trail("bootstrap") if f["user"] == first.pk]
    assert (fact["flags"], fact["by"], fact["via"]) == (["is_staff", "is_superuser"], None, "orm")


def test_recovery_verify_detects_a_tampered_rights_fact(ada):
    ada.groups.add(role("Approver"))
    row = Checkpoint.objects.filter(
        subject_type=TRAIL.type, subject_id=TRAIL.id, kind="rights.group_added"
    ).last()
    forged = json.loads(row.fact) | {"user": ada.pk + 1000}
    Checkpoint.objects.filter(pk=row.pk).update(
        fact=json.dumps(forged, sort_keys=True, separators=(",", ":"))
    )
    out = io.StringIO()
    with pytest.raises(SystemExit) as exit_:
        call_command("recovery_verify", "--no-anchors", stdout=out)
    assert exit_.value.code == 1
    assert f"BROKEN {TRAIL} at #{row.seq}: checkpoint #{row.seq}'s fact does not match" in (
        out.getvalue()
    )


def test_the_rights_pages_are_for_administrators_only(django_user_model, ada, bert):
    change_user(verified_login(Client(), bert), ada, groups=[role("Approver")])
    change = RightsChange.objects.get()
    operator = django_user_model.objects.create_user(username="otto", password="pw", is_staff=True)
    operator.groups.add(role("Operator"))
    client = verified_login(Client(), operator)
    assert client.get(reverse("admin:identity_rightschange_changelist")).status_code == 403
    assert (
        client.post(reverse("admin:identity_rightschange_confirm", args=[change.pk])).status_code
        == 403
    )
    back = verified_login(Client(), bert).get(
        reverse("admin:identity_rightschange_confirm", args=[change.pk])
    )
    assert back.status_code == 302
    assert back["Location"] == reverse("admin:identity_rightschange_change", args=[change.pk])


def test_a_rejected_grant_is_never_applied_and_is_chained(ada, bert, cleo):
    change_user(verified_login(Client(), bert), ada, groups=[role("Approver")])
    change = RightsChange.objects.get()
    verified_login(Client(), cleo).post(
        reverse("admin:identity_rightschange_reject", args=[change.pk]), {"note": "not yet"}
    )
    change.refresh_from_db()
    assert (change.state, change.note, change.decided_by) == ("rejected", "not yet", cleo)
    assert not ada.groups.filter(name="Approver").exists()
    assert trail("change_rejected")[-1]["rejected_by"] == cleo.pk
    response = confirm(verified_login(Client(), cleo), change)
    assert "already confirmed or rejected" in " ".join(messages_of(response))


def test_the_work_queue_tells_another_administrator_that_grants_wait(ada, bert, cleo):
    change_user(verified_login(Client(), bert), ada, groups=[role("Approver")])
    home = verified_login(Client(), cleo).get(reverse("admin:index")).content.decode()
    assert "1 rights change awaits a second administrator's confirmation." in home
    own = verified_login(Client(), bert).get(reverse("admin:index")).content.decode()
    assert 'id="rights-waiting"' not in own  # the requester cannot confirm it


def test_identity_names_tenant_groups_as_the_engine_does():
    from govflow.engine.tenancy import TENANT_GROUP_PREFIX as ENGINE
    from govflow.identity.rights.tenants import TENANT_GROUP_PREFIX

    assert TENANT_GROUP_PREFIX == ENGINE
