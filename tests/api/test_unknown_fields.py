"""A request body's field the request does not take is a 422 naming it; nothing is done.

DRF drops such keys by default: a misspelt optional field (``reasn``, ``payloadd``) was
lost without a word and the request done without it (ADR 0064).
"""

from __future__ import annotations

import pytest
from drf_spectacular.generators import SchemaGenerator

from govflow.api.models import IdempotencyRecord
from govflow.engine.models import Instance, InstanceStatus
from govflow.events.models import Subscription

from .conftest import DELIVERY_BODY, ENDPOINTS, START_BODY, assert_problem, call

pytestmark = pytest.mark.django_db

WRITES = [(m, p, b) for m, p, _, b in ENDPOINTS if m == "post"]


def test_every_request_body_is_documented_as_taking_its_fields_only():
    schema = SchemaGenerator().get_schema(request=None, public=True)
    components = schema["components"]["schemas"]
    bodies = 0
    for item in schema["paths"].values():
        for operation in item.values():
            for media in operation.get("requestBody", {}).get("content", {}).values():
                name = media["schema"]["$ref"].rsplit("/", 1)[1]
                assert components[name].get("additionalProperties") is False, name
                bodies += 1
    assert bodies >= 11


@pytest.mark.parametrize(("method", "path", "body"), WRITES)
def test_an_unknown_field_is_refused_by_every_write(key_client, world, method, path, body):
    instances = Instance.objects.count()
    response = call(key_client, method, world.fill(path), {**body, "priorty": "high"})
    problem = assert_problem(response, 422, "validation-failed")
    # A definition document is refused by the engine's validation, in its own words.
    assert "'priorty' is not a field" in problem["detail"] or any(
        e["field"] == "priorty" and e["detail"].startswith("Not a field of this request")
        for e in problem["errors"]
    ), problem
    assert Instance.objects.count() == instances
    assert Instance.objects.get(pk=world.north_instance).status == InstanceStatus.WAITING


def test_a_misspelt_optional_field_is_named_with_the_fields_the_request_takes(key_client, world):
    path = f"/api/v1/instances/{world.north_instance}/cancel/"
    response = key_client.post(path, {"reason": "Withdrawn", "Reason": "x"}, format="json")
    problem = assert_problem(response, 422, "validation-failed")
    assert problem["errors"] == [
        {
            "field": "Reason",
            "detail": "Not a field of this request, which takes reason. Check the spelling "
            "(names are case-sensitive); nothing was done.",
        }
    ]
    assert Instance.objects.get(pk=world.north_instance).status == InstanceStatus.WAITING


def test_unknown_fields_are_reported_beside_the_other_errors(key_client, world):
    response = key_client.post(
        "/api/v1/triggers/deliveries/",
        {"message": "report.ready", "delivery_id": "d-1", "payloadd": {"ok": True}},
        format="json",
    )
    problem = assert_problem(response, 422, "validation-failed")
    assert {e["field"] for e in problem["errors"]} == {"correlation", "payloadd"}


def test_a_refused_start_leaves_its_idempotency_key_free(key_client, world):
    refused = key_client.post(
        "/api/v1/instances/",
        {**START_BODY, "variabels": {"ref": "R-1"}},
        format="json",
        HTTP_IDEMPOTENCY_KEY="start-1",
    )
    assert_problem(refused, 422, "validation-failed")
    started = key_client.post(
        "/api/v1/instances/", START_BODY, format="json", HTTP_IDEMPOTENCY_KEY="start-1"
    )
    assert started.status_code == 201, started.content[:300]
    assert started.get("Idempotent-Replayed") is None


def test_a_compensation_start_takes_no_fields(key_client, world):
    path = f"/api/v1/instances/{world.north_instance}/compensations/"
    response = key_client.post(path, {"steps": ["a"]}, format="json")
    problem = assert_problem(response, 422, "validation-failed")
    assert "which takes no fields" in problem["errors"][0]["detail"]


def test_a_webhook_with_an_unknown_field_is_not_registered(keys):
    client = keys()
    hook = {"name": "Case system", "url": "https://127.0.0.1:8443/in", "event_types": []}
    response = client.post("/api/v1/webhooks/", {**hook, "secret": "mine"}, format="json")
    assert_problem(response, 422, "validation-failed")
    assert Subscription.objects.count() == 0
    assert not IdempotencyRecord.objects.exists()


def test_delivery_body_of_the_suite_is_still_taken(key_client, world):
    response = key_client.post("/api/v1/triggers/deliveries/", DELIVERY_BODY, format="json")
    assert response.status_code == 202, response.content[:300]
