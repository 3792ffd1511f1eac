"""Who may call what: every endpoint refuses the anonymous (401), a key without the scope
(403) and another tenant's objects (404), and changes nothing when it refuses."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from govflow.api.scopes import SCOPES, TASK_PERMISSION
from govflow.engine.models import Definition, Instance, TriggerDelivery
from tests.engine_helpers import user_with
from tests.identity import verified_login
from tests.tenancy import bind_only

from .conftest import (
    ALL_SCOPES,
    ENDPOINTS,
    OBJECT_ENDPOINTS,
    assert_problem,
    call,
    client_with,
    make_key,
)

pytestmark = pytest.mark.django_db


def counts():
    return (
        Definition.objects.count(),
        Instance.objects.count(),
        TriggerDelivery.objects.count(),
        Instance.objects.filter(status="cancelled").count(),
    )


@pytest.mark.parametrize(("method", "path", "scope", "body"), ENDPOINTS)
def test_anonymous_callers_get_401_with_a_challenge(world, anon_client, method, path, scope, body):
    before = counts()
    response = call(anon_client, method, world.fill(path), body)
    problem = assert_problem(response, 401, "not-authenticated")
    assert response["WWW-Authenticate"] == 'Api-Key realm="GovFlow API"'
    assert "Api-Key" in problem["detail"]
    assert counts() == before


@pytest.mark.parametrize(("method", "path", "scope", "body"), ENDPOINTS)
def test_a_key_without_the_scope_gets_403_naming_it(world, keys, method, path, scope, body):
    client = keys(scopes=[s for s in ALL_SCOPES if s != scope])
    before = counts()
    response = call(client, method, world.fill(path), body)
    problem = assert_problem(response, 403, "permission-denied")
    assert repr(scope) in problem["detail"]
    assert counts() == before


@pytest.mark.parametrize(("method", "path", "scope", "body"), OBJECT_ENDPOINTS)
def test_another_tenants_object_is_404_like_a_missing_one(
    world, key_client, method, path, scope, body
):
    before = counts()
    theirs = call(key_client, method, world.fill(path, tenant="south"), body)
    problem = assert_problem(theirs, 404, "not-found")
    assert "does not exist, or is not visible to this API key" in problem["detail"]
    assert "tenant" not in problem["detail"]
    assert counts() == before
    missing = path.format(instance=999999, handoff=999999, delivery="no-such-delivery")
    assert_problem(call(key_client, method, missing, body), 404, "not-found")


def test_lists_hold_only_the_keys_tenant(world, key_client):
    instances = key_client.get("/api/v1/instances/").json()["results"]
    assert {i["tenant"] for i in instances} == {"north"}
    assert {i["id"] for i in instances} == {world.north_instance, world.north_uncertain}
    handoffs = key_client.get("/api/v1/handoffs/").json()["results"]
    assert [h["id"] for h in handoffs] == [world.north_handoff]


def test_a_signed_in_user_sees_their_tenants_with_the_model_permissions(world, django_user_model):
    user = user_with(django_user_model, "viewer", "engine.view_instance")  # every test tenant
    client = client_with()
    client.force_login(user)
    instances = client.get("/api/v1/instances/").json()["results"]
    assert {i["tenant"] for i in instances} == {"north", "south"}
    assert client.get(f"/api/v1/instances/{world.south_instance}/").status_code == 200
    # A permission the user lacks is a 403 naming it.
    problem = assert_problem(
        client.get(f"/api/v1/instances/{world.south_instance}/ledger/"), 403, "permission-denied"
    )
    assert "recovery.view_checkpoint" in problem["detail"]


def every_scopes_user(django_user_model, username: str, *tenants: str):
    """A signed-in user holding every scope's permission, working for ``tenants`` only."""
    perms = {SCOPES[s][0] for s in SCOPES} | {TASK_PERMISSION}
    user = user_with(django_user_model, username, *sorted(perms))
    bind_only(user, *tenants)
    return verified_login(client_with(), user)  # its writes are privileged: a second factor


@pytest.mark.parametrize(("method", "path", "scope", "body"), OBJECT_ENDPOINTS)
def test_a_signed_in_user_is_held_to_their_tenants_as_on_the_desk(
    world, django_user_model, method, path, scope, body
):
    client = every_scopes_user(django_user_model, "northerner", "north")
    before = counts()
    theirs = call(client, method, world.fill(path, tenant="south"), body)
    problem = assert_problem(theirs, 404, "not-found")
    assert "does not exist, or is not visible to you" in problem["detail"]
    assert counts() == before
    if method == "get":
        assert call(client, method, world.fill(path)).status_code == 200


def test_a_signed_in_users_lists_hold_only_their_tenants(world, django_user_model):
    client = every_scopes_user(django_user_model, "northerner", "north")
    instances = client.get("/api/v1/instances/").json()["results"]
    assert {i["id"] for i in instances} == {world.north_instance, world.north_uncertain}
    handoffs = client.get("/api/v1/handoffs/").json()["results"]
    assert [h["id"] for h in handoffs] == [world.north_handoff]
    me = client.get("/api/v1/me/").json()
    assert (me["kind"], me["tenant"], me["tenants"]) == ("session", "north", ["north"])

    nobody = every_scopes_user(django_user_model, "unbound")
    assert nobody.get("/api/v1/instances/").json()["results"] == []
    assert nobody.get("/api/v1/handoffs/").json()["results"] == []
    assert nobody.get(f"/api/v1/instances/{world.north_instance}/").status_code == 404
    assert nobody.get("/api/v1/me/").json()["tenants"] == []


def test_a_signed_in_user_starts_only_for_a_tenant_of_theirs(world, django_user_model):
    user = user_with(django_user_model, "starter", "engine.start_instance")
    bind_only(user, "north", "south")
    client = client_with()
    client.force_login(user)
    body = {"definition": "tests.api_wait", "variables": {"ref": "R-1"}}

    def start(**tenant):
        return client.post("/api/v1/instances/", {**body, **tenant}, format="json")

    def refused(status: int, code: str, **tenant) -> dict:
        before = Instance.objects.count()
        problem = assert_problem(start(**tenant), status, code)
        assert Instance.objects.count() == before
        return problem

    problem = refused(422, "validation-failed")
    assert problem["errors"][0]["field"] == "tenant"
    assert "north, south" in problem["errors"][0]["detail"]
    problem = refused(403, "permission-denied", tenant="east")
    assert "do not work for the tenant 'east'" in problem["detail"]
    response = start(tenant="south")
    assert response.status_code == 201, response.json()
    instance = Instance.objects.get(pk=response.json()["id"])
    assert (instance.tenant, instance.started_by) == ("south", user)

    bind_only(user, "north")  # one tenant: it is the one, unnamed
    assert Instance.objects.get(pk=start().json()["id"]).tenant == "north"

    bind_only(user)
    problem = refused(403, "permission-denied", tenant="north")
    assert "You work for no tenant" in problem["detail"]


def test_a_signed_in_user_needs_the_csrf_token_for_changes(world, django_user_model):
    user = user_with(django_user_model, "starter", "engine.start_instance")
    client = client_with()
    client.handler.enforce_csrf_checks = True
    client.force_login(user)
    body = {"definition": "tests.api_wait", "variables": {"ref": "R-1"}, "tenant": "east"}
    before = Instance.objects.count()
    problem = assert_problem(
        client.post("/api/v1/instances/", body, format="json"), 403, "permission-denied"
    )
    assert "CSRF" in problem["detail"]
    assert Instance.objects.count() == before


def test_a_key_cannot_act_for_another_tenant(world, key_client):
    body = {"definition": "tests.api_wait", "variables": {"ref": "R-1"}, "tenant": "south"}
    before = Instance.objects.count()
    problem = assert_problem(
        key_client.post("/api/v1/instances/", body, format="json"), 403, "permission-denied"
    )
    assert "'north' only" in problem["detail"]
    assert Instance.objects.count() == before
    same = key_client.post("/api/v1/instances/", {**body, "tenant": "north"}, format="json")
    assert same.status_code == 201


@pytest.mark.parametrize(
    ("header", "words"),
    [
        ("Api-Key nothing-like-a-key", "not valid"),
        ("Api-Key abc.def", "not valid"),
        ("Api-Key ", "names no key"),
        ("Bearer abc.def", "Api-Key <key>"),
    ],
)
def test_a_bad_key_is_401_saying_why(world, anon_client, header, words):
    response = anon_client.get("/api/v1/instances/", HTTP_AUTHORIZATION=header)
    problem = assert_problem(response, 401, "not-authenticated")
    assert words in problem["detail"]


def test_revoked_and_expired_keys_are_refused(world):
    revoked, raw_revoked = make_key(name="old")
    revoked.revoked = True
    revoked.save()
    _, raw_expired = make_key(expiry_date=timezone.now() - dt.timedelta(minutes=1))
    problem = assert_problem(
        client_with(raw_revoked).get("/api/v1/instances/"), 401, "not-authenticated"
    )
    assert "revoked" in problem["detail"]
    problem = assert_problem(
        client_with(raw_expired).get("/api/v1/instances/"), 401, "not-authenticated"
    )
    assert "expired" in problem["detail"]


def test_me_names_the_key_its_tenant_and_scopes(db):
    key, raw = make_key(scopes=["instances:read", "tasks:billing"])
    body = client_with(raw).get("/api/v1/me/").json()
    assert body == {
        "kind": "api_key",
        "name": "test integration",
        "prefix": key.prefix,
        "tenant": "north",
        "tenants": ["north"],
        "scopes": ["instances:read", "tasks:billing"],
        "expires_at": None,
    }
    key.refresh_from_db()
    assert key.last_used_at is not None


def test_me_for_a_signed_in_user_lists_the_scopes_their_permissions_give(django_user_model):
    user = user_with(django_user_model, "viewer", "engine.view_instance")
    client = client_with()
    client.force_login(user)
    body = client.get("/api/v1/me/").json()
    assert body["kind"] == "session" and body["tenant"] is None
    assert body["scopes"] == sorted(
        s for s, (perm, _) in SCOPES.items() if perm == "engine.view_instance"
    )
