"""Fences (I2): a holder whose lease lapsed changes nothing; duplicate runs do nothing twice."""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter

import pytest
from django.db import connection

from govflow.engine.errors import EngineConflict
from govflow.engine.models import Instance, InstanceStatus, Timer, TokenState, TriggerDelivery
from govflow.engine.registry import registry
from govflow.engine.services import triggers
from govflow.engine.services.instances import instance_cancel
from govflow.engine.services.run import instance_lease_key
from govflow.engine.services.runtime import instance_run
from govflow.engine.services.sweep import SWEEPER, deliveries_retry
from govflow.engine.services.timers import timers_fire
from govflow.engine.services.triggers import trigger_deliver
from recovery import api
from recovery.models import Operation
from tests.dbclock import wait_until_expired
from tests.engine_helpers import (
    alpha_write,
    chain_ok,
    counted,
    node,
    op_states,
    operations,
    take_over,
    token_of,
    user_with,
)
from tests.flows import action, drive, linear, start
from tests.providers.alpha import actions as alpha
from tests.providers.alpha import effects
from tests.providers.alpha.models import Note


@pytest.fixture
def short_lease(settings):
    """Instance leases that lapse in a second, so a slow step outlives its lease."""
    settings.GOVFLOW_LEASE_TTL = 1.0


def run(instance, worker: str = "worker-1"):
    report = instance_run(instance_id=instance.pk, worker=worker)
    instance.refresh_from_db()
    return report


@pytest.mark.django_db
def test_a_worker_whose_lease_lapsed_during_the_call_cannot_commit_the_result_but_it_is_kept(
    short_lease, settings
):
    thief = {}

    def slow(context):
        # The call outlives the lease; meanwhile another worker takes the instance over.
        thief["fence"] = take_over(instance_lease_key(context.instance_id))
        return alpha.write.execute(context)

    write, calls = counted(alpha_write(execute=slow))
    with registry.override(write):
        instance = start(linear(action("a")))
        report = run(instance)
        assert report.stale, "the old holder must learn that it lost the lease"
        assert op_states(instance) == ["dispatched"], "its observation was not written"
        assert token_of(instance, "a").state == TokenState.EXECUTING
        assert instance.status == InstanceStatus.RUNNING and "a" not in instance.variables
        assert len(effects.effects()) == 1  # the effect itself did happen
        # Its answer is not lost: kept on the operation as a late answer (issue 9), with
        # the values the provider returned, chained, and applied to nothing.
        (late,) = api.observations_of(api.Subject("govflow.instance", str(instance.pk)))
        idem = token_of(instance, "a").idempotency_key
        assert (late.kind, late.source, late.outcome) == ("late", "execute", "succeeded")
        assert late.values == {"stored": "v1", "key": idem} and not late.applied
        # The new holder finishes; it does not apply the late answer by itself.
        api.lease_release(fence=thief["fence"])
        settings.GOVFLOW_LEASE_TTL = 30
        run(instance, worker="worker-3")
    assert token_of(instance, "a").state == TokenState.OUTCOME_UNKNOWN
    assert instance.status == InstanceStatus.BLOCKED
    assert op_states(instance) == ["outcome_unknown"]
    assert len(calls) == 1, "the provider is never called again for an uncertain step"
    assert chain_ok(instance)


@pytest.mark.django_db
def test_a_worker_whose_lease_lapsed_before_dispatch_records_and_calls_nothing(
    short_lease, settings
):
    lapsed = []

    def slow_preview(data):
        # The run's lease, taken in the transaction its dispatch commits (ADR 0042), runs
        # out by the database clock before the dispatch boundary is written.
        if not lapsed:
            lapsed.append(wait_until_expired(instance_lease_key(Instance.objects.get().pk)))
        return alpha.write.preview(data)

    write, calls = counted(alpha_write(preview=slow_preview))
    with registry.override(write):
        instance = start(linear(action("a")))
        # The start node alone first: its commit would otherwise also carry a's dispatch.
        settings.GOVFLOW_MAX_STEPS_PER_RUN = 1
        run(instance)
        settings.GOVFLOW_MAX_STEPS_PER_RUN = 500
        assert run(instance).stale
        assert lapsed and not Operation.objects.exists() and calls == []
        assert token_of(instance, "a").state == TokenState.READY
        settings.GOVFLOW_LEASE_TTL = 30
        instance = drive(instance)
    assert instance.status == InstanceStatus.COMPLETED, instance.reason
    assert token_of(instance, "a").attempt == 0, "nothing happened, so nothing was retried"
    assert len(calls) == 1 and len(effects.effects()) == 1


@pytest.mark.django_db
def test_an_atomic_step_whose_lease_lapsed_rolls_back_its_provider_writes(short_lease):
    def slow_note(context):
        result = alpha.note.execute(context)  # writes a Note in the engine's transaction
        take_over(instance_lease_key(context.instance_id))
        return result

    with registry.override(dataclasses.replace(alpha.note, execute=slow_note)):
        instance = start(linear(action("n", name="alpha.note")))
        assert run(instance).stale
    assert not Note.objects.exists(), "the provider's write rolls back with the refused commit"
    assert not Operation.objects.exists()
    token = token_of(instance, "n")
    assert (token.state, token.attempt) == (TokenState.READY, 0)


@pytest.mark.django_db
def test_a_run_while_another_worker_holds_the_lease_does_nothing():
    instance = start(linear(action("a")))
    busy = api.lease_acquire(key=instance_lease_key(instance.pk), holder="other", ttl=30)
    report = run(instance)
    assert report.skipped == "lease held by another worker" and report.steps == 0
    assert not Operation.objects.exists()
    api.lease_release(fence=busy)
    assert drive(instance).status == InstanceStatus.COMPLETED


@pytest.mark.django_db
def test_a_duplicate_delivery_of_the_run_task_changes_nothing():
    instance = start(linear(action("a"), action("b", name="alpha.note")))
    first = run(instance)
    assert first.steps == 3 and instance.status == InstanceStatus.COMPLETED
    second = run(instance, worker="worker-2")
    assert second.steps == 0 and second.status == InstanceStatus.COMPLETED
    assert op_states(instance) == ["succeeded", "succeeded"]
    assert len(effects.effects()) == 1 and Note.objects.count() == 1


@pytest.mark.django_db
def test_a_stale_sweeper_cannot_fire_a_timer():
    instance = drive(start(linear(node("t", "timer", duration="PT0S"))))
    old = api.lease_acquire(key=SWEEPER, holder="sweeper-1", ttl=0.3)
    new = take_over(SWEEPER, holder="sweeper-2")
    with pytest.raises(api.StaleFence):
        timers_fire(fence=old)
    timer = Timer.objects.get()
    assert timer.state == "scheduled" and token_of(instance, "t").state == TokenState.WAITING
    assert timers_fire(fence=new) == 1
    timer.refresh_from_db()
    assert timer.fire_fence == new.fence
    assert drive(instance).status == InstanceStatus.COMPLETED


@pytest.mark.django_db
def test_a_stale_trigger_consumer_cannot_consume(monkeypatch):
    instance = drive(
        start(
            linear(node("w", "trigger", message="payment", correlation="case"), action("a")),
            {"value": "v1", "case": "C-1"},
        )
    )
    thief = {}

    def lapsing_acquire(*, key, holder, ttl):
        fence = api.lease_acquire(key=key, holder=holder, ttl=0.3)
        thief["fence"] = take_over(key, holder="consumer-2")
        return fence

    monkeypatch.setattr(triggers, "lease_acquire", lapsing_acquire)
    delivery = trigger_deliver(
        message="payment", correlation="C-1", delivery_id="bank-1", payload={"amount": 5}
    )
    assert delivery.state == "received", "recorded, but not consumed by the stale consumer"
    assert token_of(instance, "w").state == TokenState.WAITING
    monkeypatch.undo()
    api.lease_release(fence=thief["fence"])
    assert deliveries_retry() == 1  # the sweep hands it over
    delivery.refresh_from_db()
    assert delivery.state == "consumed" and delivery.token == token_of(instance, "w")
    assert drive(instance).status == InstanceStatus.COMPLETED


def _race(count: int, work) -> list[BaseException]:
    """Run ``work(i)`` in ``count`` threads started together; return their exceptions."""
    barrier = threading.Barrier(count)
    errors: list[BaseException] = []

    def target(i: int) -> None:
        try:
            barrier.wait()
            work(i)
        except BaseException as exc:  # reported to the test
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=target, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return errors


@pytest.mark.django_db(transaction=True)
def test_concurrent_runs_of_one_instance_make_each_transition_once(on_postgres, settings):
    settings.GOVFLOW_MAX_STEPS_PER_RUN = 1  # hand the instance back and forth between workers
    instance = start(linear(*(action(f"s{i}") for i in range(1, 6))))

    def work(i: int) -> None:
        for _ in range(200):
            report = instance_run(instance_id=instance.pk, worker=f"racer-{i}")
            if report.status in {
                InstanceStatus.COMPLETED,
                InstanceStatus.FAILED,
                InstanceStatus.BLOCKED,
            }:
                return

    assert _race(6, work) == []
    instance.refresh_from_db()
    assert instance.status == InstanceStatus.COMPLETED, instance.reason
    nodes = Counter(instance.tokens.values_list("node_id", flat=True))
    assert nodes == Counter(["start", "s1", "s2", "s3", "s4", "s5"])
    assert set(instance.tokens.values_list("state", flat=True)) == {TokenState.COMPLETED}
    assert [op.state for op in operations(instance)] == ["succeeded"] * 5
    assert effects.call_count() == 5
    assert sorted(calls for _, _, calls in effects.effects()) == [1] * 5
    assert chain_ok(instance)


@pytest.mark.django_db(transaction=True)
def test_concurrent_deliveries_of_one_message_are_consumed_once(on_postgres):
    instance = drive(
        start(
            linear(node("w", "trigger", message="payment", correlation="case"), action("a")),
            {"value": "v1", "case": "C-1"},
        )
    )
    results = []

    def work(i: int) -> None:
        results.append(
            trigger_deliver(
                message="payment", correlation="C-1", delivery_id="bank-1", payload={"amount": 5}
            ).pk
        )

    assert _race(5, work) == []
    assert len(set(results)) == 1 and TriggerDelivery.objects.count() == 1
    assert TriggerDelivery.objects.get().state == "consumed"
    assert drive(instance).status == InstanceStatus.COMPLETED
    assert effects.call_count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_cancel_racing_the_workers_stops_the_instance_cleanly(
    on_postgres, settings, django_user_model
):
    operator = user_with(django_user_model, "operator", "engine.operate_instance")
    settings.GOVFLOW_MAX_STEPS_PER_RUN = 1
    instance = start(linear(*(action(f"s{i}") for i in range(1, 9))))

    def work(i: int) -> None:
        if i == 0:
            for _ in range(500):
                try:
                    instance_cancel(instance_id=instance.pk, actor=operator, reason="withdrawn")
                    return
                except EngineConflict as exc:
                    if "already" in str(exc):
                        return
        else:
            for _ in range(200):
                if instance_run(instance_id=instance.pk, worker=f"racer-{i}").status in {
                    InstanceStatus.COMPLETED,
                    InstanceStatus.CANCELLED,
                }:
                    return

    assert _race(4, work) == []
    instance.refresh_from_db()
    assert instance.status in {InstanceStatus.CANCELLED, InstanceStatus.COMPLETED}
    states = list(instance.tokens.values_list("state", flat=True))
    assert not {TokenState.READY, TokenState.EXECUTING} & set(states)
    done = instance.tokens.filter(state=TokenState.COMPLETED).exclude(node_id="start").count()
    # Every completed step did its effect once, and nothing ran after the cancel.
    assert effects.call_count() == len(effects.effects()) == done
    assert chain_ok(instance)


@pytest.mark.django_db
def test_a_message_hand_over_holds_its_lease_for_the_configured_time(monkeypatch, settings):
    settings.GOVFLOW_DELIVERY_LEASE_TTL = 7
    instance = drive(
        start(
            linear(node("w", "trigger", message="payment", correlation="case"), action("a")),
            {"value": "v1", "case": "C-2"},
        )
    )
    asked = []

    def acquire(*, key, holder, ttl):
        asked.append((key, ttl))
        return api.lease_acquire(key=key, holder=holder, ttl=ttl)

    monkeypatch.setattr(triggers, "lease_acquire", acquire)
    delivery = trigger_deliver(message="payment", correlation="C-2", delivery_id="bank-2")
    assert asked == [(f"trigger:{delivery.pk}", 7.0)]
    assert delivery.state == "consumed" and token_of(instance, "w").state == TokenState.READY
