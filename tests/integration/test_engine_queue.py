"""Bulk enqueueing: the packages ``enqueue_many`` writes are what django-q2 workers run."""

from __future__ import annotations

import queue
from multiprocessing import Event, Value

import pytest
from django.db import transaction
from django_q import pusher as pusher_module
from django_q import worker as worker_module
from django_q.brokers import get_broker
from django_q.conf import Conf
from django_q.models import OrmQ
from django_q.signing import SignedPackage
from django_q.tasks import async_task

from govflow.engine.models import Instance, InstanceStatus
from govflow.engine.queue import ADVANCE, ADVANCE_GROUP, enqueue_many
from tests.engine_helpers import chain_ok
from tests.flows import action, linear, start
from tests.providers.alpha import effects


def queued_tasks() -> list[dict]:
    return [row.task for row in OrmQ.objects.order_by("pk")]


@pytest.mark.django_db
def test_bulk_packages_match_what_async_task_writes():
    instance = start(linear(action("a")))
    OrmQ.objects.all().delete()
    async_task(ADVANCE, instance.pk, group=ADVANCE_GROUP)
    assert enqueue_many([instance.pk, instance.pk]) == 1, "one task per distinct instance"
    reference, bulk = OrmQ.objects.order_by("pk")
    assert bulk.key == reference.key == get_broker().list_key
    assert bulk.lock is not None
    ours, theirs = SignedPackage.loads(bulk.payload), SignedPackage.loads(reference.payload)
    assert set(ours) == set(theirs)
    assert ours["id"] != theirs["id"] and ours["name"] != theirs["name"]
    for key in ("func", "args", "kwargs", "group", "ack_failure"):
        assert ours[key] == theirs[key], key
    assert (ours["func"], ours["args"]) == (ADVANCE, (instance.pk,))
    assert ours["group"] == "govflow-advance"
    assert bulk.func() == ADVANCE and bulk.group() == ADVANCE_GROUP  # as the admin shows it


@pytest.mark.django_db
def test_enqueueing_many_instances_is_one_insert_and_stamps_each_instance():
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    instances = [start(linear(action("a")), {"value": f"v{i}"}) for i in range(40)]
    Instance.objects.update(enqueued_at=None)
    OrmQ.objects.all().delete()
    with CaptureQueriesContext(connection) as ctx:
        assert enqueue_many(i.pk for i in instances) == 40
    inserts = [q["sql"] for q in ctx.captured_queries if q["sql"].startswith("INSERT")]
    assert len(inserts) == 1, inserts
    assert len(ctx.captured_queries) <= 3, [q["sql"][:80] for q in ctx.captured_queries]
    assert sorted(t["args"][0] for t in queued_tasks()) == sorted(i.pk for i in instances)
    assert not Instance.objects.filter(enqueued_at__isnull=True).exists()


@pytest.mark.django_db
def test_an_enqueue_rolls_back_with_the_change_it_belongs_to():
    instance = start(linear(action("a")))
    OrmQ.objects.all().delete()
    with pytest.raises(RuntimeError), transaction.atomic():
        enqueue_many([instance.pk])
        raise RuntimeError("the change failed")
    assert not OrmQ.objects.exists(), "no work queued for a change that did not happen"


@pytest.mark.django_db(transaction=True)
def test_a_django_q2_pusher_and_worker_run_the_bulk_packages(monkeypatch):
    """django-q2's own pusher claims the rows and its worker runs ``advance`` from them."""
    monkeypatch.setattr(pusher_module, "setproctitle", None)
    monkeypatch.setattr(worker_module, "setproctitle", None)
    monkeypatch.setattr(Conf, "BULK", 10)  # claim every row in one pusher round
    first = start(linear(action("a")), {"value": "one"})
    second = start(linear(action("a")), {"value": "two"})
    OrmQ.objects.all().delete()
    assert enqueue_many([first.pk, second.pk]) == 2

    tasks, results = queue.Queue(), queue.Queue()
    done = Event()
    done.set()  # one round of dequeueing, then the pusher returns
    pusher_module.pusher(tasks, done, get_broker())
    assert tasks.qsize() == 2, "the pusher accepted both signed packages"
    tasks.put("STOP")
    worker_module.worker(tasks, results, Value("f", -1), -1)

    ran = [results.get_nowait() for _ in range(2)]
    assert all(task["success"] for task in ran), [task["result"] for task in ran]
    assert sorted(task["result"]["instance"] for task in ran) == sorted([first.pk, second.pk])
    assert {task["group"] for task in ran} == {ADVANCE_GROUP}
    for instance in (first, second):
        instance.refresh_from_db()
        assert instance.status == InstanceStatus.COMPLETED, instance.reason
        assert chain_ok(instance)
    assert effects.call_count() == 2
