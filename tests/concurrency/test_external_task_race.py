"""Workers racing for external tasks on PostgreSQL: real threads, one connection each.

Skipped on SQLite: its single writer serialises the fetch statement, so there is no race
to observe there (the same services are tested on SQLite in
``tests/integration/test_external_tasks.py``).
"""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from govflow.engine.models import ExternalTask, Instance, InstanceStatus, TaskReport, TaskState
from govflow.engine.services.external_queue import TaskReportRefused, task_fetch_and_lock
from govflow.engine.services.external_results import task_complete
from tests.concurrency.test_lease_race import WAIT, run_threads
from tests.flows import drive, linear, start

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.postgres,
    pytest.mark.usefixtures("on_postgres"),
]

TASKS = 24
TOPIC = "race.topic"


def waiting_instances(count: int) -> list[Instance]:
    document = linear(
        {"id": "work", "type": "external_task", "topic": TOPIC, "output": {"done": "done"}},
        key="tests.task_race",
    )
    first = drive(start(document, {"n": 0}))
    from govflow.engine.services.instances import instance_start

    rest = [
        drive(instance_start(definition=first.definition, variables={"n": n}))
        for n in range(1, count)
    ]
    return [first, *rest]


def test_two_workers_racing_claim_every_task_exactly_once_and_complete_it():
    instances = waiting_instances(TASKS)
    go = threading.Barrier(2)

    def worker(name: str) -> list[tuple[int, int]]:
        claimed = []
        go.wait(timeout=WAIT)
        while True:
            batch = task_fetch_and_lock(topics=[TOPIC], worker=name, lock_seconds=60, max_tasks=3)
            if not batch:
                return claimed
            for task in batch:
                claimed.append((task.id, task.fence))
                task_complete(
                    task_id=task.id, fence=task.fence, worker=name, variables={"done": name}
                )

    first, second = run_threads([lambda: worker("w1"), lambda: worker("w2")], barriers=(go,))
    claims = Counter(task_id for task_id, _ in first + second)
    assert len(claims) == TASKS and set(claims.values()) == {1}, "a task was claimed twice"
    assert first and second, "both workers got work"
    assert {fence for _, fence in first + second} == {1}
    for instance in instances:
        instance = drive(instance)
        assert instance.status == InstanceStatus.COMPLETED
        assert instance.variables["done"] in {"w1", "w2"}
    assert TaskReport.objects.filter(refusal="").count() == TASKS


def test_a_late_and_a_current_holder_racing_to_complete_apply_exactly_one():
    [instance] = waiting_instances(1)
    [old] = task_fetch_and_lock(topics=[TOPIC], worker="old", lock_seconds=60)
    ExternalTask.objects.filter(pk=old.id).update(
        lock_expires_at="2000-01-01T00:00:00Z", fetchable_at="2000-01-01T00:00:00Z"
    )
    [new] = task_fetch_and_lock(topics=[TOPIC], worker="new", lock_seconds=60)
    assert new.fence == old.fence + 1
    go = threading.Barrier(2)

    def report(name: str, fence: int) -> str:
        go.wait(timeout=WAIT)
        for _ in range(200):  # the instance's lease is taken by one at a time
            try:
                task_complete(task_id=old.id, fence=fence, worker=name, variables={"done": name})
                return "applied"
            except TaskReportRefused as exc:
                return exc.refusal
            except Exception as exc:  # the other held the instance: try again
                if "advancing this instance" not in str(exc):
                    raise
        return "gave up"

    outcomes = run_threads(
        [lambda: report("old", old.fence), lambda: report("new", new.fence)], barriers=(go,)
    )
    # Refused either way: for its old fence, or because the new holder completed first.
    assert outcomes[0] in {"stale_fence", "already_done"} and outcomes[1] == "applied"
    assert drive(instance).variables["done"] == "new"
    task = ExternalTask.objects.get(pk=old.id)
    assert task.state == TaskState.COMPLETED
    assert list(task.reports.order_by("refusal").values_list("worker", "refusal")) == [
        ("new", ""),
        ("old", outcomes[0]),
    ]
