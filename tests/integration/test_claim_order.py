"""The order claims take runnable instances in (ADR 0037): a mark keeps an earlier place,
a run that stopped with work left goes to the back, a deferred mark waits for its time."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db.models.functions import Now

from govflow.engine.models import Instance, InstanceStatus
from govflow.engine.queue import (
    instance_mark_runnable,
    instance_mark_runnable_after,
    instances_claim,
    instances_mark_runnable,
    runnable_defer,
)
from govflow.engine.services import sweep
from govflow.engine.services.run import instance_lease_key
from govflow.engine.services.runtime import instance_run
from govflow.engine.services.timers import timers_fire
from recovery import api
from tests.engine_helpers import node
from tests.flows import action, linear, start
from tests.integration.test_engine_sweep import (
    a_dead_process_holder,
    sweeper_fence,
    waiting_on_timers,
)

pytestmark = pytest.mark.django_db


def marked_ago(ids: list[int], seconds: float) -> None:
    """Give ``ids`` marks made about ``seconds`` ago (database clock), a millisecond apart
    in the order given: their places in line. Equal marks would leave the order among
    them to the database's plan."""
    for n, pk in enumerate(ids):
        ago = dt.timedelta(seconds=seconds) - dt.timedelta(milliseconds=n)
        Instance.objects.filter(pk=pk).update(runnable_at=Now() - ago)


def claim_order(limit: int = 100) -> list[int]:
    return [c.instance_id for c in instances_claim(holder="pusher", limit=limit, ttl=30)]


def backlog(count: int) -> list[int]:
    return [start(linear(action("a")), {"value": f"b{i}"}).pk for i in range(count)]


def test_a_dead_holders_instance_is_claimed_next_ahead_of_a_backlog_of_newer_marks():
    """The recovery case: a worker died holding a claimed instance; the sweeper expires
    its lease (ADR 0022) while hundreds of instances marked since wait. The stranded one
    kept its mark from before them and is the next claim's first."""
    stranded = start(linear(action("a"), action("b"))).pk
    api.lease_acquire(key=instance_lease_key(stranded), holder=a_dead_process_holder(), ttl=3600)
    waiting = backlog(30)
    marked_ago([stranded], 60)
    marked_ago(waiting, 30)
    assert claim_order(limit=1) == [waiting[0]], "its lease is live until it is expired"
    assert sweep.dead_holders_expire(fence=sweeper_fence()) == 1
    assert claim_order(limit=1) == [stranded], "ahead of the instances marked after it"
    assert claim_order() == waiting[1:]


def test_a_mark_keeps_an_earlier_place_and_marks_an_unmarked_instance_now():
    first, second, third = backlog(3)
    marked_ago([first], 60)
    marked_ago([second], 30)
    Instance.objects.filter(pk=third).update(runnable_at=None)
    instances_mark_runnable([first, third])  # a message for the first, a decision for the third
    assert claim_order() == [first, second, third]


def test_a_timer_firing_keeps_the_place_of_an_instance_already_marked():
    ids = waiting_on_timers(3)
    earlier, other, _ = ids
    marked_ago([earlier], 60)  # also woken by a message before its timer fired
    assert timers_fire(fence=sweeper_fence()) == 3
    order = claim_order()
    assert order[0] == earlier and sorted(order) == sorted(ids)
    marked = Instance.objects.get(pk=other).runnable_at
    assert marked is not None and marked > Instance.objects.get(pk=earlier).runnable_at


def test_a_run_that_stopped_with_work_left_goes_behind_the_instances_that_waited(settings):
    settings.GOVFLOW_MAX_STEPS_PER_RUN = 1
    long = start(linear(action("a"), action("b"), action("c"), key="tests.long")).pk
    waiting = backlog(2)
    marked_ago([long], 60)
    marked_ago(waiting, 30)
    [claim] = instances_claim(holder="pusher", limit=1, ttl=30)
    assert claim.instance_id == long
    report = instance_run(instance_id=long, worker="worker-1", claim=claim)
    assert report.more and report.status == InstanceStatus.RUNNING
    assert claim_order() == [*waiting, long], "it had its turn: the others go first"


def test_a_mark_made_while_the_instance_ran_goes_behind_the_instances_that_waited():
    """The run had its turn at the claimed place; what was marked meanwhile is work for
    another run, after the others."""
    timed = start(linear(node("t", "timer", duration="PT1H"), key="tests.order")).pk
    waiting = backlog(2)
    marked_ago([timed], 60)
    marked_ago(waiting, 30)
    [claim] = instances_claim(holder="pusher", limit=1, ttl=30)
    assert claim.instance_id == timed
    instance_mark_runnable(timed)  # a message, while the run holds the lease
    report = instance_run(instance_id=timed, worker="worker-1", claim=claim)
    assert report.status == InstanceStatus.WAITING
    assert claim_order() == [*waiting, timed]


def test_a_deferred_mark_made_while_the_instance_ran_keeps_its_time():
    timed = start(linear(node("t", "timer", duration="PT1H"), key="tests.order")).pk
    [claim] = instances_claim(holder="pusher", limit=1, ttl=30)
    instance_mark_runnable_after(timed, 3600)  # a compensation's next poll, say
    instance_run(instance_id=timed, worker="worker-1", claim=claim)
    assert claim_order() == []
    assert Instance.objects.filter(pk=timed, runnable_at__gt=Now()).exists()


def test_a_deferred_mark_is_honoured_until_its_time():
    polled, failed = backlog(2)
    instance_mark_runnable_after(polled, 3600)  # a compensation's next poll, in an hour
    [claim] = instances_claim(holder="pusher", limit=1, ttl=0.3)
    assert claim.instance_id == failed
    api.lease_release(
        fence=api.Fence(key=instance_lease_key(failed), holder=claim.holder, fence=claim.fence)
    )
    # A run that failed unexpectedly: tried again later, not at once.
    assert runnable_defer(instance_id=failed, wakeups=claim.wakeups, seconds=3600)
    others = backlog(3)
    instances_mark_runnable(others)
    assert claim_order() == others, "no deferred instance is claimed before its time"
    marked_ago([polled], 2)  # their time came
    marked_ago([failed], 1)
    assert claim_order() == [polled, failed]


def test_a_new_mark_makes_a_deferred_instance_runnable_now():
    """A deferred mark waits for its time only while nothing new happened: a message, a
    decision or a fired timer is work to run now."""
    deferred = backlog(1)[0]
    instance_mark_runnable_after(deferred, 3600)
    assert claim_order() == []
    instance_mark_runnable(deferred)
    assert claim_order() == [deferred]


def test_an_instance_waiting_on_a_timer_has_no_place_until_it_fires():
    instance = start(linear(node("t", "timer", duration="PT1H"), key="tests.order"))
    [claim] = instances_claim(holder="pusher", limit=1, ttl=30)
    instance_run(instance_id=instance.pk, worker="worker-1", claim=claim)
    assert Instance.objects.get(pk=instance.pk).runnable_at is None
    instance_mark_runnable(instance.pk)
    assert claim_order() == [instance.pk]
