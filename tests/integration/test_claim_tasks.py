"""A claimed ``advance`` task carries a share of a dequeue's claims (ADR 0069).

Where worker processes run several instances at once (run threads, PostgreSQL), the
broker shares one dequeue's claims out among the cluster's worker processes, a task each,
at most one claim per run thread of a process; django-q2's per-task work is paid once per
task. Where a process runs one instance at a time (SQLite), a task carries one claim.
Either way every claimed run runs, the task's name counts them, and a run that fails
does not keep the task's other runs from running.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django_q.brokers import get_broker
from django_q.conf import Conf
from django_q.models import Task

from govflow.engine import broker as broker_module
from govflow.engine import tasks as tasks_module
from govflow.engine.broker import claim_task, claims_per_task
from govflow.engine.models import Instance, InstanceStatus
from govflow.engine.queue import instances_claim
from govflow.engine.tasks import advance
from tests.cluster_round import pusher_and_worker_round
from tests.flows import action, linear, start

pytestmark = pytest.mark.django_db(transaction=True)

ON_POSTGRES = connection.vendor == "postgresql"


@pytest.mark.parametrize(
    ("workers", "runs", "claimed", "per_task"),
    [
        (1, 24, 24, 24),  # one process: the whole dequeue in one task
        (1, 24, 5, 5),
        (2, 12, 24, 12),  # two processes: half each
        (2, 12, 5, 3),  # rounded up: a task of 3, a task of 2
        (2, 12, 1, 1),
        (4, 8, 32, 8),
        (3, 8, 40, 8),  # never more than a process runs at once
        (2, 1, 24, 1),  # one run at a time per process: a claim per task
    ],
)
def test_a_dequeues_claims_are_shared_out_among_the_worker_processes(
    settings, monkeypatch, workers, runs, claimed, per_task
):
    monkeypatch.setattr(Conf, "WORKERS", workers)
    settings.GOVFLOW_WORKER_RUNS = runs
    assert claims_per_task(claimed) == (per_task if ON_POSTGRES else 1)


def test_a_tasks_name_counts_the_runs_it_carries():
    for n in range(3):
        start(linear(action("a")), {"value": f"v{n}"})
    first, *more = instances_claim(holder="pusher", limit=3, ttl=30)
    alone, together = claim_task(first), claim_task(first, *more)
    assert alone["name"].startswith(f"govflow-advance-{first.instance_id}-")
    assert "more" not in alone["kwargs"]
    assert together["name"].startswith(f"govflow-advance-{first.instance_id}+2-")
    assert together["kwargs"]["more"] == [
        (c.instance_id, c.fence, c.holder, c.wakeups) for c in more
    ]


def test_every_claimed_run_of_a_dequeue_runs(settings, monkeypatch):
    """django-q2's pusher and worker as a cluster runs them, two worker processes: with 4
    runs each (PostgreSQL), 4 claims make 2 tasks of 2; with one run each (SQLite), the
    dequeue claims 2 (one per process) and makes a task of each."""
    settings.GOVFLOW_WORKER_RUNS = 4
    ids = [start(linear(action("a"), action("b")), {"value": f"v{n}"}).pk for n in range(4)]
    ran = pusher_and_worker_round(monkeypatch, get_broker(), expected=2)
    assert all(task["success"] for task in ran), [task["result"] for task in ran]
    carried = [1 + len(task["kwargs"].get("more", ())) for task in ran]
    assert carried == ([2, 2] if ON_POSTGRES else [1, 1])
    statuses = list(Instance.objects.filter(pk__in=ids).values_list("status", flat=True))
    assert statuses.count(InstanceStatus.COMPLETED) == sum(carried)


def test_a_run_that_fails_leaves_the_tasks_other_runs_to_run(monkeypatch):
    """Outside a worker's run threads the runs go one after the other; one that raises is
    stored as a failed task of its own, and the next still runs."""
    ids = [start(linear(action("a")), {"value": f"v{n}"}).pk for n in range(3)]
    first, second, third = instances_claim(holder="pusher", limit=3, ttl=30)
    real = tasks_module.instance_run

    def run(*, instance_id, claim=None):
        if instance_id == second.instance_id:
            raise RuntimeError("boom: an unexpected failure of this run")
        return real(instance_id=instance_id, claim=claim)

    monkeypatch.setattr(tasks_module, "instance_run", run)
    task = claim_task(first, second, third)
    outcome = advance(*task["args"], **task["kwargs"])
    assert [run.get("failed", False) for run in outcome["runs"]] == [False, True, False]
    statuses = dict(Instance.objects.filter(pk__in=ids).values_list("pk", "status"))
    assert statuses[first.instance_id] == statuses[third.instance_id] == InstanceStatus.COMPLETED
    assert statuses[second.instance_id] != InstanceStatus.COMPLETED
    [failed] = Task.objects.filter(success=False)
    assert failed.name.startswith(f"govflow-advance-{second.instance_id}-")
    assert "boom: an unexpected failure of this run" in failed.result


def test_the_broker_hands_each_task_its_first_claims_ack(settings, monkeypatch):
    """A task's ack id names its first claim; acknowledging it deletes nothing."""
    settings.GOVFLOW_WORKER_RUNS = 4
    monkeypatch.setattr(Conf, "WORKERS", 1)
    monkeypatch.setattr(broker_module, "monotonic", lambda: 0.0)  # the queue asked lately
    for n in range(3):
        start(linear(action("a")), {"value": f"v{n}"})
    found = get_broker().dequeue() or []
    acks = [str(ack) for ack, _ in found]
    assert all(ack.startswith(broker_module.CLAIM_ACK) for ack in acks), acks
    # One task of 3 claims; on SQLite a task per claim, as many as a dequeue claims.
    assert len(acks) == (1 if ON_POSTGRES else min(3, broker_module.claim_batch()))
