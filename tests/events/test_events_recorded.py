"""Engine events are written in the commit of their transition, and never without it."""

from __future__ import annotations

import pytest
from django.db import transaction

from govflow.engine.models import InstanceStatus, TokenState
from govflow.engine.services.instances import instance_cancel
from govflow.events.models import Event, EventCounter
from govflow.events.record import event_record
from govflow.handoffs.services.desk import handoff_approve, handoff_request
from tests.engine_helpers import evidence, token_of, user_with
from tests.flows import action, drive, linear, start
from tests.providers.alpha import effects

pytestmark = pytest.mark.django_db

CHECKS = {"store": "Looked the idempotency key up in the alpha store."}


def events_of(instance) -> list[tuple[int, str]]:
    return list(
        Event.objects.filter(instance_id=instance.pk).order_by("seq").values_list("seq", "type")
    )


def test_a_plain_run_emits_started_and_completed_only(django_assert_num_queries):
    instance = drive(start(linear(action("a"), action("b"), action("c"))))
    assert instance.status == InstanceStatus.COMPLETED
    # Three steps succeeded and moved on: no event for any of them.
    assert events_of(instance) == [(1, "instance.started"), (2, "instance.completed")]
    completed = Event.objects.get(instance_id=instance.pk, seq=2)
    assert completed.data == {
        "instance": instance.pk,
        "definition": "tests.linear",
        "version": completed.data["version"],
        "status": "completed",
        "previous_status": "running",
    }
    assert completed.tenant == instance.tenant


def test_an_unknown_outcome_opens_a_handoff_and_its_decision_closes_it(
    django_user_model, requester, approver
):
    effects.SCRIPT["alpha.write"] = ["raise_after"]
    instance = drive(start(linear(action("a"), action("b")), tenant="t-one"))
    assert token_of(instance, "a").state == TokenState.OUTCOME_UNKNOWN
    assert [t for _, t in events_of(instance)] == [
        "instance.started",
        "handoff.opened",
        "step.blocked",
    ]
    opened = Event.objects.get(instance_id=instance.pk, type="handoff.opened")
    assert opened.data["step"] == "a" and opened.data["state"] == "outcome_unknown"
    assert opened.tenant == "t-one"
    blocked = Event.objects.get(instance_id=instance.pk, type="step.blocked")
    assert blocked.data["steps"] == ["a"]
    # No reason, input or error text travels in an event.
    assert all("reason" not in e.data and "message" not in e.data for e in Event.objects.all())
    decision = handoff_request(
        instance_id=instance.pk,
        token_id=token_of(instance, "a").pk,
        kind="effect_confirmed",
        rationale="The store shows it.",
        actor=requester,
        checks=CHECKS,
        evidence=[evidence()],
    )
    handoff_approve(decision_id=decision.pk, actor=approver, result_fp=decision.result_fp)
    instance = drive(instance)
    assert instance.status == InstanceStatus.COMPLETED
    types = [t for _, t in events_of(instance)]
    assert types[3:] == ["handoff.decided", "step.unblocked", "instance.completed"]
    decided = Event.objects.get(instance_id=instance.pk, type="handoff.decided")
    assert decided.data["state"] == "completed"
    seqs = [s for s, _ in events_of(instance)]
    assert seqs == list(range(1, len(seqs) + 1))


def test_a_cancel_emits_cancelled_in_its_commit(django_user_model):
    operator = user_with(django_user_model, "op", "engine.operate_instance")
    effects.SCRIPT["alpha.write"] = ["pending"]
    instance = start(linear(action("a")))
    instance_cancel(instance_id=instance.pk, actor=operator, reason="withdrawn")
    assert [t for _, t in events_of(instance)] == ["instance.started", "instance.cancelled"]


def test_a_rolled_back_transition_leaves_no_event():
    instance = start(linear(action("a")))
    with pytest.raises(RuntimeError), transaction.atomic():
        event_record(type="step.blocked", instance_id=instance.pk, tenant="default", data={})
        raise RuntimeError("the transition fails after its event was written")
    assert [t for _, t in events_of(instance)] == ["instance.started"]
    # The sequence has no gap: the next event takes the number the rolled-back one had.
    with transaction.atomic():
        event = event_record(type="step.blocked", instance_id=instance.pk, tenant="default")
    assert event.seq == 2


def test_a_start_that_fails_after_its_event_leaves_neither(monkeypatch):
    from django.db import DatabaseError, connection

    from govflow.engine.models import Instance, Token
    from govflow.engine.services import instances

    if connection.vendor == "postgresql":
        # The start is one statement (ADR 0058): its last part fails once the event's row
        # is in it (it reads the row), so the statement is refused after the event.
        real = instances.instance_started_parts
        counter = EventCounter._meta.db_table

        def written_then_broken(instance, **kwargs):
            parts, params = real(instance, **kwargs)
            broken = (
                f"broken AS (INSERT INTO {counter} (instance_id, last_seq) "
                "SELECT -1, 1 / (count(*) - 1) FROM event)"
            )
            return [*parts, broken], params

        monkeypatch.setattr(instances, "instance_started_parts", written_then_broken)
        failure: type[Exception] = DatabaseError
    else:
        real = instances.instance_started

        def written_then_broken(instance, **kwargs):
            real(instance, **kwargs)
            assert Event.objects.filter(instance_id=instance.pk).exists()  # written …
            raise RuntimeError("the commit fails after the event was written")

        monkeypatch.setattr(instances, "instance_started", written_then_broken)
        failure = RuntimeError
    with pytest.raises(failure):
        start(linear(action("a")), tenant="t-broken")
    # … and rolled back with the start: no instance, no step, no event.
    assert not Instance.objects.filter(tenant="t-broken").exists()
    assert not Token.objects.filter(instance__tenant="t-broken").exists()
    assert not Event.objects.filter(tenant="t-broken").exists()


def test_a_recorded_event_is_its_stored_row_with_the_next_number():
    """On PostgreSQL the number and the row are one statement (ADR 0044), on SQLite two:
    either way the event returned is the row stored, numbered after the counter."""
    instance = start(linear(action("a")))
    with transaction.atomic():
        first = event_record(type="step.blocked", instance_id=instance.pk, tenant="t1")
        second = event_record(type="step.blocked", instance_id=instance.pk, tenant="t1")
    assert (first.seq, second.seq) == (2, 3)
    stored = Event.objects.get(pk=second.pk)
    assert (stored.seq, stored.tenant, stored.event_id) == (3, "t1", second.event_id)
    assert stored.created_at is not None and not stored.fanned_out
    assert EventCounter.objects.get(instance_id=instance.pk).last_seq == 3


def test_event_data_refuses_inputs_and_texts():
    with pytest.raises(ValueError, match="never carry inputs"):
        event_record(
            type="instance.started", instance_id=1, tenant="t", data={"variables": {"a": 1}}
        )
    with pytest.raises(ValueError, match="not an event type"):
        event_record(type="instance.exploded", instance_id=1, tenant="t")


def test_a_completion_refused_by_the_fence_leaves_no_completed_event(settings):
    """A worker whose lease was taken over during the call cannot commit the step that
    would end the instance: no instance.completed without the completion."""
    from govflow.engine.registry import registry
    from govflow.engine.services.run import instance_lease_key
    from govflow.engine.services.runtime import instance_run
    from recovery import api
    from tests.engine_helpers import alpha_write, take_over
    from tests.providers.alpha import actions as alpha

    settings.GOVFLOW_LEASE_TTL = 1.0
    thief = {}

    def slow(context):
        thief["fence"] = take_over(instance_lease_key(context.instance_id))
        return alpha.write.execute(context)

    with registry.override(alpha_write(execute=slow)):
        instance = start(linear(action("a")))
        report = instance_run(instance_id=instance.pk, worker="worker-1")
    assert report.stale
    instance.refresh_from_db()
    assert instance.status == InstanceStatus.RUNNING
    assert [t for _, t in events_of(instance)] == ["instance.started"]
    # The new holder finds the step uncertain: its events, in their own commit.
    api.lease_release(fence=thief["fence"])
    settings.GOVFLOW_LEASE_TTL = 30
    instance = drive(instance)
    assert instance.status == InstanceStatus.BLOCKED
    assert [t for _, t in events_of(instance)] == [
        "instance.started",
        "handoff.opened",
        "step.blocked",
    ]


def test_a_failed_step_opens_an_incident_and_its_resolution_is_an_event(django_user_model):
    from govflow.engine.models import Incident
    from govflow.engine.provider import Failed
    from govflow.handoffs.services.incidents import engine_incident_resolve

    effects.SCRIPT["alpha.write"] = [Failed("refused by the registry", permanent=True)]
    instance = drive(start(linear(action("a"))))
    assert instance.status == InstanceStatus.FAILED
    incident = Incident.objects.get(instance_id=instance.pk)
    types = [t for _, t in events_of(instance)]
    assert types == ["instance.started", "incident.opened", "instance.failed"]
    opened = Event.objects.get(instance_id=instance.pk, type="incident.opened")
    assert opened.data == {
        "instance": instance.pk,
        "incident": incident.pk,
        "kind": "step_failed",
        "step": "a",
    }
    assert "refused by the registry" not in str(Event.objects.values_list("data", flat=True))
    operator = user_with(django_user_model, "op", "engine.operate_instance")
    engine_incident_resolve(incident_id=incident.pk, actor=operator, rationale="Looked.")
    resolved = Event.objects.get(instance_id=instance.pk, type="incident.resolved")
    assert resolved.data == {
        "instance": instance.pk,
        "incident": incident.pk,
        "kind": "step_failed",
    }


def test_a_compensation_recorded_on_cancel_is_an_event(django_user_model):
    from recovery import api

    operator = user_with(django_user_model, "op", "engine.operate_instance")
    wait = {"id": "wait", "type": "timer", "duration": "PT1H"}
    step = action("a", "alpha.charge", value="amount_a", compensate_on=["cancel"])
    instance = drive(start(linear(step, wait), {"amount_a": "a-10EUR"}))
    instance_cancel(instance_id=instance.pk, actor=operator, reason="withdrawn")
    [intent] = api.compensations_of(api.Subject("govflow.instance", str(instance.pk)))
    types = [t for _, t in events_of(instance)]
    assert types == ["instance.started", "compensation.recorded", "instance.cancelled"]
    recorded = Event.objects.get(instance_id=instance.pk, type="compensation.recorded")
    assert recorded.data["compensation"] == intent.key
    assert recorded.data["original"] == intent.original_key
    assert recorded.data["trigger"] == "cancel"
