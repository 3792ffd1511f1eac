"""PostgreSQL: one worker process runs several claimed instances at once (ADR 0041).

The run threads of ``runpool.RunPool`` are what a ``qcluster`` worker uses when
``GOVFLOW_WORKER_RUNS`` > 1. Here they run in the test process, each on its own connection
to the test database, with claims taken as the broker takes them.
"""

from __future__ import annotations

import dataclasses
import threading

import pytest
from django.db import connection
from django_q.models import Task

from govflow.engine import runpool
from govflow.engine.models import InstanceStatus
from govflow.engine.queue import ADVANCE, instances_claim
from govflow.engine.registry import registry
from govflow.engine.runpool import RunPool
from recovery.models import Lease
from recovery.shared_commits import shared_commits, shared_commits_disable
from tests import waiting
from tests.engine_helpers import chain_ok
from tests.flows import action, linear, start
from tests.providers.alpha import actions as alpha

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.postgres,
    pytest.mark.usefixtures("on_postgres"),
]

RUNS = 3


def wait_for(predicate, *, timeout: float, what: str):
    return waiting.wait_for(predicate, timeout=timeout, what=what, explain=_sessions)


def _sessions() -> str:
    """What every other session of the test database is doing: where a run is stuck."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT state, coalesce(wait_event_type || ':' || wait_event, ''), "
            "left(query, 120) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()"
        )
        rows = cursor.fetchall()
    return f"the database's sessions then (state, wait event, query): {rows}"


@pytest.fixture
def pool():
    made: list[RunPool] = []

    def make(size: int = RUNS, timeout: float | None = None) -> RunPool:
        made.append(RunPool(size, timeout=timeout))
        return made[-1]

    yield make
    for each in made:
        each.close()
    shared_commits_disable()  # a pool turns shared commits on for its process


def meeting(parties: int):
    """``alpha.write`` whose effect waits until ``parties`` calls are in it at once, and
    notes which thread and which database session each call ran on."""
    met = threading.Barrier(parties, timeout=20)
    seen: list[tuple[int, int, str]] = []

    def execute(context):
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            session = cursor.fetchone()[0]
        holder = Lease.objects.get(key=f"instance:{context.instance_id}").holder
        seen.append((threading.get_ident(), session, holder))
        met.wait()  # a BrokenBarrierError if fewer than ``parties`` runs are at once
        return alpha._effect(context)

    return dataclasses.replace(alpha.write, name="tests.meet", execute=execute), seen


def test_the_claimed_runs_of_one_process_run_at_once_each_on_its_own_lease_and_connection(pool):
    meet, seen = meeting(RUNS)
    with registry.override(meet):
        instances = [
            start(linear(action("a", name="tests.meet")), {"value": f"v{n}"})
            for n in range(2 * RUNS)
        ]
        claims = instances_claim(holder="pusher", limit=2 * RUNS, ttl=30)
        assert len(claims) == 2 * RUNS
        runs = pool()
        for claim in claims:
            runs.submit(claim)
        ids = [instance.pk for instance in instances]
        wait_for(lambda: _all_completed(ids), timeout=60, what="every instance completed")
    # Two meetings of three: the runs were at once, not one after the other.
    assert len(seen) == 2 * RUNS
    threads = {thread for thread, _, _ in seen}
    sessions = {session for _, session, _ in seen}
    assert len(threads) == RUNS, "each run thread ran two of the instances"
    assert len(sessions) == RUNS, "each run thread kept its connection across its runs"
    # Each lease was taken over from the pusher by the thread that ran it (ADR 0026).
    for thread, _, holder in seen:
        assert holder.split(":")[-1] == str(thread), (holder, thread)
    for instance in instances:
        assert chain_ok(instance)


def test_the_chained_steps_of_runs_at_once_commit_together(pool):
    """ADR 0062: the runs' chained steps (step k's outcome with step k+1's dispatch) go
    in shared commits, each on its own fence, and every chain stays whole."""
    meet, _ = meeting(RUNS)
    with registry.override(meet):
        instances = [
            start(
                linear(action("a", name="tests.meet"), action("b"), action("c")),
                {"value": f"v{n}"},
            )
            for n in range(RUNS)
        ]
        claims = instances_claim(holder="pusher", limit=RUNS, ttl=30)
        runs = pool()
        shared = shared_commits()
        shared.company, shared.wait = (lambda: RUNS), 60.0  # wait for all three, always
        for claim in claims:
            runs.submit(claim)
        ids = [instance.pk for instance in instances]
        wait_for(lambda: _all_completed(ids), timeout=90, what="every instance completed")
    # a's outcome with b's dispatch, then b's with c's, then c's with the instance's end
    # (one statement each, ADR 0076): three commits of three statements each, one server
    # transaction each (the checkpoints they wrote share their xmin).
    assert (shared.commits, shared.statements) == (3, 3 * RUNS)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT xmin::text, count(DISTINCT subject_id) FROM recovery_checkpoint "
            "WHERE subject_id = ANY(%s) GROUP BY 1 HAVING count(DISTINCT subject_id) > 1",
            [[str(pk) for pk in ids]],
        )
        together = cursor.fetchall()
    assert len(together) == 3 and {runs for _, runs in together} == {RUNS}, together
    for instance in instances:
        assert chain_ok(instance)
        assert set(instance.tokens.values_list("state", flat=True)) == {"completed"}


def test_a_claim_waits_for_a_free_run_thread(pool):
    release = threading.Event()
    inside = threading.Semaphore(0)

    def execute(context):
        inside.release()
        release.wait(timeout=30)
        return alpha._effect(context)

    slow = dataclasses.replace(alpha.write, name="tests.slow", execute=execute)
    with registry.override(slow):
        ids = [start(linear(action("a", name="tests.slow")), {"value": f"s{n}"}).pk for n in (1, 2)]
        first, second = instances_claim(holder="pusher", limit=2, ttl=30)
        runs = pool(size=1)
        runs.submit(first)
        assert inside.acquire(timeout=30), "the first run reached its provider"
        handed = threading.Event()
        threading.Thread(target=lambda: (runs.submit(second), handed.set()), daemon=True).start()
        assert not handed.wait(0.5), "the second claim waits while the only thread is busy"
        release.set()
        assert handed.wait(30), "handed over once the first run ended"
        freed = threading.Event()
        threading.Thread(target=lambda: (runs.wait_free(), freed.set()), daemon=True).start()
        assert inside.acquire(timeout=30), "the second run reached its provider"
        # ``advance`` returns only once a thread is free for the worker's next task.
        wait_for(lambda: _all_completed(ids), timeout=60, what="both instances completed")
        assert freed.wait(30), "a thread is free again once the second run ended"


def test_a_run_that_fails_unexpectedly_is_recorded_and_its_thread_runs_the_next(pool, monkeypatch):
    real = runpool.instance_run
    failing: set[int] = set()

    def run(*, instance_id, claim):
        if instance_id in failing:
            raise RuntimeError("the database answered nonsense")
        return real(instance_id=instance_id, claim=claim)

    monkeypatch.setattr(runpool, "instance_run", run)
    bad = start(linear(action("a")), {"value": "bad"})
    good = start(linear(action("a")), {"value": "good"})
    failing.add(bad.pk)
    claims = sorted(instances_claim(holder="pusher", limit=2, ttl=30), key=lambda c: c.instance_id)
    runs = pool(size=1)
    for claim in claims:
        runs.submit(claim)
    wait_for(lambda: _all_completed([good.pk]), timeout=60, what="the good instance completed")
    failed = wait_for(
        lambda: list(Task.objects.filter(func=ADVANCE, success=False)),
        timeout=10,
        what="the failed run stored as a failed task",
    )
    [task] = failed
    assert task.args == (bad.pk,)
    assert "the database answered nonsense" in task.result


def test_a_run_that_outlives_django_q2s_timeout_ends_its_worker_process(pool, monkeypatch):
    monkeypatch.setattr(runpool, "WATCH_EVERY", 0.05)
    ended: list[int] = []
    monkeypatch.setattr(RunPool, "overdue", lambda self, run: ended.append(run.instance_id))
    release = threading.Event()

    def execute(context):
        release.wait(timeout=30)
        return alpha._effect(context)

    stuck = dataclasses.replace(alpha.write, name="tests.stuck", execute=execute)
    with registry.override(stuck):
        instance = start(linear(action("a", name="tests.stuck")), {"value": "x"})
        [claim] = instances_claim(holder="pusher", limit=1, ttl=30)
        runs = pool(size=2, timeout=0.3)
        runs.submit(claim)
        try:
            wait_for(lambda: ended, timeout=10, what="the watchdog to end the process")
        finally:
            release.set()
    assert ended[0] == instance.pk
    wait_for(lambda: _all_completed([instance.pk]), timeout=60, what="the instance completed")


def test_a_task_of_several_claims_hands_each_to_a_run_thread(pool, monkeypatch):
    """ADR 0069: ``advance`` with further claims hands them to the run threads one by one,
    waiting for a free thread when all are busy (5 claims, 2 threads), and returns once a
    thread is free; every run takes its lease over from the pusher."""
    from govflow.engine import tasks as tasks_module
    from govflow.engine.broker import claim_task

    runs = pool(size=2)
    monkeypatch.setattr(tasks_module, "run_pool", lambda: runs)
    ids = [start(linear(action("a"), action("b")), {"value": f"t{n}"}).pk for n in range(5)]
    claims = instances_claim(holder="pusher", limit=5, ttl=30)
    task = claim_task(*claims)
    handed = tasks_module.advance(*task["args"], **task["kwargs"])
    assert handed["instances"] == [claim.instance_id for claim in claims]
    wait_for(lambda: _all_completed(ids), timeout=60, what="every instance completed")
    # Each run took its lease over from the pusher (ADR 0026): none is left in its name.
    leases = Lease.objects.filter(key__in=[f"instance:{pk}" for pk in ids], holder="pusher")
    assert not leases.exists()


def _all_completed(ids: list[int]) -> bool:
    from govflow.engine.models import Instance

    statuses = set(Instance.objects.filter(pk__in=ids).values_list("status", flat=True))
    return statuses == {InstanceStatus.COMPLETED}


def test_a_run_threads_connection_has_the_clusters_options(pool, settings):
    """``qcluster`` sets its connection options in the shared settings before it forks
    (ADR 0030, 0035); a run thread's own connection has them too, and names itself a
    worker to the server (ADR 0042)."""
    from govflow.engine.cluster import health_checks_off, idle_transactions_ended

    settings.GOVFLOW_LEASE_TTL = 7
    saved = dict(connection.settings_dict)
    seen: dict[str, object] = {}

    def execute(context):
        with connection.cursor() as cursor:
            cursor.execute("SHOW idle_in_transaction_session_timeout")
            seen["idle"] = cursor.fetchone()[0]
            cursor.execute("SHOW application_name")
            seen["name"] = cursor.fetchone()[0]
        seen["health_checks"] = connection.health_check_enabled
        return alpha._effect(context)

    looked = dataclasses.replace(alpha.write, name="tests.look", execute=execute)
    try:
        health_checks_off()
        idle_transactions_ended()
        with registry.override(looked):
            instance = start(linear(action("a", name="tests.look")), {"value": "o"})
            [claim] = instances_claim(holder="pusher", limit=1, ttl=30)
            pool(size=2).submit(claim)
            wait_for(lambda: _all_completed([instance.pk]), timeout=60, what="completed")
    finally:
        connection.settings_dict.clear()
        connection.settings_dict.update(saved)
    assert seen == {"idle": "7s", "health_checks": False, "name": "govflow worker"}
