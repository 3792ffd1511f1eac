"""The sweep: due timers fire in batches and mark their instances, dead holders' leases
expire at once, one sweeper loop (ADR 0005, 0026)."""

from __future__ import annotations

import datetime as dt
import itertools
import threading
import time

import pytest
from django.db import connection
from django.db.models.functions import Now
from django.test.utils import CaptureQueriesContext
from django_q.models import OrmQ
from django_q.tasks import async_task

from govflow.engine.models import Instance, InstanceStatus, Timer, Token, TokenState
from govflow.engine.queue import SWEEP, instances_claim
from govflow.engine.services import sweep
from govflow.engine.services.run import instance_lease_key
from govflow.engine.services.sweep import (
    SWEEPER,
    Sweeper,
    instances_requeue,
    sweep_loop,
)
from govflow.engine.services.timers import timers_fire
from recovery import api
from recovery.models import Lease
from tests.dbclock import wait_until_expired
from tests.engine_helpers import node, take_over, token_of
from tests.flows import action, drive, linear, start

pytestmark = pytest.mark.django_db


def sweeper_fence(holder: str = "sweeper-1", ttl: float = 30) -> api.Fence:
    return api.lease_acquire(key=SWEEPER, holder=holder, ttl=ttl)


def waiting_on_timers(count: int) -> list[int]:
    """``count`` instances, each with one waiting token and its scheduled timer, due now.

    One instance runs for real up to its timer; the others are row copies of it, so that
    hundreds of timers cost a few INSERTs.
    """
    template = drive(start(linear(node("t", "timer", duration="PT1H"), key="tests.sweep")))
    token = token_of(template, "t")
    timer = Timer.objects.get(instance=template)
    copies = Instance.objects.bulk_create(
        [_copy(template, id=None) for _ in range(count - 1)], batch_size=300
    )
    tokens = Token.objects.bulk_create(
        [_copy(token, id=None, instance_id=i.pk) for i in copies], batch_size=300
    )
    Timer.objects.bulk_create(
        [_copy(timer, id=None, instance_id=t.instance_id, token_id=t.pk) for t in tokens],
        batch_size=300,
    )
    Timer.objects.update(due_at=Now())
    Instance.objects.update(runnable_at=None, wakeups=0)
    return [template.pk, *(i.pk for i in copies)]


def _copy(obj, **changes):
    fields = {f.attname: getattr(obj, f.attname) for f in type(obj)._meta.concrete_fields}
    return type(obj)(**{**fields, **changes})


def queued_instances() -> list[int]:
    """The instances marked runnable: what a worker's next claim takes (ADR 0026)."""
    marked = Instance.objects.filter(runnable_at__isnull=False).order_by("pk")
    return list(marked.values_list("pk", flat=True))


def test_due_timers_fire_in_one_batch_with_a_fixed_number_of_statements():
    statements = {}
    for count in (3, 300):
        Instance.objects.all().delete()
        ids = waiting_on_timers(count)
        fence = sweeper_fence()
        with CaptureQueriesContext(connection) as ctx:
            assert timers_fire(fence=fence) == count
        statements[count] = [q["sql"][:60] for q in ctx.captured_queries]
        api.lease_release(fence=fence)

        assert set(Timer.objects.values_list("state", "fire_fence")) == {("fired", fence.fence)}
        assert not Timer.objects.filter(fired_at__isnull=True).exists()
        assert set(Token.objects.filter(node_id="t").values_list("state", flat=True)) == {
            TokenState.READY
        }
        assert sorted(queued_instances()) == sorted(ids), "every instance marked runnable"
        assert set(Instance.objects.filter(pk__in=ids).values_list("wakeups", flat=True)) == {1}
    # One commit (the facts and the marks): on PostgreSQL 1 statement, on SQLite 4, plus
    # a savepoint pair inside this test's transaction.
    assert len(statements[3]) == len(statements[300]) <= 6, statements


def test_a_full_batch_leaves_the_rest_for_the_next_one():
    ids = waiting_on_timers(12)
    fence = sweeper_fence()
    assert [timers_fire(fence=fence, limit=5) for _ in range(4)] == [5, 5, 2, 0]
    assert sorted(queued_instances()) == sorted(ids)


def test_a_timer_whose_token_stopped_waiting_fires_without_waking_it():
    ids = waiting_on_timers(2)
    Token.objects.filter(instance_id=ids[0], node_id="t").update(state=TokenState.CANCELLED)
    before = Token.objects.get(instance_id=ids[0], node_id="t").updated_at
    assert timers_fire(fence=sweeper_fence()) == 2
    cancelled = Token.objects.get(instance_id=ids[0], node_id="t")
    assert (cancelled.state, cancelled.updated_at) == (TokenState.CANCELLED, before)
    assert Token.objects.get(instance_id=ids[1], node_id="t").state == TokenState.READY


def test_timers_not_due_yet_stay_scheduled():
    waiting_on_timers(3)
    Timer.objects.update(due_at=Now() + dt.timedelta(hours=1))
    assert timers_fire(fence=sweeper_fence()) == 0
    assert set(Timer.objects.values_list("state", flat=True)) == {"scheduled"}
    assert queued_instances() == []


def test_a_stale_sweeper_fence_fires_nothing_and_queues_nothing():
    waiting_on_timers(4)
    old = sweeper_fence(ttl=0.3)
    new = take_over(SWEEPER, holder="sweeper-2")
    with pytest.raises(api.StaleFence):
        timers_fire(fence=old)
    assert set(Timer.objects.values_list("state", "fire_fence")) == {("scheduled", 0)}
    assert set(Token.objects.filter(node_id="t").values_list("state", flat=True)) == {
        TokenState.WAITING
    }
    assert queued_instances() == [], "nothing marked by a stale sweeper"
    assert timers_fire(fence=new) == 4
    Timer.objects.update(state="scheduled")
    api.lease_release(fence=new)
    with pytest.raises(api.StaleFence):
        timers_fire(fence=new)  # released: just as stale
    assert set(Timer.objects.values_list("fire_fence", flat=True)) == {new.fence}


@pytest.mark.django_db(transaction=True)
def test_a_pass_with_nothing_due_writes_nothing_and_locks_no_lease_row():
    """An idle cluster's sweeper passes (four a second) cost no WAL flush (ADR 0042)."""
    if connection.vendor != "postgresql":
        pytest.skip("transaction ids and row locks are PostgreSQL's; SQLite's path is unchanged")
    fence, xids = sweeper_fence(), []

    def xid_after_firing(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if "fired AS" in sql:  # the firing statement, still inside its transaction
            with context["connection"].connection.cursor() as raw:
                raw.execute("SELECT pg_current_xact_id_if_assigned()::text")
                xids.append(raw.fetchone()[0])
        return result

    with connection.execute_wrapper(xid_after_firing):
        assert timers_fire(fence=fence) == 0
    waiting_on_timers(2)
    with connection.execute_wrapper(xid_after_firing):
        assert timers_fire(fence=fence) == 2
    assert xids[0] is None, "nothing due: no row written or locked, no transaction id"
    assert xids[1] is not None, "timers fired: the writes (and the lease's share lock)"
    assert set(Timer.objects.values_list("fire_fence", flat=True)) == {fence.fence}


def test_a_stale_sweeper_with_nothing_due_learns_it_lost_its_lease():
    old = sweeper_fence(ttl=0.3)
    take_over(SWEEPER, holder="sweeper-2")
    with pytest.raises(api.StaleFence):
        timers_fire(fence=old)


def dead_worker() -> Instance:
    """An instance claimed a moment ago whose worker took its lease and then died."""
    instance = start(linear(action("a")))
    [claim] = instances_claim(holder="worker-killed", limit=5, ttl=0.3)
    assert claim.instance_id == instance.pk
    Token.objects.filter(instance=instance, node_id="a").update(state=TokenState.EXECUTING)
    return instance


def test_an_orphan_is_claimed_again_as_soon_as_its_lease_expires_without_a_sweep():
    instance = dead_worker()
    fence = sweeper_fence()
    assert instances_claim(holder="worker-2", limit=5, ttl=30) == [], "its lease is live"
    assert instances_requeue(fence=fence) == 0, "still marked: nothing for the sweep to do"
    wait_until_expired(instance_lease_key(instance.pk))
    [claim] = instances_claim(holder="worker-2", limit=5, ttl=30)
    assert claim.instance_id == instance.pk
    # The claimed run rehydrates the step the dead worker left executing.
    api.lease_release(fence=api.Fence(instance_lease_key(instance.pk), "worker-2", claim.fence))
    assert drive(instance).status == InstanceStatus.COMPLETED


def test_runnable_work_without_a_mark_is_marked_by_the_sweep_once():
    instance = start(linear(action("a")))
    Instance.objects.update(runnable_at=None)  # a backoff ran out: nobody marked it
    fence = sweeper_fence()
    assert instances_requeue(fence=fence) == 1
    assert queued_instances() == [instance.pk]
    assert instances_requeue(fence=fence) == 0, "marked already: once is enough"
    assert queued_instances() == [instance.pk]


def stop_after_passes(monkeypatch, stop, passes: int = 1) -> list[api.Fence]:
    """Set ``stop`` once the sweeper has renewed its lease ``passes`` times (here at the
    end of every pass: it renews after none of its lease has passed)."""
    renewed = []
    real = sweep.lease_renew
    monkeypatch.setattr(sweep, "RENEW_AFTER", 0)

    def renew(*, fence, ttl):
        real(fence=fence, ttl=ttl)
        renewed.append(fence)
        if len(renewed) >= passes:
            stop.set()
        return fence

    monkeypatch.setattr(sweep, "lease_renew", renew)
    return renewed


def test_the_sweeper_sweeps_until_stopped_and_releases_its_lease(monkeypatch):
    ids = waiting_on_timers(3)
    stop = threading.Event()
    renewed = stop_after_passes(monkeypatch, stop, passes=2)
    sweeper = Sweeper(stop=stop, holder="cluster-main")
    stats = sweeper.run(standby=True)
    assert sweeper.ended == "stopped"
    assert stats["timers"] == 3 and stats["passes"] == 2
    assert sorted(queued_instances()) == sorted(ids)
    lease = Lease.objects.get(key=SWEEPER)
    assert lease.holder is None, "released: a standby takes over without waiting"
    assert lease.fence == renewed[0].fence


def test_the_sweeper_fires_a_burst_batch_after_batch_without_pausing(monkeypatch, settings):
    settings.GOVFLOW_SWEEP_TIMER_BATCH = 5
    settings.GOVFLOW_SWEEP_TICK = 5  # a pause after a full batch would show
    ids = waiting_on_timers(12)
    stop = threading.Event()
    stop_after_passes(monkeypatch, stop, passes=1)
    began = time.monotonic()
    stats = Sweeper(stop=stop).run(standby=True)
    # One pass fires the whole burst (5, 5, 2: a commit each), then queues it.
    assert stats["timers"] == 12 and stats["passes"] == 1
    assert time.monotonic() - began < 4
    assert sorted(queued_instances()) == sorted(ids)


def test_a_standby_sweeper_takes_over_when_the_live_one_stops_renewing(monkeypatch):
    waiting_on_timers(2)
    dead = sweeper_fence(holder="killed-cluster", ttl=1)
    stop = threading.Event()
    renewed = stop_after_passes(monkeypatch, stop)
    began = time.monotonic()
    stats = Sweeper(stop=stop, holder="standby-cluster").run(standby=True)
    waited = time.monotonic() - began
    assert stats["timers"] == 2
    assert renewed[0].fence == dead.fence + 1
    assert 0.5 < waited < 3, f"took over {waited:.2f} s after the start of a 1 s lease"


def test_a_stopped_standby_leaves_without_the_lease():
    live = sweeper_fence(holder="other-cluster")
    stop = threading.Event()
    stop.set()
    sweeper = Sweeper(stop=stop)
    assert sweeper.run(standby=True)["passes"] == 0 and sweeper.ended == "stopped"
    assert Lease.objects.get(key=SWEEPER).fence == live.fence


def test_the_sweep_task_leaves_at_once_while_a_live_sweeper_renews():
    live = sweeper_fence(holder="cluster-main", ttl=10)
    began = time.monotonic()
    assert sweep_loop(duration=5) == {"skipped": "another sweeper is alive"}
    assert time.monotonic() - began < 1
    assert Lease.objects.get(key=SWEEPER).holder == live.holder
    assert not OrmQ.objects.exists(), "no successor enqueued"


def test_the_sweep_task_sweeps_then_hands_over_to_its_successor():
    ids = waiting_on_timers(2)
    stats = sweep_loop(duration=0)
    assert stats["timers"] == 2
    assert sorted(queued_instances()) == sorted(ids)
    tasks = [row.task["func"] for row in OrmQ.objects.order_by("pk")]
    assert tasks == [SWEEP], "runs are claimed, not queued: only the successor is a task"
    assert Lease.objects.get(key=SWEEPER).holder is None


def a_dead_process_holder() -> str:
    """A lease holder name of a process of this host that has exited."""
    import subprocess
    import sys

    from govflow.engine.liveness import host_id

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return f"{host_id()}:{child.pid}:1"


def test_a_dead_workers_lease_is_expired_and_its_instance_claimable_at_once():
    instance = start(linear(action("a")))
    dead = api.lease_acquire(
        key=instance_lease_key(instance.pk), holder=a_dead_process_holder(), ttl=3600
    )
    Instance.objects.update(runnable_at=None)
    # A task the dead cluster had claimed: locked for django-q2's retry period.
    async_task("math.floor", 1.5)
    OrmQ.objects.update(lock=Now() + dt.timedelta(seconds=180))
    fence = sweeper_fence()
    assert sweep.dead_holders_expire(fence=fence) == 1
    lease = Lease.objects.get(key=dead.key)
    assert (lease.holder, lease.fence) == (dead.holder, dead.fence), "expired, not taken"
    from django.utils import timezone

    assert not OrmQ.objects.filter(lock__gt=timezone.now()).exists(), "handed out again"
    assert queued_instances() == [instance.pk], "marked in the commit that expired it"
    assert [c.instance_id for c in instances_claim(holder="w", limit=5, ttl=30)] == [instance.pk]


def test_a_dead_clusters_leases_are_expired_in_one_commit(monkeypatch):
    """A restart after a killed cluster finds all its leases at once: expired together,
    so the last stranded instance does not wait for a commit per other one (ADR 0043)."""
    instances = [start(linear(action("a"))) for _ in range(3)]
    for instance in instances:
        api.lease_acquire(
            key=instance_lease_key(instance.pk), holder=a_dead_process_holder(), ttl=3600
        )
    Instance.objects.update(runnable_at=None)
    fence = sweeper_fence()
    commits, real = [], sweep.engine_commit

    def counted():
        commits.append(1)
        return real()

    monkeypatch.setattr(sweep, "engine_commit", counted)
    assert sweep.dead_holders_expire(fence=fence) == 3
    assert len(commits) == 1, "one commit for all three"
    assert sorted(queued_instances()) == sorted(i.pk for i in instances)


def test_live_holders_and_other_hosts_are_left_to_their_lease(settings):
    from govflow.engine.liveness import holder_is_dead, host_id, worker_name

    instance = start(linear(action("a")))
    api.lease_acquire(key=instance_lease_key(instance.pk), holder=worker_name(), ttl=3600)
    other = start(linear(action("a")))
    elsewhere = a_dead_process_holder().replace(host_id(), "another-host/1", 1)
    api.lease_acquire(key=instance_lease_key(other.pk), holder=elsewhere, ttl=3600)
    assert not holder_is_dead(worker_name()) and not holder_is_dead(elsewhere)
    assert not holder_is_dead("worker-1") and not holder_is_dead(f"{host_id()}:x:1")
    assert sweep.dead_holders_expire(fence=sweeper_fence()) == 0
    assert Lease.objects.filter(expires_at__gt=Now(), key__startswith="instance:").count() == 2


def test_a_standby_takes_over_at_once_from_a_sweeper_whose_process_is_gone(monkeypatch):
    from django.utils import timezone

    start(linear(action("a")))
    # A task the dead sweeper's cluster had claimed: locked for django-q2's retry period.
    async_task("math.floor", 1.5)
    OrmQ.objects.update(lock=Now() + dt.timedelta(seconds=180))
    dead = sweeper_fence(holder=a_dead_process_holder(), ttl=3600)
    stop = threading.Event()
    renewed = stop_after_passes(monkeypatch, stop)
    began = time.monotonic()
    Sweeper(stop=stop, holder="standby-cluster").run(standby=True)
    assert renewed[0].fence == dead.fence + 1
    assert time.monotonic() - began < 2, "did not wait out the dead sweeper's hour-long lease"
    assert not OrmQ.objects.filter(lock__gt=timezone.now()).exists(), "handed out again"


def test_a_stale_sweeper_expires_nobodys_lease(settings):
    instance = start(linear(action("a")))
    dead = api.lease_acquire(
        key=instance_lease_key(instance.pk), holder=a_dead_process_holder(), ttl=3600
    )
    old = sweeper_fence(ttl=0.3)
    take_over(SWEEPER, holder="sweeper-2")
    with pytest.raises(api.StaleFence):
        sweep.dead_holders_expire(fence=old)
    assert Lease.objects.filter(key=dead.key, expires_at__gt=Now()).exists()


def test_the_sweeper_renews_its_lease_once_a_quarter_of_it_has_passed(monkeypatch, settings):
    """Not at every pass (ADR 0042): a renewal is a writing commit, four a second."""
    settings.GOVFLOW_SWEEP_LEASE_TTL = 2
    settings.GOVFLOW_SWEEP_TICK = 0.05
    renewed = []
    real = sweep.lease_renew
    monkeypatch.setattr(
        sweep, "lease_renew", lambda **kw: renewed.append(time.monotonic()) or real(**kw)
    )
    sweeper = Sweeper(holder="cluster-main")
    began = time.monotonic()
    stats = sweeper.run(duration=1.6)
    elapsed = time.monotonic() - began
    # The rule, whatever the machine's speed: renewed (at least once in 1.6 s of a 2 s
    # lease), never twice within a quarter of the lease, so not at every pass.
    assert renewed, stats
    assert all(b - a >= 0.5 for a, b in itertools.pairwise(renewed)), renewed
    assert len(renewed) <= elapsed / 0.5 + 1, (len(renewed), elapsed)
    assert len(renewed) < stats["passes"], (len(renewed), stats["passes"])
    assert Lease.objects.get(key=SWEEPER).holder is None, "released at the end"
