"""``govflow.client`` against a live server: the loop, renewal, lost locks, graceful stop."""

from __future__ import annotations

import threading
import time

import pytest

from govflow.client import BpmnError, LockLost, TaskClient, TaskFailure, Worker, idempotency_key
from govflow.engine.models import (
    ExternalTask,
    Instance,
    InstanceStatus,
    ReportKind,
    TaskState,
)
from govflow.engine.services.definitions import definition_publish
from govflow.engine.services.external_queue import task_fetch_and_lock
from govflow.engine.services.instances import instance_start
from tests.api.conftest import make_key
from tests.dbclock import db_now
from tests.flows import drive, linear

pytestmark = pytest.mark.django_db(transaction=True)

TOPIC = "client.check"


@pytest.fixture
def definition(db):
    return definition_publish(
        document=linear(
            {
                "id": "check",
                "type": "external_task",
                "topic": TOPIC,
                "output": {"verified": "verified"},
                "output_schema": {"type": "object", "required": ["verified"]},
                "retries": 1,
            },
            key="tests.client_check",
            version=1,
        )
    )


def waiting(definition) -> Instance:
    return drive(instance_start(definition=definition, variables={"a": 1}, tenant="north"))


@pytest.fixture
def client(live_server):
    raw = make_key("north", [f"tasks:{TOPIC}"])[1]
    return TaskClient(live_server.url, raw, timeout=10)


def test_the_worker_fetches_runs_the_handler_and_completes(client, definition):
    instance = waiting(definition)
    seen = []

    def handler(task):
        seen.append((task.step, task.variables, task.fence))
        return {"verified": True}

    worker = Worker(client, "w1", {TOPIC: handler}, lock_duration=10)
    assert worker.run_once() == 1
    assert seen == [("check", {"a": 1}, 1)]
    instance = drive(instance)
    assert instance.status == InstanceStatus.COMPLETED and instance.variables["verified"] is True
    assert worker.reported == [(ExternalTask.objects.get().pk, "complete")]
    assert worker.run_once() == 0


def test_the_lock_is_renewed_while_a_slow_handler_runs(client, definition):
    waiting(definition)
    stolen = []

    def slow(task):
        # Run on until the first lock would have expired and was renewed twice since:
        # conditions, not times, so a busy machine only makes the wait longer.
        first_expiry = ExternalTask.objects.get().lock_expires_at
        seen = {first_expiry}
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            seen.add(ExternalTask.objects.get().lock_expires_at)
            if len(seen) >= 3 and db_now() > first_expiry:  # two renewals, first lock over
                break
            threading.Event().wait(0.05)
        assert len(seen) >= 3, "the lock was not renewed twice within two minutes"
        stolen.extend(task_fetch_and_lock(topics=[TOPIC], worker="thief", lock_seconds=5))
        return {"verified": False}

    # Renewed every third of the lock: 6 s leaves a renewal 4 s to arrive on a busy
    # machine (with 3 s, one delayed past 2 s lost the lock once in CI).
    worker = Worker(client, "w1", {TOPIC: slow}, lock_duration=6)
    assert worker.run_once() == 1
    assert stolen == []  # renewed: never fetchable by another worker meanwhile
    assert worker.reported[0][1] == "complete"


def test_a_lost_lock_is_never_completed(client, definition):
    instance = waiting(definition)

    def handler(task):
        # Meanwhile the lock expires and another worker gets the task.
        ExternalTask.objects.filter(pk=task.id).update(
            lock_expires_at="2000-01-01T00:00:00Z", fetchable_at="2000-01-01T00:00:00Z"
        )
        [other] = task_fetch_and_lock(topics=[TOPIC], worker="w2", lock_seconds=60)
        assert other.fence == task.fence + 1
        threading.Event().wait(0.5)  # the renewal finds the lock gone
        return {"verified": True}

    worker = Worker(client, "w1", {TOPIC: handler}, lock_duration=0.9)
    worker.run_once()
    task = ExternalTask.objects.get()
    assert worker.reported == [(task.pk, "lost")]
    assert not task.reports.filter(kind=ReportKind.COMPLETE).exists()
    assert task.state == TaskState.LOCKED and task.worker == "w2"
    assert drive(instance).status == InstanceStatus.WAITING


def test_failures_and_business_errors_are_reported(client, definition):
    waiting(definition)
    waiting(definition)

    def handler(task):
        if task.instance == Instance.objects.order_by("pk").first().pk:
            raise TaskFailure("register offline", permanent=True)
        raise BpmnError("NO_ADDRESS", "no such address")

    worker = Worker(client, "w1", {TOPIC: handler}, lock_duration=10, max_tasks=2)
    assert worker.run_once() == 2
    states = dict(ExternalTask.objects.values_list("instance_id", "last_error"))
    assert sorted(states.values()) == ["no such address", "register offline"]
    assert set(ExternalTask.objects.values_list("state", flat=True)) == {TaskState.DEAD}


def test_a_report_sent_twice_is_answered_as_the_first_and_a_second_one_is_lock_lost(
    client, definition
):
    waiting(definition)
    [task] = client.fetch_and_lock(worker_id="w1", topics=[TOPIC], lock_duration=10)
    assert idempotency_key(task, "complete") == f"task-{task.id}-1-complete"
    first = client.complete(task, {"verified": True})
    again = client.complete(task, {"verified": True})  # a lost answer, sent again
    assert first == again and first["state"] == "completed"
    task.fence = 99  # another report (another key): refused, the task is done
    with pytest.raises(LockLost) as lost:
        client.complete(task, {"verified": True})
    assert lost.value.code == "task-already-done"


def test_stop_lets_the_task_at_hand_finish_and_report(client, definition):
    waiting(definition)
    waiting(definition)
    handled = []

    def handler(task):
        handled.append(task.id)
        worker.stop()  # e.g. SIGTERM while working
        return {"verified": True}

    worker = Worker(client, "w1", {TOPIC: handler}, lock_duration=10, poll_interval=0.05)
    runner = threading.Thread(target=worker.run)
    runner.start()
    runner.join(timeout=30)
    assert not runner.is_alive()
    assert len(handled) == 1 and worker.reported == [(handled[0], "complete")]
    assert ExternalTask.objects.filter(state=TaskState.OPEN).count() == 1
