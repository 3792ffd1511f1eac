"""The external-task endpoints: auth per endpoint, fetch and lock, reports, late results."""

from __future__ import annotations

import pytest

from govflow.engine.models import ExternalTask, InstanceStatus, TaskState
from govflow.engine.services.definitions import definition_publish
from govflow.engine.services.instances import instance_start
from tests.api.conftest import assert_problem, call, make_key
from tests.flows import drive, linear

pytestmark = pytest.mark.django_db(transaction=True)

TOPIC = "registry.check"
SCOPE = f"tasks:{TOPIC}"
FETCH = "/api/v1/tasks/fetch-and-lock/"


def task_definition():
    return definition_publish(
        document=linear(
            {
                "id": "check",
                "type": "external_task",
                "topic": TOPIC,
                "output": {"verdict": "verdict"},
                "output_schema": {
                    "type": "object",
                    "required": ["verdict"],
                    "properties": {"verdict": {"type": "string"}},
                },
                "retries": 1,
            },
            key="tests.api_task",
            version=1,
        )
    )


@pytest.fixture
def tasks_world(db):
    """One waiting task per tenant, north and south."""
    definition = task_definition()
    ids = {}
    for tenant in ("north", "south"):
        instance = drive(instance_start(definition=definition, variables={}, tenant=tenant))
        ids[tenant] = ExternalTask.objects.get(instance=instance).pk
        ids[f"{tenant}_instance"] = instance.pk
    return ids


def worker(tenant="north", scopes=(SCOPE,)):
    from tests.api.conftest import client_with

    return client_with(make_key(tenant, list(scopes))[1])


def fetch(client, worker_id="w1", lock=30, **extra):
    body = {"worker_id": worker_id, "topics": [TOPIC], "lock_duration": lock, "max_tasks": 5}
    return client.post(FETCH, body, format="json", **extra)


TASK_ENDPOINTS = [
    ("get", "/api/v1/tasks/{task}/", None),
    (
        "post",
        "/api/v1/tasks/{task}/extend-lock/",
        {"worker_id": "w1", "fence": 1, "lock_duration": 5},
    ),
    (
        "post",
        "/api/v1/tasks/{task}/complete/",
        {"worker_id": "w1", "fence": 1, "variables": {"verdict": "ok"}},
    ),
    (
        "post",
        "/api/v1/tasks/{task}/fail/",
        {"worker_id": "w1", "fence": 1, "kind": "transient", "message": "x"},
    ),
    (
        "post",
        "/api/v1/tasks/{task}/bpmn-error/",
        {"worker_id": "w1", "fence": 1, "error_code": "E1"},
    ),
]


@pytest.mark.parametrize(("method", "path", "body"), TASK_ENDPOINTS)
def test_task_endpoints_refuse_anonymous_wrong_scope_and_other_tenants(
    tasks_world, anon_client, method, path, body
):
    north = path.format(task=tasks_world["north"])
    assert_problem(call(anon_client, method, north, body), 401, "not-authenticated")
    other_topic = worker(scopes=("tasks:other", "instances:read"))
    problem = assert_problem(call(other_topic, method, north, body), 403, "permission-denied")
    assert SCOPE in problem["detail"]
    south = path.format(task=tasks_world["south"])
    assert_problem(call(worker(), method, south, body), 404, "not-found")
    assert ExternalTask.objects.get(pk=tasks_world["south"]).state == TaskState.OPEN


def test_fetch_and_lock_refuses_anonymous_wrong_scope_and_unknown_topics(tasks_world, anon_client):
    assert_problem(fetch(anon_client), 401, "not-authenticated")
    assert_problem(fetch(worker(scopes=("tasks:other",))), 403, "permission-denied")
    unknown = worker(scopes=("tasks:no.such",))
    body = {"worker_id": "w1", "topics": ["no.such"], "lock_duration": 5}
    assert_problem(unknown.post(FETCH, body, format="json"), 404, "not-found")
    bad = {"worker_id": "w1", "topics": [TOPIC], "lock_duration": 0}
    problem = assert_problem(worker().post(FETCH, bad, format="json"), 422, "validation-failed")
    assert problem["errors"][0]["field"] == "lock_duration"
    assert ExternalTask.objects.filter(state=TaskState.LOCKED).count() == 0


def test_a_worker_fetches_its_tenants_task_and_completes_it(tasks_world):
    client = worker()
    response = fetch(client)
    assert response.status_code == 200, response.content
    [task] = response.json()["tasks"]
    assert (task["id"], task["fence"], task["tenant"], task["step"]) == (
        tasks_world["north"],
        1,
        "north",
        "check",
    )
    assert fetch(worker(), "w2").json() == {"tasks": []}
    done = client.post(
        f"/api/v1/tasks/{task['id']}/complete/",
        {"worker_id": "w1", "fence": 1, "variables": {"verdict": "ok"}},
        format="json",
        HTTP_IDEMPOTENCY_KEY=f"task-{task['id']}-1-complete",
    )
    assert done.status_code == 200, done.content
    assert done.json()["state"] == "completed"
    # The same report sent again after a lost answer: the stored answer, not a 409.
    again = client.post(
        f"/api/v1/tasks/{task['id']}/complete/",
        {"worker_id": "w1", "fence": 1, "variables": {"verdict": "ok"}},
        format="json",
        HTTP_IDEMPOTENCY_KEY=f"task-{task['id']}-1-complete",
    )
    assert again.status_code == 200 and again["Idempotent-Replayed"] == "true"
    from govflow.engine.models import Instance

    instance = drive(Instance.objects.get(pk=tasks_world["north_instance"]))
    assert instance.status == InstanceStatus.COMPLETED
    assert instance.variables["verdict"] == "ok"


def test_late_and_duplicate_completes_are_409s_naming_why_and_kept(tasks_world):
    client = worker()
    [task] = fetch(client).json()["tasks"]
    ExternalTask.objects.filter(pk=task["id"]).update(
        lock_expires_at="2000-01-01T00:00:00Z", fetchable_at="2000-01-01T00:00:00Z"
    )
    [redelivered] = fetch(client, "w2").json()["tasks"]
    assert redelivered["fence"] == 2
    url = f"/api/v1/tasks/{task['id']}/complete/"
    late = client.post(
        url, {"worker_id": "w1", "fence": 1, "variables": {"verdict": "late"}}, format="json"
    )
    assert "kept on the task's history" in assert_problem(late, 409, "task-fence-stale")["detail"]
    ok = client.post(
        url, {"worker_id": "w2", "fence": 2, "variables": {"verdict": "ok"}}, format="json"
    )
    assert ok.status_code == 200
    twice = client.post(
        url, {"worker_id": "w2", "fence": 2, "variables": {"verdict": "x"}}, format="json"
    )
    assert_problem(twice, 409, "task-already-done")
    history = client.get(f"/api/v1/tasks/{task['id']}/").json()["reports"]
    assert [(r["kind"], r["applied"], r["refusal"]) for r in history] == [
        ("complete", False, "stale_fence"),
        ("complete", True, ""),
        ("complete", False, "already_done"),
    ]
    assert history[0]["payload"] == {"verdict": "late"}


def test_output_schema_violation_is_422_and_the_lock_stays(tasks_world):
    client = worker()
    [task] = fetch(client).json()["tasks"]
    bad = client.post(
        f"/api/v1/tasks/{task['id']}/complete/",
        {"worker_id": "w1", "fence": 1, "variables": {"verdict": 3}},
        format="json",
    )
    assert "verdict" in assert_problem(bad, 422, "validation-failed")["detail"]
    assert ExternalTask.objects.get(pk=task["id"]).state == TaskState.LOCKED


def test_fail_extend_and_bpmn_error_through_the_api(tasks_world):
    client = worker()
    [task] = fetch(client).json()["tasks"]
    base = f"/api/v1/tasks/{task['id']}"
    extended = client.post(
        f"{base}/extend-lock/", {"worker_id": "w1", "fence": 1, "lock_duration": 120}, format="json"
    )
    assert extended.status_code == 200
    failed = client.post(
        f"{base}/fail/",
        {"worker_id": "w1", "fence": 1, "kind": "transient", "message": "busy", "retry_after": 300},
        format="json",
    )
    assert failed.json()["state"] == "open" and failed.json()["retries_left"] == 0
    assert fetch(client).json() == {"tasks": []}  # not before its retry time
    ExternalTask.objects.filter(pk=task["id"]).update(fetchable_at="2000-01-01T00:00:00Z")
    [again] = fetch(client).json()["tasks"]
    error = client.post(
        f"{base}/bpmn-error/",
        {"worker_id": "w1", "fence": again["fence"], "error_code": "NO_PARCEL", "message": "none"},
        format="json",
    )
    assert error.json()["state"] == "dead"
    from govflow.engine.models import Instance

    instance = Instance.objects.get(pk=tasks_world["north_instance"])
    assert instance.status == InstanceStatus.BLOCKED and "NO_PARCEL" in instance.reason


@pytest.mark.parametrize(("method", "path", "body"), [e for e in TASK_ENDPOINTS if e[2]])
def test_task_reports_with_an_unknown_field_change_nothing(tasks_world, method, path, body):
    client = worker()
    locked = fetch(client).json()["tasks"]
    task = next(t for t in locked if t["id"] == tasks_world["north"])
    report = {**body, "fence": task["fence"], "varaibles": {"verdict": "ok"}}
    response = call(client, method, path.format(task=task["id"]), report)
    problem = assert_problem(response, 422, "validation-failed")
    assert [e["field"] for e in problem["errors"]] == ["varaibles"]
    assert ExternalTask.objects.get(pk=task["id"]).state == TaskState.LOCKED


def test_a_fetch_with_an_unknown_field_locks_nothing(tasks_world):
    client = worker()
    body = {"worker_id": "w1", "topics": [TOPIC], "lock_duration": 30, "maxTasks": 5}
    response = client.post(FETCH, body, format="json")
    assert_problem(response, 422, "validation-failed")
    assert not ExternalTask.objects.filter(state=TaskState.LOCKED).exists()
