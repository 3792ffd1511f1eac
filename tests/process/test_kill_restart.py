"""kill -9 a real ``qcluster`` at the worst moments, restart it, and check invariant I10.

Each test SIGKILLs a whole cluster process group and starts a new one against the same
PostgreSQL database. Nothing in the workers' memory may matter: executing tokens that
never dispatched run again, dispatched ones become ``outcome_unknown`` and wait for an
operator, timers that fell due while everything was down fire once, and finished
instances stay exactly as they were.

The first cluster of a test that parks a worker mid-step runs with ``PARKED`` settings
(none are needed since runs are claimed where they are recorded, ADR 0026: nothing is
re-enqueued on a timer any more, and an instance is claimed again only once its lease
has expired or its holder is known to be dead).
"""

from __future__ import annotations

import time

import pytest
from django.contrib.auth.models import Permission
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db.models import Q
from django.db.models.functions import Now

from govflow.engine.errors import EngineConflict
from govflow.engine.models import Instance, InstanceStatus, Timer, Token, TokenState
from govflow.engine.queue import instances_mark_runnable
from govflow.engine.services.definitions import definition_publish
from govflow.engine.services.instances import instance_start, step_retry
from govflow.handoffs.services.desk import handoff_approve, handoff_request
from recovery.api import DecisionKind, OperationState, lease_acquire, lease_release
from tests.flows import action, linear
from tests.providers.alpha import effects

from .support import (
    FAST,
    SWEEPER_LEASE,
    assert_completed_cleanly,
    db_seconds,
    dump,
    failed_tasks,
    operations_of,
    queue_mark,
    snapshot,
    status,
    store_calls,
    store_rows,
    token,
    wait_for,
    wait_queue_drained,
    wait_status,
    wait_until_sweeping,
)

pytestmark = pytest.mark.django_db(transaction=True)

LEASE_TTL = float(FAST["GOVFLOW_LEASE_TTL"])
PARKED: dict[str, str] = {}


def user(django_user_model, username: str, *perms: str):
    account = django_user_model.objects.create_user(username=username, password="x", is_staff=True)
    query = Q()
    for perm in perms:
        app_label, codename = perm.split(".")
        query |= Q(content_type__app_label=app_label, codename=codename)
    account.user_permissions.set(Permission.objects.filter(query))
    return django_user_model.objects.get(pk=account.pk)


def retrying_conflicts(fn, *, timeout: float = 20):
    """Operators' changes take the instance lease; if a worker holds it, try again."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except EngineConflict:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def uncertain(instance_id: int, *, calls: int) -> bool:
    """Step a is outcome_unknown; fails at once if the provider was called again."""
    assert effects.call_count() == calls, "the provider was called again after the restart"
    return token(instance_id, "a").state == TokenState.OUTCOME_UNKNOWN


def test_kill_before_the_dispatch_boundary_resumes_with_the_effect_done_once(workspace):
    ws = workspace
    ws.pause("preview")
    first = ws.start_cluster(**PARKED)
    definition = definition_publish(document=linear(action("a"), action("b"), key="proc.before"))
    instance = instance_start(definition=definition, variables={"value": "v1"})
    ws.watch(instance.pk)

    wait_for(
        lambda: ws.reached("preview"),
        timeout=60,
        what="a worker parked in step a's preview",
        explain=ws.report,
    )
    first.kill()
    ws.unpause("preview")

    # Killed before the boundary commit: no operation, no effect, nothing executing. The
    # preview ran inside the commit that completes the start node and would have carried
    # a's dispatch: that commit never happened, so step a is ready or not created yet.
    assert not operations_of(instance.pk).exists(), dump(instance.pk)
    states = dict(Token.objects.filter(instance_id=instance.pk).values_list("node_id", "state"))
    assert states.get("a", TokenState.READY) == TokenState.READY, dump(instance.pk)
    assert TokenState.EXECUTING not in states.values(), dump(instance.pk)
    assert effects.call_count() == 0

    second = ws.start_cluster()
    wait_until_sweeping(second)
    wait_status(ws, instance.pk, InstanceStatus.COMPLETED)

    assert_completed_cleanly(instance.pk)
    assert sorted(a for _, a, _ in effects.effects()) == ["alpha.write", "alpha.write"]
    assert all(calls == 1 for _, _, calls in effects.effects()), effects.effects()
    assert effects.call_count() == 2  # one provider call per step, nothing replayed
    ops = list(operations_of(instance.pk).values_list("step_id", "state"))
    assert ops == [("a", OperationState.SUCCEEDED), ("b", OperationState.SUCCEEDED)], ops
    assert failed_tasks() == []


def test_kill_after_a_non_atomic_dispatch_needs_an_operator_decision(workspace, django_user_model):
    ws = workspace
    ws.pause("after_effect")
    # Three workers: one sweeps, two park after the effect of their instance's step.
    first = ws.start_cluster(GOVFLOW_Q_WORKERS="3", **PARKED)
    definition = definition_publish(document=linear(action("a"), key="proc.after"))
    confirmed = instance_start(definition=definition, variables={"value": "c"})
    absent = instance_start(definition=definition, variables={"value": "x"})
    ws.watch(confirmed.pk, absent.pk)

    # Both effects are in the store: both workers are past the effect and parked before
    # their result can be recorded.
    wait_for(
        lambda: len(effects.effects()) == 2 and ws.reached("after_effect"),
        timeout=60,
        what="both workers parked after their effect",
        explain=ws.report,
    )
    first.kill()
    ws.unpause("after_effect")
    for pk in (confirmed.pk, absent.pk):
        assert token(pk, "a").state == TokenState.EXECUTING, dump(pk)
        assert operations_of(pk).get().state == OperationState.DISPATCHED, dump(pk)
    assert effects.call_count() == 2

    second = ws.start_cluster()
    wait_until_sweeping(second)
    for pk in (confirmed.pk, absent.pk):
        wait_for(
            lambda pk=pk: uncertain(pk, calls=2),
            timeout=60,
            what=f"step a of instance {pk} to be outcome_unknown",
            explain=ws.report,
        )
        assert status(pk) == InstanceStatus.BLOCKED, dump(pk)
        assert operations_of(pk).get().state == OperationState.OUTCOME_UNKNOWN, dump(pk)

    # The provider is not called again: not by the sweep over several lease periods, not
    # by more deliveries of the instances' tasks.
    mark = queue_mark()
    instances_mark_runnable([confirmed.pk, absent.pk])
    time.sleep(3 * LEASE_TTL)
    wait_queue_drained(ws, since=mark)
    wait_until_sweeping(second)
    assert effects.call_count() == 2
    for pk in (confirmed.pk, absent.pk):
        assert token(pk, "a").state == TokenState.OUTCOME_UNKNOWN, dump(pk)
        assert status(pk) == InstanceStatus.BLOCKED, dump(pk)

    requester = user(
        django_user_model, "requester", "recovery.request_decision", "engine.operate_instance"
    )
    approver = user(
        django_user_model, "approver", "recovery.approve_decision", "engine.operate_instance"
    )

    # (a) Effect confirmed with evidence, approved by a second person: completes without
    # calling the provider again.
    step = token(confirmed.pk, "a")
    decision = handoff_request(
        instance_id=confirmed.pk,
        token_id=step.pk,
        kind=DecisionKind.EFFECT_CONFIRMED,
        rationale="The registry extract shows the write under this idempotency key.",
        actor=requester,
        checks={"store": "found"},
        evidence=[SimpleUploadedFile("registry.txt", b"found", content_type="text/plain")],
    )
    retrying_conflicts(
        lambda: handoff_approve(
            decision_id=decision.pk, actor=approver, result_fp=decision.result_fp
        )
    )
    wait_status(ws, confirmed.pk, InstanceStatus.COMPLETED)
    assert_completed_cleanly(confirmed.pk)
    assert list(operations_of(confirmed.pk).values_list("state", flat=True)) == [
        OperationState.EFFECT_CONFIRMED
    ], dump(confirmed.pk)
    assert store_calls(step.idempotency_key) == 1
    assert effects.call_count() == 2

    # (b) Effect absent, approved, then a deliberate retry: a new ledger operation with the
    # same idempotency fingerprint, and the provider sees the same idempotency key. (The
    # alpha store did record the first call: the engine acts on the operator's decision,
    # and the stable idempotency key is what makes a mistaken "absent" harmless, I4.)
    step = token(absent.pk, "a")
    decision = handoff_request(
        instance_id=absent.pk,
        token_id=step.pk,
        kind=DecisionKind.EFFECT_ABSENT,
        rationale="The registry extract shows no write under this idempotency key.",
        actor=requester,
        checks={"store": "not found"},
        evidence=[SimpleUploadedFile("registry.txt", b"not found", content_type="text/plain")],
    )
    retrying_conflicts(
        lambda: handoff_approve(
            decision_id=decision.pk, actor=approver, result_fp=decision.result_fp
        )
    )
    step.refresh_from_db()
    assert step.state == TokenState.FAILED, dump(absent.pk)
    assert status(absent.pk) == InstanceStatus.BLOCKED, dump(absent.pk)
    assert effects.call_count() == 2  # a decision never calls the provider

    retrying_conflicts(lambda: step_retry(instance_id=absent.pk, token_id=step.pk, actor=approver))
    wait_status(ws, absent.pk, InstanceStatus.COMPLETED)
    assert_completed_cleanly(absent.pk)
    ops = list(operations_of(absent.pk).values("key", "state", "idempotency_fp"))
    assert [op["state"] for op in ops] == [
        OperationState.EFFECT_ABSENT,
        OperationState.SUCCEEDED,
    ], dump(absent.pk)
    assert ops[0]["key"] != ops[1]["key"]
    assert ops[0]["idempotency_fp"] == ops[1]["idempotency_fp"]
    retried = token(absent.pk, "a")
    assert retried.idempotency_key == step.idempotency_key
    assert retried.attempt == step.attempt + 1
    # Both provider calls carried the same idempotency key, so the store (which
    # deduplicates by it) still holds one effect for this step.
    assert store_calls(step.idempotency_key) == 2
    assert store_rows("SELECT calls FROM effects WHERE key = ?", step.idempotency_key) == [(2,)]
    assert effects.call_count() == 3
    assert failed_tasks() == []


def test_a_timer_due_while_everything_is_down_fires_once_after_restart(workspace):
    ws = workspace
    # The test holds the sweeper's lease while the first cluster runs, so that cluster
    # cannot fire the timer however slowly the kill comes: the sweep that fires it is the
    # restarted cluster's.
    held = lease_acquire(key=SWEEPER_LEASE, holder="process-test:holding", ttl=600)
    first = ws.start_cluster()
    document = linear(
        {"id": "wait", "type": "timer", "duration": "PT2S"}, action("a"), key="proc.timer"
    )
    instance = instance_start(
        definition=definition_publish(document=document), variables={"value": "t"}
    )
    ws.watch(instance.pk)

    wait_for(
        lambda: Timer.objects.filter(instance_id=instance.pk).exists(),
        timeout=60,
        what="the instance to wait on its timer",
        explain=ws.report,
    )
    first.kill()
    timer = Timer.objects.get(instance_id=instance.pk)
    assert timer.state == "scheduled", dump(instance.pk)
    assert token(instance.pk, "wait").state == TokenState.WAITING, dump(instance.pk)

    # Database clock (I9): wait until the timer is well past due with nobody running.
    wait_for(
        lambda: Timer.objects.filter(pk=timer.pk, due_at__lt=Now() - db_seconds(1)).exists(),
        timeout=30,
        what="the timer to fall due",
    )
    assert Timer.objects.get(pk=timer.pk).state == "scheduled"
    assert effects.call_count() == 0
    lease_release(fence=held)

    second = ws.start_cluster()
    wait_until_sweeping(second)
    wait_status(ws, instance.pk, InstanceStatus.COMPLETED)

    assert_completed_cleanly(instance.pk)
    timers = list(Timer.objects.filter(instance_id=instance.pk).values())
    assert len(timers) == 1, timers
    fired = timers[0]
    assert fired["state"] == "fired" and fired["fire_fence"] > 0, fired
    assert fired["fired_at"] >= fired["due_at"], fired
    assert Token.objects.filter(instance_id=instance.pk, node_id="wait").count() == 1
    assert effects.call_count() == 1 and len(effects.effects()) == 1

    # More sweep cycles and redeliveries change nothing about the fired timer.
    mark = queue_mark()
    instances_mark_runnable([instance.pk])
    wait_queue_drained(ws, since=mark)
    time.sleep(1)
    assert list(Timer.objects.filter(instance_id=instance.pk).values()) == timers
    assert effects.call_count() == 1
    assert failed_tasks() == []


def test_instances_completed_before_the_kill_stay_completed(workspace):
    ws = workspace
    first = ws.start_cluster()
    definition = definition_publish(document=linear(action("a"), action("b"), key="proc.done"))
    ids = [instance_start(definition=definition, variables={"value": f"d{n}"}).pk for n in range(5)]
    ws.watch(*ids)
    wait_for(
        lambda: (
            Instance.objects.filter(pk__in=ids, status=InstanceStatus.COMPLETED).count() == len(ids)
        ),
        timeout=90,
        what="all instances to complete",
        explain=ws.report,
    )
    before = snapshot(ids)
    calls = effects.call_count()
    store = sorted(effects.effects())
    assert calls == 2 * len(ids)

    first.kill()
    second = ws.start_cluster()
    wait_until_sweeping(second)
    # Redeliver every instance's task too, as a broker may.
    mark = queue_mark()
    instances_mark_runnable(ids)
    wait_queue_drained(ws, since=mark)
    time.sleep(4 * float(FAST["GOVFLOW_SWEEP_FULL_EVERY"]) + 1)  # several sweep passes
    wait_until_sweeping(second)

    after = snapshot(ids)
    for part in before:
        assert after[part] == before[part], f"{part} changed after the restart"
    assert effects.call_count() == calls
    assert sorted(effects.effects()) == store
    for pk in ids:
        assert_completed_cleanly(pk)
    assert failed_tasks() == []


def test_a_restarted_cluster_takes_over_from_dead_processes_without_waiting_out_leases(
    workspace,
):
    """Leases of a dead process of this host are expired at once, not waited out.

    Instance leases and the sweeper lease last ten minutes here; the first cluster is
    killed with its only worker's two runs (ADR 0041) parked after their effects and
    another instance's task claimed but not started. The restarted cluster's sweeper sees
    that the holders' processes no longer exist, takes the sweeper lease over, expires
    the dead worker's instance leases (the steps become outcome_unknown, the provider is
    not called again) and hands the claimed task out again: every instance moves on
    within seconds.
    """
    ws = workspace
    long = {"GOVFLOW_LEASE_TTL": "600", "GOVFLOW_SWEEP_LEASE_TTL": "600"}
    ws.pause("after_effect")
    first = ws.start_cluster(GOVFLOW_Q_WORKERS="1", GOVFLOW_WORKER_RUNS="2", **PARKED, **long)
    wait_until_sweeping(first)
    definition = definition_publish(document=linear(action("a"), key="proc.dead"))
    both = [instance_start(definition=definition, variables={"value": f"p{n}"}) for n in (1, 2)]
    ws.watch(*(instance.pk for instance in both))
    wait_for(
        lambda: ws.reached("after_effect") and effects.call_count() == 2,
        timeout=60,
        what="both runs of the only worker parked after their effects",
        explain=ws.report,
    )
    # The only worker's runs are all busy: this one's task is claimed by the pusher or
    # waits.
    waiting = instance_start(
        definition=definition_publish(document=linear(action("b"), key="proc.waiting")),
        variables={"value": "w"},
    )
    ws.watch(waiting.pk)
    time.sleep(1)
    first.kill()
    ws.unpause("after_effect")

    restarted = time.monotonic()
    second = ws.start_cluster(**PARKED, **long)
    wait_for(
        lambda: all(token(p.pk, "a").state == TokenState.OUTCOME_UNKNOWN for p in both),
        timeout=60,
        what="step a of the dead worker's instances to be outcome_unknown",
        explain=ws.report,
    )
    wait_status(ws, waiting.pk, InstanceStatus.COMPLETED)
    took = time.monotonic() - restarted
    print(f"\n[taken over from the dead cluster {took:.1f} s after the restart]")
    assert took < 60, f"took {took:.1f} s: the ten-minute leases were waited out"
    for parked in both:
        assert status(parked.pk) == InstanceStatus.BLOCKED, dump(parked.pk)
    # Step a's provider was called once per instance (before the kill), step b's once:
    # nothing again.
    assert effects.call_count() == 3
    second.kill()
