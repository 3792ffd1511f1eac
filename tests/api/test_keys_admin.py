"""API keys in the admin and on the command line: shown once, hashed, scoped, revocable."""

from __future__ import annotations

import io
import re

import pytest
from django.contrib import admin
from django.core.management import CommandError, call_command
from django.test import Client
from rest_framework_api_key.models import APIKey

from govflow.api.models import ApiKey
from tests.identity import verified_login

from .conftest import client_with

pytestmark = pytest.mark.django_db

ADD = "/admin/api/apikey/add/"


@pytest.fixture
def admin_client(django_user_model):
    user = django_user_model.objects.create_superuser("root", "root@example.org", "pw")
    return verified_login(Client(), user), user  # managing keys needs a second factor


def test_a_key_made_in_the_admin_is_shown_once_and_stored_hashed(admin_client):
    client, user = admin_client
    response = client.post(
        ADD,
        {
            "name": "Land registry sync",
            "tenant": "north",
            "scope_choices": ["instances:read", "instances:start"],
            "task_topics": "billing, land.sync",
        },
    )
    assert response.status_code == 200
    assert "no-store" in response["Cache-Control"]
    page = response.content.decode()
    key = re.search(r'id="api-key-value" readonly size="60" value="([^"]+)"', page).group(1)
    stored = ApiKey.objects.get()
    assert key.startswith(stored.prefix + ".")
    assert "it is shown this once" in page
    assert key not in stored.hashed_key and key not in stored.pk
    assert (stored.name, stored.tenant, stored.created_by) == ("Land registry sync", "north", user)
    assert stored.scopes == [
        "instances:read",
        "instances:start",
        "tasks:billing",
        "tasks:land.sync",
    ]
    # Nowhere else: the key is not in the session or a message for the next page.
    assert key not in client.get("/admin/api/apikey/").content.decode()
    me = client_with(key).get("/api/v1/me/").json()
    assert me["tenant"] == "north" and me["prefix"] == stored.prefix


def test_bad_task_topics_are_refused_in_the_form(admin_client):
    client, _ = admin_client
    response = client.post(ADD, {"name": "x", "tenant": "north", "task_topics": "bad topic!"})
    assert response.status_code == 200
    assert "Not a topic: bad topic!" in response.content.decode()
    assert not ApiKey.objects.exists()


def test_an_administrator_bound_to_tenants_makes_keys_for_those_only(django_user_model):
    from django.contrib.auth.models import Group

    from tests.identity import verified_login
    from tests.tenancy import bind_tenants

    user = django_user_model.objects.create_user("ada", password="pw", is_staff=True)
    user.groups.add(Group.objects.get(name="Administrator"))
    bind_tenants(user, "north")
    client = verified_login(Client(), user)
    refused = client.post(ADD, {"name": "x", "tenant": "south", "scope_choices": ["all"]})
    assert refused.status_code == 200
    assert "You do not work for the tenant &#x27;south&#x27;" in refused.content.decode()
    assert not ApiKey.objects.exists()
    assert client.post(ADD, {"name": "x", "tenant": "north"}).status_code == 200
    assert ApiKey.objects.get().tenant == "north"


def test_revoking_keys_from_the_list_is_final_and_keys_are_not_deleted(admin_client):
    client, _ = admin_client
    key, raw = ApiKey.objects.create_key(name="old", tenant="north", scopes=["instances:read"])
    response = client.post(
        "/admin/api/apikey/", {"action": "revoke", "_selected_action": [key.pk]}, follow=True
    )
    assert "1 API key(s) revoked" in response.content.decode()
    key.refresh_from_db()
    assert key.revoked
    assert client_with(raw).get("/api/v1/me/").status_code == 401
    assert not admin.site._registry[ApiKey].has_delete_permission(None)


def test_the_librarys_stock_key_model_is_not_offered():
    assert not admin.site.is_registered(APIKey)
    assert admin.site.is_registered(ApiKey)


def test_the_command_prints_a_key_once_or_keeps_one_in_a_file(tmp_path):
    out = io.StringIO()
    call_command(
        "api_key_create", name="cli", tenant="north", scopes=["instances:read"], stdout=out
    )
    key = out.getvalue().strip().splitlines()[-1]
    assert client_with(key).get("/api/v1/me/").json()["name"] == "cli"
    target = tmp_path / "key.txt"
    for _ in range(2):
        call_command(
            "api_key_create", name="demo", tenant="t", scopes=["all"], file=str(target), stdout=out
        )
    assert "kept" in out.getvalue()
    assert target.stat().st_mode & 0o777 == 0o600
    assert ApiKey.objects.filter(name="demo").count() == 1
    assert client_with(target.read_text().strip()).get("/api/v1/me/").status_code == 200
    with pytest.raises(CommandError, match="is not a scope"):
        call_command("api_key_create", name="x", tenant="t", scopes=["everything"])


def test_demo_setup_makes_the_demo_tenants_key(tmp_path):
    target = tmp_path / "demo-api-key.txt"
    call_command(
        "demo_setup", password="pw-demo-123", api_key_file=str(target), stdout=io.StringIO()
    )
    me = client_with(target.read_text().strip()).get("/api/v1/me/").json()
    assert me["tenant"] == "demo-municipality"
    assert "instances:start" in me["scopes"] and "definitions:publish" in me["scopes"]


def test_a_keys_scopes_are_changed_on_its_page_and_a_revoked_key_is_read_only(admin_client):
    from django.contrib.admin.utils import quote

    client, _ = admin_client
    key, raw = ApiKey.objects.create_key(name="sync", tenant="north", scopes=["instances:read"])
    url = f"/admin/api/apikey/{quote(key.pk)}/change/"
    page = client.get(url)
    assert page.status_code == 200
    assert key.prefix in page.content.decode() and raw not in page.content.decode()
    response = client.post(
        url,
        {
            "name": "sync",
            "tenant": "north",
            "scope_choices": ["instances:read", "audit:read"],
            "task_topics": "",
            "revoked": "on",
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    key.refresh_from_db()
    assert key.scopes == ["audit:read", "instances:read"] and key.revoked
    assert "readonly" in client.get(url).content.decode()
