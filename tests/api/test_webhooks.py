"""Webhook subscriptions over the REST API: scope, tenant, secret once, URLs checked."""

from __future__ import annotations

import pytest

from govflow.api.models import IdempotencyRecord
from govflow.events.models import Subscription
from govflow.events.signing import secret_of

pytestmark = pytest.mark.django_db

URL = "/api/v1/webhooks/"
HOOK = {"name": "Case system", "url": "https://127.0.0.1:8443/in", "event_types": []}


def test_a_key_registers_a_webhook_for_its_tenant_and_sees_the_secret_once(keys):
    client = keys(tenant="north")
    response = client.post(URL, HOOK, format="json", HTTP_IDEMPOTENCY_KEY="hook-1")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["tenant"] == "north" and body["target"] == HOOK["url"]
    assert body["secret"].startswith("whsec_")
    assert response["Location"].endswith(f"/api/v1/webhooks/{body['id']}/")
    row = Subscription.objects.get(pk=body["id"])
    assert secret_of(row.secret_salt, row.secret_key_id) == body["secret"]
    assert row.created_by_key
    # Read back: never the secret. Replayed: the same subscription, the secret not kept.
    read = client.get(f"{URL}{body['id']}/").json()
    assert "secret" not in read and read["id"] == body["id"]
    again = client.post(URL, HOOK, format="json", HTTP_IDEMPOTENCY_KEY="hook-1")
    assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == body["id"] and again.json()["secret"] is None
    assert Subscription.objects.count() == 1
    assert body["secret"] not in str(list(IdempotencyRecord.objects.values()))


def test_a_bad_url_is_a_422_naming_it_and_records_nothing(keys, settings):
    settings.GOVFLOW_WEBHOOK_ALLOW_PRIVATE = False
    client = keys()
    response = client.post(URL, {**HOOK, "url": "https://10.0.0.5/in"}, format="json")
    assert response.status_code == 422
    problem = response.json()
    assert problem["code"] == "validation-failed"
    assert problem["errors"][0]["field"] == "url"
    assert "10.0.0.5" in problem["detail"] and "public addresses" in problem["detail"]
    assert not Subscription.objects.exists()
    settings.GOVFLOW_WEBHOOK_ALLOW_HTTP = False
    response = client.post(URL, {**HOOK, "url": "http://example.org/in"}, format="json")
    assert response.status_code == 422 and "https://" in response.json()["detail"]
    response = client.post(URL, {**HOOK, "event_types": ["x.y"]}, format="json")
    assert response.status_code == 422
    assert not Subscription.objects.exists()


def test_another_tenants_subscription_is_not_found(keys):
    north, south = keys(tenant="north"), keys(tenant="south")
    made = north.post(URL, HOOK, format="json").json()
    assert south.get(f"{URL}{made['id']}/").status_code == 404
    assert south.post(f"{URL}{made['id']}/deactivate/").status_code == 404
    assert south.post(f"{URL}{made['id']}/rotate-secret/").status_code == 404
    assert south.get(URL).json()["results"] == []
    assert [r["id"] for r in north.get(URL).json()["results"]] == [made["id"]]
    refused = south.post(URL, {**HOOK, "tenant": "north"}, format="json")
    assert refused.status_code == 403
    assert Subscription.objects.count() == 1


def test_without_the_scope_a_key_is_refused(keys):
    client = keys(scopes=["instances:read"])
    response = client.post(URL, HOOK, format="json")
    assert response.status_code == 403 and "webhooks:manage" in response.json()["detail"]
    assert client.get(URL).status_code == 403
    assert not Subscription.objects.exists()


def test_pause_resume_and_rotate(keys):
    client = keys()
    made = client.post(URL, HOOK, format="json").json()
    paused = client.post(f"{URL}{made['id']}/deactivate/")
    assert paused.status_code == 200 and paused.json()["active"] is False
    assert client.post(f"{URL}{made['id']}/activate/").json()["active"] is True
    rotated = client.post(f"{URL}{made['id']}/rotate-secret/").json()
    assert rotated["secret"] and rotated["secret"] != made["secret"]
    row = Subscription.objects.get(pk=made["id"])
    assert secret_of(row.secret_salt, row.secret_key_id) == rotated["secret"]


def test_a_signed_in_user_names_a_tenant_of_theirs(django_user_model):
    from django.contrib.auth.models import Permission
    from rest_framework.test import APIClient

    from tests.identity import verified_login
    from tests.tenancy import bind_only

    user = django_user_model.objects.create_user(username="integrator", password="pw")
    user.user_permissions.set(
        Permission.objects.filter(codename__in=["change_subscription", "add_subscription"])
    )
    bind_only(user, "east", "west")
    client = verified_login(APIClient(), user)  # registering a webhook is privileged
    response = client.post(URL, {**HOOK, "tenant": "north"}, format="json")
    assert response.status_code == 403, response.content  # not one of theirs
    assert not Subscription.objects.exists()
    response = client.post(URL, {**HOOK, "tenant": "east"}, format="json")
    assert response.status_code == 201, response.content
    assert Subscription.objects.get().tenant == "east"
    assert Subscription.objects.get().created_by == user
    unverified = APIClient()
    unverified.force_login(user)
    refused = unverified.post(URL, {**HOOK, "tenant": "west"}, format="json")
    assert refused.status_code == 403
    assert "second factor" in refused.json()["detail"]
    assert Subscription.objects.count() == 1
