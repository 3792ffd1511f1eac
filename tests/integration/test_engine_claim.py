"""Work claimed where it is recorded (ADR 0026): marks, claims with their leases, and
django-q2's own pusher and worker running claimed instances through GovFlow's broker."""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django_q.brokers import get_broker
from django_q.models import OrmQ
from django_q.tasks import async_task

from govflow.engine.broker import ClaimBroker
from govflow.engine.models import Instance, InstanceStatus, Token, TokenState
from govflow.engine.queue import (
    ADVANCE_GROUP,
    instance_mark_runnable,
    instances_claim,
    instances_mark_runnable,
)
from govflow.engine.services.run import instance_lease_key
from govflow.engine.services.runtime import instance_run
from recovery import api
from recovery.models import Lease
from tests.cluster_round import pusher_and_worker_round
from tests.dbclock import wait_until_expired
from tests.engine_helpers import chain_ok, node
from tests.flows import action, linear, start
from tests.providers.alpha import effects


def marked() -> list[int]:
    return list(
        Instance.objects.filter(runnable_at__isnull=False)
        .order_by("pk")
        .values_list("pk", flat=True)
    )


def fences() -> dict[int, int]:
    rows = Lease.objects.filter(key__startswith="instance:").values_list("key", "fence")
    return {int(key.split(":")[1]): fence for key, fence in rows}


@pytest.mark.django_db
def test_starting_an_instance_marks_it_runnable_in_the_same_commit():
    instance = start(linear(action("a")))
    assert marked() == [instance.pk]
    assert not OrmQ.objects.exists(), "no queue row: the mark is the work"


@pytest.mark.django_db
def test_marking_many_is_one_statement_and_rolls_back_with_its_change():
    instances = [start(linear(action("a")), {"value": f"v{i}"}) for i in range(40)]
    Instance.objects.update(runnable_at=None)
    with CaptureQueriesContext(connection) as ctx:
        assert instances_mark_runnable(i.pk for i in instances) == 40
    assert len([q for q in ctx.captured_queries if q["sql"].startswith("UPDATE")]) == 1
    assert marked() == sorted(i.pk for i in instances)
    Instance.objects.update(runnable_at=None)
    with pytest.raises(RuntimeError), transaction.atomic():
        instance_mark_runnable(instances[0].pk)
        raise RuntimeError("the change failed")
    assert marked() == [], "nothing marked for a change that did not happen"


@pytest.mark.django_db
def test_a_claim_takes_the_leases_of_runnable_instances_only():
    first, second, third = (start(linear(action("a")), {"value": f"v{i}"}) for i in range(3))
    Instance.objects.filter(pk=third.pk).update(runnable_at=None)  # nothing to run
    held = api.lease_acquire(key=instance_lease_key(second.pk), holder="busy", ttl=60)
    with CaptureQueriesContext(connection) as ctx:
        claims = instances_claim(holder="pusher-1", limit=10, ttl=30)
    assert [c.instance_id for c in claims] == [first.pk], "a live lease is passed over"
    statements = [
        q for q in ctx.captured_queries if not q["sql"].startswith(("SAVEPOINT", "RELEASE"))
    ]
    # PostgreSQL: one statement picks, leases and returns; SQLite: two under its one writer.
    assert len(statements) == (1 if connection.vendor == "postgresql" else 2), statements
    lease = Lease.objects.get(key=instance_lease_key(first.pk))
    assert (lease.holder, lease.fence) == ("pusher-1", claims[0].fence)
    assert claims[0].wakeups == 1 and claims[0].holder == "pusher-1"
    assert instances_claim(holder="pusher-2", limit=10, ttl=30) == [], "claimed: leased"
    assert fences()[second.pk] == held.fence, "the busy holder's lease is untouched"
    assert marked() == [first.pk, second.pk], "the mark stays while the instance runs"


@pytest.mark.django_db
def test_a_claim_takes_at_most_its_limit_oldest_mark_first():
    ids = [start(linear(action("a")), {"value": f"v{i}"}).pk for i in range(5)]
    got = [c.instance_id for c in instances_claim(holder="p", limit=2, ttl=30)]
    assert got == ids[:2]
    got += [c.instance_id for c in instances_claim(holder="p", limit=10, ttl=30)]
    assert got == ids


@pytest.mark.django_db
def test_a_claimed_run_hands_the_lease_to_its_worker_and_clears_its_mark():
    instance = start(linear(action("a")))
    [claim] = instances_claim(holder="pusher-1", limit=1, ttl=30)
    report = instance_run(instance_id=instance.pk, worker="worker-1", claim=claim)
    assert report.status == InstanceStatus.COMPLETED and report.steps == 2
    lease = Lease.objects.get(key=instance_lease_key(instance.pk))
    assert lease.holder is None and lease.fence == claim.fence + 1, "handed over, released"
    assert marked() == [], "the commit that ended the instance cleared its mark"
    assert chain_ok(instance)


@pytest.mark.django_db
def test_a_stale_claim_changes_nothing_and_fences_only_grow():
    instance = start(linear(action("a")))
    [stale] = instances_claim(holder="paused-pusher", limit=1, ttl=0.3)
    wait_until_expired(instance_lease_key(instance.pk))
    [fresh] = instances_claim(holder="pusher-2", limit=1, ttl=30)
    assert fresh.fence == stale.fence + 1
    report = instance_run(instance_id=instance.pk, worker="worker-1", claim=stale)
    assert report.skipped.startswith("claim lapsed") and report.steps == 0
    assert set(Token.objects.filter(instance=instance).values_list("state", flat=True)) == {
        TokenState.READY
    }
    assert fences()[instance.pk] == fresh.fence, "the stale claim took nothing over"
    assert marked() == [instance.pk]
    report = instance_run(instance_id=instance.pk, worker="worker-2", claim=fresh)
    assert report.status == InstanceStatus.COMPLETED
    assert fences()[instance.pk] == fresh.fence + 1


def waits_on_a_timer() -> Instance:
    return start(linear(node("t", "timer", duration="PT1H"), key="tests.claim"))


@pytest.mark.django_db
def test_a_run_that_ends_waiting_clears_its_mark():
    instance = waits_on_a_timer()
    [claim] = instances_claim(holder="pusher-1", limit=1, ttl=30)
    report = instance_run(instance_id=instance.pk, worker="worker-1", claim=claim)
    assert report.status == InstanceStatus.WAITING
    assert marked() == [], "nothing to run until the timer fires"


@pytest.mark.django_db
def test_a_mark_made_while_the_instance_runs_outlives_the_run():
    """A timer fired or a message arrived while a worker held the lease: the next claim
    must take the instance again, so the run's release keeps the newer mark."""
    instance = waits_on_a_timer()
    [claim] = instances_claim(holder="pusher-1", limit=1, ttl=30)
    instance_mark_runnable(instance.pk)  # someone else's commit, while it is claimed
    report = instance_run(instance_id=instance.pk, worker="worker-1", claim=claim)
    assert report.status == InstanceStatus.WAITING
    assert marked() == [instance.pk]
    [again] = instances_claim(holder="pusher-1", limit=1, ttl=30)
    assert again.instance_id == instance.pk and again.wakeups == claim.wakeups + 1
    instance_run(instance_id=instance.pk, worker="worker-1", claim=again)
    assert marked() == []


@pytest.mark.django_db(transaction=True)
def test_django_q2s_pusher_and_worker_run_claimed_instances_and_ordinary_tasks(monkeypatch):
    """django-q2's own pusher dequeues from GovFlow's broker: claimed runs (acknowledged
    by doing nothing) and an ordinary task of django-q2's queue (acknowledged as ever)."""
    broker = get_broker()
    assert isinstance(broker, ClaimBroker)
    first = start(linear(action("a")), {"value": "one"})
    second = start(linear(action("a")), {"value": "two"})
    async_task("math.floor", 2.5)
    # two claimed runs and one queued task
    ran = pusher_and_worker_round(monkeypatch, broker, expected=3)
    assert all(task["success"] for task in ran), [task["result"] for task in ran]
    runs = [task for task in ran if task.get("group") == ADVANCE_GROUP]
    assert sorted(task["result"]["instance"] for task in runs) == sorted([first.pk, second.pk])
    for task in ran:
        broker.acknowledge(task["ack_id"])
    assert not OrmQ.objects.exists(), "the ordinary task was acknowledged"
    for instance in (first, second):
        instance.refresh_from_db()
        assert instance.status == InstanceStatus.COMPLETED, instance.reason
        assert chain_ok(instance)
    assert effects.call_count() == 2
    assert marked() == []


@pytest.mark.django_db
def test_a_claimed_run_that_fails_unexpectedly_is_not_claimed_again_in_a_loop(monkeypatch):
    from govflow.engine.services import runtime

    instance = start(linear(action("a")))
    [claim] = instances_claim(holder="pusher-1", limit=1, ttl=30)

    def broken(run, report):
        raise RuntimeError("a bug in the engine")

    monkeypatch.setattr(runtime, "_loop", broken)
    with pytest.raises(RuntimeError):
        instance_run(instance_id=instance.pk, worker="worker-1", claim=claim)
    lease = Lease.objects.get(key=instance_lease_key(instance.pk))
    assert lease.holder is None, "the lease is released all the same"
    assert marked() == [instance.pk], "still runnable: the work is not lost"
    assert instances_claim(holder="pusher-1", limit=1, ttl=30) == [], (
        f"claimed again only after {runtime.RETRY_AFTER_ERROR:g} s"
    )


@pytest.mark.django_db(transaction=True)
def test_an_instance_is_claimable_in_the_millisecond_its_start_read_the_clock():
    """A start writes the clock's reading as the instance's runnable mark (ADR 0057). On
    SQLite the clock reads milliseconds as text and the mark is stored with microseconds,
    which sorts after the same millisecond's reading: a claim in that millisecond missed
    the instance (``EngineDialect.reading_end``). Each round marks the instance with a
    fresh reading and claims at once, mostly within the same millisecond."""
    from govflow.engine.db import clock_read

    instance = start(linear(action("a")))
    missed = 0
    for _ in range(300):
        Instance.objects.filter(pk=instance.pk).update(runnable_at=clock_read())
        claimed = instances_claim(holder="pusher-1", limit=1, ttl=30)
        missed += not claimed
        Lease.objects.filter(key=instance_lease_key(instance.pk)).update(
            holder=None, expires_at=None
        )
    assert missed == 0, f"{missed} of 300 claims missed an instance marked runnable"
