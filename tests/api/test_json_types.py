"""A request body's value of another JSON type than its field's is a 422 naming the field;
nothing is done (ADR 0064).

DRF converts such values by default: ``{"reason": 7}`` cancelled with the reason "7",
``{"version": "2"}`` started version 2, ``{"max_tasks": true}`` fetched one task. The
OpenAPI document gives each field one type, and that type is what is taken.
"""

from __future__ import annotations

import pytest
from rest_framework import serializers

from govflow.api.request_shape import mistyped
from govflow.engine.external_tasks import TaskState
from govflow.engine.models import ExternalTask, Instance, InstanceStatus

from .conftest import DELIVERY_BODY, START_BODY, assert_problem, call
from .test_tasks import FETCH, TOPIC, fetch, tasks_world, worker  # noqa: F401 (a fixture)

pytestmark = pytest.mark.django_db

BODIES = [
    ("/api/v1/instances/", START_BODY),
    ("/api/v1/instances/{instance}/cancel/", {"reason": "Withdrawn"}),
    ("/api/v1/triggers/deliveries/", DELIVERY_BODY),
]
TEXT_FIELDS = [
    (path, body, name) for path, body in BODIES for name, v in body.items() if isinstance(v, str)
]


@pytest.mark.parametrize(("path", "body", "name"), TEXT_FIELDS)
@pytest.mark.parametrize("value", [7, 2.5, True, ["x"], {"x": 1}])
def test_a_text_field_takes_only_a_json_string(key_client, world, path, body, name, value):
    instances = Instance.objects.count()
    response = call(key_client, "post", world.fill(path), {**body, name: value})
    problem = assert_problem(response, 422, "validation-failed")
    [error] = [e for e in problem["errors"] if e["field"] == name]
    assert error["detail"].startswith("Must be a JSON string, not "), error
    assert Instance.objects.count() == instances
    assert Instance.objects.get(pk=world.north_instance).status == InstanceStatus.WAITING


def test_the_error_names_the_type_sent_and_what_to_do(key_client, world):
    path = f"/api/v1/instances/{world.north_instance}/cancel/"
    response = key_client.post(path, {"reason": 7}, format="json")
    problem = assert_problem(response, 422, "validation-failed")
    assert problem["errors"] == [
        {"field": "reason", "detail": "Must be a JSON string, not an integer: write it in quotes."}
    ]


def test_an_integer_field_takes_no_text_and_no_boolean(key_client, world):
    for version, sent in (("1", "a string"), (True, "a boolean"), (1.5, "a number")):
        response = key_client.post(
            "/api/v1/instances/", {**START_BODY, "version": version}, format="json"
        )
        problem = assert_problem(response, 422, "validation-failed")
        assert problem["errors"] == [
            {"field": "version", "detail": f"Must be an integer, not {sent}."}
        ], version
    started = key_client.post("/api/v1/instances/", {**START_BODY, "version": 1}, format="json")
    assert started.status_code == 201, started.content


@pytest.mark.usefixtures("tasks_world")
def test_list_items_and_numbers_are_checked_too():
    client = worker()
    body = {"worker_id": "w1", "topics": [TOPIC, 5], "lock_duration": 30}
    problem = assert_problem(client.post(FETCH, body, format="json"), 422, "validation-failed")
    assert problem["errors"] == [
        {
            "field": "topics",
            "detail": "Item 1: Must be a JSON string, not an integer: write it in quotes.",
        }
    ]
    body = {"worker_id": "w1", "topics": [TOPIC], "lock_duration": "30"}
    problem = assert_problem(client.post(FETCH, body, format="json"), 422, "validation-failed")
    assert problem["errors"][0]["detail"] == "Must be a number, not a string."
    assert not ExternalTask.objects.filter(state=TaskState.LOCKED).exists()
    # A number field takes an integer as well as a fraction.
    [task] = fetch(client).json()["tasks"]
    failed = client.post(
        f"/api/v1/tasks/{task['id']}/fail/",
        {"worker_id": "w1", "fence": 1, "kind": "transient", "message": "busy", "retry_after": 5},
        format="json",
    )
    assert failed.status_code == 200, failed.content


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        (serializers.CharField(), "x", ""),
        (serializers.CharField(), 0, "Must be a JSON string, not an integer: write it in quotes."),
        (serializers.IntegerField(), 3, ""),
        (serializers.IntegerField(), False, "Must be an integer, not a boolean."),
        (serializers.FloatField(), 3, ""),
        (serializers.FloatField(), "3", "Must be a number, not a string."),
        (serializers.BooleanField(), "true", "Must be a boolean, not a string."),
        (
            serializers.ChoiceField(choices=["a", "b"]),
            1,
            "Must be a JSON string, not an integer: write it in quotes.",
        ),
        (serializers.ChoiceField(choices=[1, 2]), 1, ""),
        (
            serializers.ListField(child=serializers.IntegerField()),
            [1, None, "2"],
            "Item 2: Must be an integer, not a string.",
        ),
        (serializers.DictField(), {"a": 1}, ""),
    ],
)
def test_mistyped(field, value, problem):
    assert mistyped(field, value) == problem
