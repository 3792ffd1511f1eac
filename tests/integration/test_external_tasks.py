"""External tasks through the engine's services: fetch and lock, expiry, reports, dead letters.

The same tests run on SQLite and PostgreSQL. Times are the database clock's: a short lock
is waited out by reading that clock (``tests.dbclock``), and a long back-off is brought
forward by moving the task's stored time, never by sleeping through it.
"""

from __future__ import annotations

import datetime as dt
import time

import pytest

from govflow.engine.definitions import DefinitionInvalid, parse_definition
from govflow.engine.errors import EngineConflict, InvalidRequest, NotPermitted
from govflow.engine.models import (
    ExternalTask,
    Incident,
    InstanceStatus,
    Refusal,
    ReportKind,
    TaskReport,
    TaskState,
    TokenState,
)
from govflow.engine.services.external_queue import (
    TaskReportRefused,
    task_extend_lock,
    task_fetch_and_lock,
)
from govflow.engine.services.external_results import (
    task_bpmn_error,
    task_cancel,
    task_complete,
    task_fail,
    task_retry,
)
from tests.dbclock import db_now
from tests.engine_helpers import token_of, user_with
from tests.flows import drive, linear, start

pytestmark = pytest.mark.django_db(transaction=True)

TASK_NODE = {
    "id": "check",
    "type": "external_task",
    "topic": "registry.check",
    "input": {"applicant": "applicant"},
    "output": {"verdict": "verdict"},
    "output_schema": {
        "type": "object",
        "required": ["verdict"],
        "properties": {"verdict": {"enum": ["ok", "refused"]}},
    },
    "retries": 2,
}


def task_document(**changes) -> dict:
    return linear({**TASK_NODE, **changes}, key="tests.external_task")


def waiting_instance(tenant: str = "north", **changes):
    instance = drive(start(task_document(**changes), {"applicant": "Nowak"}, tenant=tenant))
    assert instance.status == InstanceStatus.WAITING
    return instance


def fetch(worker: str, lock: float = 30, **kw):
    return task_fetch_and_lock(topics=["registry.check"], worker=worker, lock_seconds=lock, **kw)


def wait_for_expiry(task_id: int, timeout: float = 10.0) -> None:
    expiry = ExternalTask.objects.get(pk=task_id).lock_expires_at
    deadline = time.monotonic() + timeout
    while db_now() <= expiry:
        assert time.monotonic() < deadline, "the lock did not expire by the database clock"
        time.sleep(0.02)


def reports(task_id: int) -> list[tuple[str, str]]:
    return list(
        TaskReport.objects.filter(task_id=task_id).order_by("pk").values_list("kind", "refusal")
    )


def test_reaching_the_node_creates_an_open_task_with_its_input_and_retry_budget():
    instance = waiting_instance()
    task = ExternalTask.objects.get(instance=instance)
    assert (task.state, task.topic, task.tenant, task.fence) == (
        "open",
        "registry.check",
        "north",
        0,
    )
    assert task.variables == {"applicant": "Nowak"}
    assert task.retries_left == 2
    assert task.token_id == token_of(instance, "check").pk
    assert token_of(instance, "check").state == TokenState.WAITING


def test_fetch_locks_once_and_completion_moves_the_instance_with_the_output_mapped():
    instance = waiting_instance()
    [locked] = fetch("w1")
    assert (locked.fence, locked.variables, locked.instance_id) == (
        1,
        {"applicant": "Nowak"},
        instance.pk,
    )
    assert locked.lock_expires_at > db_now()
    assert fetch("w2") == []  # locked: nobody else gets it
    task_complete(task_id=locked.id, fence=1, worker="w1", variables={"verdict": "ok"})
    instance = drive(instance)
    assert instance.status == InstanceStatus.COMPLETED
    assert instance.variables["verdict"] == "ok"
    assert reports(locked.id) == [(ReportKind.COMPLETE, "")]


def test_expired_lock_is_redelivered_with_a_higher_fence_and_the_late_complete_is_kept():
    instance = waiting_instance()
    [first] = fetch("w1", lock=0.2)
    wait_for_expiry(first.id)
    with pytest.raises(TaskReportRefused) as refused:  # expired, not yet redelivered
        task_complete(task_id=first.id, fence=first.fence, worker="w1", variables={"verdict": "ok"})
    assert refused.value.refusal == Refusal.LOCK_EXPIRED
    [second] = fetch("w2")
    assert (second.id, second.fence) == (first.id, first.fence + 1)
    with pytest.raises(TaskReportRefused) as refused:
        task_complete(
            task_id=first.id, fence=first.fence, worker="w1", variables={"verdict": "refused"}
        )
    assert refused.value.refusal == Refusal.STALE_FENCE
    assert "kept on the task's history" in str(refused.value)
    task_complete(task_id=second.id, fence=second.fence, worker="w2", variables={"verdict": "ok"})
    instance = drive(instance)
    assert instance.status == InstanceStatus.COMPLETED
    assert instance.variables["verdict"] == "ok"  # never the late "refused"
    late = TaskReport.objects.filter(task_id=first.id, refusal=Refusal.STALE_FENCE).get()
    assert (late.worker, late.fence, late.payload) == ("w1", 1, {"verdict": "refused"})
    assert TaskReport.objects.filter(task_id=first.id, refusal="").count() == 1


def test_a_second_complete_is_refused_and_kept_never_applied():
    instance = waiting_instance()
    [locked] = fetch("w1")
    task_complete(task_id=locked.id, fence=1, worker="w1", variables={"verdict": "ok"})
    with pytest.raises(TaskReportRefused) as refused:
        task_complete(task_id=locked.id, fence=1, worker="w1", variables={"verdict": "refused"})
    assert refused.value.refusal == Refusal.ALREADY_DONE
    assert drive(instance).variables["verdict"] == "ok"
    assert reports(locked.id) == [(ReportKind.COMPLETE, ""), (ReportKind.COMPLETE, "already_done")]


def test_variables_against_the_output_schema_are_refused_and_the_lock_stays():
    waiting_instance()
    [locked] = fetch("w1")
    with pytest.raises(InvalidRequest, match="verdict"):
        task_complete(task_id=locked.id, fence=1, worker="w1", variables={"verdict": "maybe"})
    task = ExternalTask.objects.get(pk=locked.id)
    assert (task.state, task.worker) == (TaskState.LOCKED, "w1")
    assert reports(locked.id) == []
    task_complete(task_id=locked.id, fence=1, worker="w1", variables={"verdict": "refused"})


def test_transient_failure_is_not_fetchable_before_its_retry_time():
    waiting_instance()
    [locked] = fetch("w1")
    before = db_now()
    task = task_fail(
        task_id=locked.id, fence=1, worker="w1", message="registry down", retry_after=600
    )
    assert (task.state, task.retries_left, task.worker) == (TaskState.OPEN, 1, "")
    assert dt.timedelta(seconds=599) <= task.fetchable_at - before <= dt.timedelta(seconds=601)
    assert fetch("w2") == []  # enforced: not before its time
    # The database clock moves on by ten minutes (the stored time is brought forward).
    ExternalTask.objects.filter(pk=locked.id).update(fetchable_at=before - dt.timedelta(seconds=1))
    [again] = fetch("w2")
    assert (again.id, again.fence, again.retries_left) == (locked.id, 2, 1)


def test_default_backoff_doubles_and_exhausted_retries_dead_letter_the_task():
    instance = waiting_instance()
    waits = []
    for round_ in range(2):
        [locked] = fetch(f"w{round_}")
        before = db_now()
        task = task_fail(task_id=locked.id, fence=locked.fence, worker=f"w{round_}", message="busy")
        waits.append(round((task.fetchable_at - before).total_seconds()))
        ExternalTask.objects.filter(pk=locked.id).update(
            fetchable_at=before - dt.timedelta(seconds=1)
        )
    assert waits == [10, 20]
    [last] = fetch("w9")
    task = task_fail(task_id=last.id, fence=last.fence, worker="w9", message="still busy")
    assert task.state == TaskState.DEAD
    instance.refresh_from_db()
    assert instance.status == InstanceStatus.BLOCKED
    assert "no retry left" in instance.reason
    assert token_of(instance, "check").state == TokenState.FAILED


def test_permanent_failure_dead_letters_opens_an_incident_and_the_desk_retries(django_user_model):
    instance = waiting_instance()
    [locked] = fetch("w1")
    task_fail(task_id=locked.id, fence=1, worker="w1", message="applicant unknown", permanent=True)
    instance.refresh_from_db()
    assert instance.status == InstanceStatus.BLOCKED
    assert "applicant unknown" in instance.reason and "dead-lettered" in instance.reason
    incident = Incident.objects.get(instance=instance, kind="external_task")
    assert incident.resolved_at is None
    assert fetch("w2") == []  # a dead letter is nobody's work
    clerk = user_with(django_user_model, "clerk")
    with pytest.raises(NotPermitted):
        task_retry(task_id=locked.id, actor=clerk)
    operator = user_with(django_user_model, "operator", "engine.operate_instance")
    fresh = task_retry(task_id=locked.id, actor=operator)
    assert fresh.pk != locked.id and fresh.state == TaskState.OPEN
    assert ExternalTask.objects.get(pk=locked.id).state == TaskState.RETRIED
    incident.refresh_from_db()
    assert incident.resolved_at is None  # resolved with an investigation, not by a retry
    [again] = fetch("w2")
    assert again.id == fresh.pk and again.fence > locked.fence
    task_complete(task_id=again.id, fence=again.fence, worker="w2", variables={"verdict": "ok"})
    assert drive(instance).status == InstanceStatus.COMPLETED


def test_cancel_from_the_desk_cancels_the_instance_and_its_task(django_user_model):
    instance = waiting_instance()
    [locked] = fetch("w1")
    task_bpmn_error(task_id=locked.id, fence=1, worker="w1", error_code="NO_PARCEL", message="x")
    assert ExternalTask.objects.get(pk=locked.id).state == TaskState.DEAD
    assert "NO_PARCEL" in Incident.objects.get(instance=instance).message
    operator = user_with(django_user_model, "operator", "engine.operate_instance")
    task_cancel(task_id=locked.id, actor=operator, reason="Withdrawn by the applicant")
    instance.refresh_from_db()
    assert instance.status == InstanceStatus.CANCELLED
    assert ExternalTask.objects.get(pk=locked.id).state == TaskState.CANCELLED
    with pytest.raises(EngineConflict):
        task_retry(task_id=locked.id, actor=operator)


def test_extend_lock_keeps_a_live_lock_and_never_revives_an_expired_one():
    waiting_instance()
    [locked] = fetch("w1", lock=0.5)
    task_extend_lock(task_id=locked.id, fence=1, worker="w1", lock_seconds=60)
    assert ExternalTask.objects.get(pk=locked.id).lock_expires_at > db_now() + dt.timedelta(
        seconds=50
    )
    assert fetch("w2") == []
    # The clock moves past the lock's expiry (by a second: SQLite stores microseconds,
    # its clock reads milliseconds, so an expiry "now" may still be ahead of it).
    past = db_now() - dt.timedelta(seconds=1)
    ExternalTask.objects.filter(pk=locked.id).update(lock_expires_at=past, fetchable_at=past)
    with pytest.raises(TaskReportRefused) as refused:
        task_extend_lock(task_id=locked.id, fence=1, worker="w1", lock_seconds=60)
    assert refused.value.refusal == Refusal.LOCK_EXPIRED
    assert reports(locked.id) == [(ReportKind.EXTEND, "lock_expired")]
    assert [t.fence for t in fetch("w2")] == [2]


def test_fetch_is_limited_to_the_tenant_and_the_topics_asked_for():
    waiting_instance("north")
    waiting_instance("south")
    waiting_instance("west")
    assert [t.tenant for t in fetch("w1", tenants={"south"}, max_tasks=5)] == ["south"]
    assert fetch("w1", tenants=set(), max_tasks=5) == []
    assert task_fetch_and_lock(topics=["other"], worker="w1", lock_seconds=5) == []
    assert sorted(t.tenant for t in fetch("w2", tenants={"north", "east"}, max_tasks=5)) == [
        "north"
    ]
    assert [t.tenant for t in fetch("w3", max_tasks=5)] == ["west"]


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"topic": "has space"}, "'topic' must be 1 to 100"),
        ({"retries": -1}, "'retries' must be a whole number"),
        ({"output_schema": {"type": "nonsense"}}, "'output_schema' is not a valid JSON Schema"),
        ({"lock": 5}, "'lock' is not a field of a external_task node"),
    ],
)
def test_bad_external_task_nodes_are_refused_naming_the_field(change, words):
    with pytest.raises(DefinitionInvalid) as invalid:
        parse_definition(task_document(**change))
    assert any(words in p for p in invalid.value.problems), invalid.value.problems


def test_the_desk_shows_the_dead_letter_its_late_results_and_retries_it(client, django_user_model):
    instance = waiting_instance()
    [first] = fetch("w1", lock=0.2)
    wait_for_expiry(first.id)
    [second] = fetch("w2")
    with pytest.raises(TaskReportRefused):
        task_complete(task_id=first.id, fence=1, worker="w1", variables={"verdict": "ok"})
    task_fail(
        task_id=first.id, fence=2, worker="w2", message="parcel register gone", permanent=True
    )
    operator = user_with(
        django_user_model, "operator", "engine.view_instance", "engine.operate_instance"
    )
    operator.is_staff = True
    operator.save()
    client.force_login(operator)
    page = client.get(f"/admin/engine/instance/{instance.pk}/change/").content.decode()
    assert "dead-lettered" in page and "parcel register gone" in page
    assert "refused, kept as a late result" in page
    token = token_of(instance, "check")
    response = client.post(f"/admin/engine/instance/{instance.pk}/steps/{token.pk}/retry/")
    assert response.status_code == 302
    fresh = ExternalTask.objects.get(instance=instance, state=TaskState.OPEN)
    assert fresh.fence == second.fence + 1
    assert token_of(instance, "check").state == TokenState.WAITING
    assert [t.fence for t in fetch("w3")] == [fresh.fence + 1]


def test_a_bare_step_retry_of_an_external_task_is_refused(django_user_model):
    from govflow.engine.services.instances import step_retry

    instance = waiting_instance()
    [locked] = fetch("w1")
    task_fail(task_id=locked.id, fence=1, worker="w1", message="gone", permanent=True)
    operator = user_with(django_user_model, "operator", "engine.operate_instance")
    token = token_of(instance, "check")
    with pytest.raises(EngineConflict, match="retry its dead-lettered task"):
        step_retry(instance_id=instance.pk, token_id=token.pk, actor=operator)
    assert token_of(instance, "check").state == TokenState.FAILED


def test_a_task_whose_step_was_cancelled_meanwhile_is_refused_as_not_active(django_user_model):
    from govflow.engine.services.instances import instance_cancel

    instance = waiting_instance()
    [locked] = fetch("w1")
    operator = user_with(django_user_model, "operator", "engine.operate_instance")
    instance_cancel(instance_id=instance.pk, actor=operator, reason="Withdrawn")
    assert ExternalTask.objects.get(pk=locked.id).state == TaskState.CANCELLED
    with pytest.raises(TaskReportRefused) as refused:
        task_complete(task_id=locked.id, fence=1, worker="w1", variables={"verdict": "ok"})
    assert refused.value.refusal == Refusal.NOT_ACTIVE
    # Locked in its row, but its step no longer waits (e.g. cancelled by a decision).
    ExternalTask.objects.filter(pk=locked.id).update(state=TaskState.LOCKED)
    with pytest.raises(TaskReportRefused) as refused:
        task_complete(task_id=locked.id, fence=1, worker="w1", variables={"verdict": "ok"})
    assert refused.value.refusal == Refusal.NOT_ACTIVE
    assert reports(locked.id) == [(ReportKind.COMPLETE, "not_active")] * 2
