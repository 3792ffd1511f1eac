"""Less work per step around the step's own statements (issue 12 part 3, ADR 0030).

Instance runs store no django-q2 result while one-off tasks keep django-q2's behaviour;
workers ask no health check of their connection and notice a dead one at its first
statement instead (taking the lease and loading the instance; the claim), then make that
commit again on a fresh connection; a step's input is checked by a validator compiled
once.
"""

from __future__ import annotations

import pytest
from django.db import OperationalError, close_old_connections, connection, connections
from django_q import monitor as monitor_module
from django_q.brokers import get_broker
from django_q.conf import Conf
from django_q.models import Task
from django_q.tasks import async_task

from govflow.engine import broker as broker_module
from govflow.engine.cluster import health_checks_off
from govflow.engine.models import InstanceStatus
from govflow.engine.queue import ADVANCE_GROUP, instances_claim
from govflow.engine.services import handover, reconnect
from govflow.engine.services.runtime import instance_run
from tests.cluster_round import pusher_and_worker_round
from tests.dbclock import terminate_backend
from tests.engine_helpers import chain_ok
from tests.flows import action, linear, start
from tests.providers.alpha import effects

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch):
    monkeypatch.setattr(reconnect, "RETRY_PAUSE", 0.01)


@pytest.fixture
def unchecked():
    """This process as a qcluster runs it: no connection health checks (restored after)."""
    saved = {
        conn.alias: conn.settings_dict.get("CONN_HEALTH_CHECKS", False)
        for conn in connections.all()
    }
    health_checks_off()
    yield
    for conn in connections.all():
        conn.settings_dict["CONN_HEALTH_CHECKS"] = saved[conn.alias]
        conn.health_check_enabled = saved[conn.alias]


def test_instance_runs_store_no_success_while_one_off_tasks_do(monkeypatch):
    """django-q2's pusher, worker and monitor as a cluster runs them: two claimed runs and
    one ordinary task succeed; only the ordinary task leaves a row in *Successful tasks*."""
    assert Conf.SAVE_LIMIT > 0, "one-off tasks keep django-q2's default: successes are kept"
    broker = get_broker()
    first = start(linear(action("a")), {"value": "one"})
    second = start(linear(action("a")), {"value": "two"})
    async_task("math.floor", 2.5)
    ran = pusher_and_worker_round(monkeypatch, broker, expected=3)
    assert all(task["success"] for task in ran), [task["result"] for task in ran]
    for task in ran:
        monitor_module.save_task(task, broker)

    stored = list(Task.objects.values_list("func", "success"))
    assert stored == [("math.floor", True)], stored
    assert sum(task.get("group") == ADVANCE_GROUP for task in ran) == 2
    for instance in (first, second):
        instance.refresh_from_db()
        assert instance.status == InstanceStatus.COMPLETED, instance.reason


def test_a_failed_instance_run_is_still_stored():
    """A run that raised is kept for the admin's *Failed tasks*, as before."""
    start(linear(action("a")))
    [claim] = instances_claim(holder="pusher-1", limit=1, ttl=30)
    task = broker_module.claim_task(claim)
    task.update(success=False, result="Traceback: boom", stopped=task["started"])
    monitor_module.save_task(task, get_broker())
    assert list(Task.objects.values_list("success", flat=True)) == [False]


def test_a_worker_asks_no_health_check_before_its_statements(unchecked, monkeypatch):
    """The qcluster's processes run no ``SELECT 1`` after django-q2 tidies connections
    before each task (with checks on, Django runs one each time)."""
    wrapper = connections["default"]
    checks = []
    real = type(wrapper).is_usable
    monkeypatch.setattr(type(wrapper), "is_usable", lambda self: checks.append(1) or real(self))

    def three_tasks() -> int:
        checks.clear()
        wrapper.ensure_connection()
        for _ in range(3):
            close_old_connections()  # what django-q2's worker does before each task
            with wrapper.cursor() as cursor:
                cursor.execute("SELECT 1")
        return len(checks)

    assert three_tasks() == 0
    assert wrapper.settings_dict["CONN_HEALTH_CHECKS"] is False
    wrapper.settings_dict["CONN_HEALTH_CHECKS"] = wrapper.health_check_enabled = True
    assert three_tasks() == 3, "the control: a web process's configured checks"


def test_a_connection_lost_before_the_run_is_replaced_and_the_run_completes(monkeypatch):
    instance = start(linear(action("a"), action("b")))
    original, calls = handover.lease_acquire, []

    def dropped_once(**kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise OperationalError("server closed the connection unexpectedly")
        return original(**kwargs)

    monkeypatch.setattr(handover, "lease_acquire", dropped_once)
    report = instance_run(instance_id=instance.pk)
    assert len(calls) == 2, "taken again on a fresh connection"
    assert report.status == InstanceStatus.COMPLETED
    instance.refresh_from_db()
    assert chain_ok(instance)
    assert effects.call_count() == 2


def test_a_run_on_a_connection_that_died_while_idle_completes(unchecked):
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL: pg_terminate_backend ends a server session")
    instance = start(linear(action("a"), action("b")))
    connection.ensure_connection()
    terminate_backend()  # a server restart or a proxy's idle timeout, between two tasks
    close_old_connections()  # django-q2 before the task: without a health check, kept
    report = instance_run(instance_id=instance.pk)
    assert report.status == InstanceStatus.COMPLETED
    assert effects.call_count() == 2


def test_a_lost_connection_at_the_claim_claims_again(monkeypatch):
    instance = start(linear(action("a")))
    original, calls = broker_module.instances_claim, []

    def dropped_once(**kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise OperationalError("server closed the connection unexpectedly")
        return original(**kwargs)

    monkeypatch.setattr(broker_module, "instances_claim", dropped_once)
    found = get_broker().dequeue()
    assert len(calls) == 2
    assert found and found[0][0] == f"{broker_module.CLAIM_ACK}{instance.pk}:1"


def test_a_claim_on_a_connection_that_died_while_idle_claims_again(unchecked):
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL: pg_terminate_backend ends a server session")
    instance = start(linear(action("a")))
    connection.ensure_connection()
    terminate_backend()
    found = get_broker().dequeue()
    assert found and found[0][0].startswith(f"{broker_module.CLAIM_ACK}{instance.pk}:")
