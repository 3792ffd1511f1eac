"""Idempotency-Key: replay, mismatch, in flight, interrupted, per key, expiry, cleanup."""

from __future__ import annotations

import datetime as dt

import pytest
from django.core.management import call_command
from django.db.models.functions import Now

from govflow.api.idempotency import request_fingerprint
from govflow.api.models import IdempotencyRecord, IdempotencyState
from govflow.engine.models import Instance, TriggerDelivery

from .conftest import assert_problem, client_with, make_key

pytestmark = pytest.mark.django_db

START = "/api/v1/instances/"
BODY = {"definition": "tests.api_wait", "variables": {"ref": "R-1"}}


def start(client, body=BODY, key="key-1"):
    return client.post(START, body, format="json", HTTP_IDEMPOTENCY_KEY=key)


def test_the_same_key_and_body_replay_the_stored_response(key_client, waiting_definition):
    first = start(key_client)
    assert first.status_code == 201
    assert "Idempotent-Replayed" not in first
    again = start(key_client)
    assert again.status_code == 201
    assert again["Idempotent-Replayed"] == "true"
    assert again["Location"] == first["Location"]
    assert again.json() == first.json()
    assert Instance.objects.count() == 1
    record = IdempotencyRecord.objects.get()
    assert record.state == IdempotencyState.COMPLETED and record.status_code == 201
    assert record.request_fp == request_fingerprint("POST", START, BODY)
    # Key order in the body does not matter: the fingerprint is over canonical bytes.
    reordered = {"variables": {"ref": "R-1"}, "definition": "tests.api_wait"}
    assert start(key_client, reordered)["Idempotent-Replayed"] == "true"


def test_the_same_key_with_another_body_is_422(key_client, waiting_definition):
    start(key_client)
    other = {"definition": "tests.api_wait", "variables": {"ref": "R-2"}}
    problem = assert_problem(start(key_client, other), 422, "idempotency-key-reused")
    assert "'key-1' was already used for another request" in problem["detail"]
    # ... and on another endpoint.
    problem = assert_problem(
        key_client.post(
            "/api/v1/triggers/deliveries/",
            {"message": "m", "correlation": "c", "delivery_id": "d"},
            format="json",
            HTTP_IDEMPOTENCY_KEY="key-1",
        ),
        422,
        "idempotency-key-reused",
    )
    assert Instance.objects.count() == 1 and not TriggerDelivery.objects.exists()


def test_a_request_while_the_first_is_in_flight_is_409(key_client, waiting_definition):
    key_prefix = client_key_prefix(key_client)
    IdempotencyRecord.objects.create(
        owner=f"api-key:{key_prefix}",
        key="key-1",
        method="POST",
        path=START,
        request_fp=request_fingerprint("POST", START, BODY),
        created_at=Now(),
    )
    response = start(key_client)
    problem = assert_problem(response, 409, "idempotency-key-in-use")
    assert "has not finished yet" in problem["detail"]
    assert response["Retry-After"] == "2"
    assert Instance.objects.count() == 0


def test_an_interrupted_first_request_is_not_run_again(key_client, waiting_definition, monkeypatch):
    from govflow.api.views import instances

    def crash_after_the_change(request, instance):
        raise RuntimeError("the response could not be built")

    monkeypatch.setattr(instances, "instance_detail", crash_after_the_change)
    assert_problem(start(key_client), 500, "server-error")
    assert Instance.objects.count() == 1  # the change happened
    monkeypatch.undo()
    problem = assert_problem(start(key_client), 409, "idempotency-key-in-use")
    assert "whether it took effect is unknown" in problem["detail"]
    assert Instance.objects.count() == 1
    assert IdempotencyRecord.objects.get().state == IdempotencyState.INTERRUPTED


def test_a_refused_request_releases_its_key(key_client, waiting_definition):
    bad = {"definition": "tests.api_wait", "variables": {"ref": 5}}
    assert_problem(start(key_client, bad), 422, "validation-failed")
    assert not IdempotencyRecord.objects.exists()
    # Fixed and sent again with the same key, it runs.
    assert start(key_client).status_code == 201


def test_keys_are_scoped_per_api_key(db, waiting_definition):
    one, two = client_with(make_key(name="one")[1]), client_with(make_key(name="two")[1])
    assert start(one).status_code == 201
    second = start(two)
    assert second.status_code == 201 and "Idempotent-Replayed" not in second
    assert Instance.objects.count() == 2


def test_keys_are_scoped_per_signed_in_user(db, waiting_definition, django_user_model):
    from tests.engine_helpers import user_with

    body = {**BODY, "tenant": "north"}
    clients = []
    for name in ("ann", "bob"):
        client = client_with()
        client.force_login(user_with(django_user_model, name, "engine.start_instance"))
        clients.append(client)
    assert start(clients[0], body).status_code == 201
    assert start(clients[0], body)["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in start(clients[1], body)
    assert Instance.objects.count() == 2


def test_an_expired_key_starts_afresh_and_is_purged(key_client, waiting_definition, settings):
    settings.GOVFLOW_API_IDEMPOTENCY_TTL = 3600
    start(key_client)
    IdempotencyRecord.objects.update(created_at=Now() - dt.timedelta(hours=2))
    again = start(key_client)
    assert again.status_code == 201 and "Idempotent-Replayed" not in again
    assert Instance.objects.count() == 2
    assert IdempotencyRecord.objects.count() == 1
    IdempotencyRecord.objects.update(created_at=Now() - dt.timedelta(hours=2))
    start(key_client, key="key-fresh")
    from io import StringIO

    out = StringIO()
    call_command("api_idempotency_purge", stdout=out)
    assert "Deleted 1 idempotency record(s) older than 1 hours." in out.getvalue()
    assert list(IdempotencyRecord.objects.values_list("key", flat=True)) == ["key-fresh"]


@pytest.mark.parametrize("value", ["", "x" * 256, "with space", "tab\there", "é"])
def test_a_malformed_key_is_400(key_client, waiting_definition, value):
    response = key_client.post(
        START, BODY, format="json", HTTP_IDEMPOTENCY_KEY=value.encode().decode("latin-1")
    )
    problem = assert_problem(response, 400, "malformed-request")
    assert "Idempotency-Key" in problem["detail"]
    assert Instance.objects.count() == 0


def test_a_quoted_structured_field_key_is_the_same_key(key_client, waiting_definition):
    start(key_client, key='"abc-123"')
    assert start(key_client, key="abc-123")["Idempotent-Replayed"] == "true"


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        (
            "/api/v1/triggers/deliveries/",
            {"message": "m", "correlation": "c", "delivery_id": "d"},
            202,
        ),
        ("/api/v1/definitions/", "document", 201),
        ("/api/v1/instances/{instance}/cancel/", {"reason": "Withdrawn"}, 200),
    ],
)
def test_every_changing_post_honours_the_key(key_client, world, path, body, status):
    from .conftest import waiting_document

    body = waiting_document(key="tests.api_idem") if body == "document" else body
    url = world.fill(path)
    first = key_client.post(url, body, format="json", HTTP_IDEMPOTENCY_KEY="k")
    assert first.status_code == status, first.json()
    again = key_client.post(url, body, format="json", HTTP_IDEMPOTENCY_KEY="k")
    assert (again.status_code, again["Idempotent-Replayed"]) == (status, "true")
    assert again.json() == first.json()


def client_key_prefix(client) -> str:
    return client._credentials["HTTP_AUTHORIZATION"].split()[1].split(".")[0]
