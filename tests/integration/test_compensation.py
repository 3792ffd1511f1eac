"""Compensation (the saga): planned once at its trigger, run in reverse, through the ledger."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, transaction

from govflow.engine.models import InstanceStatus
from govflow.engine.services.instances import instance_cancel
from recovery import api
from recovery.models import Compensation, Operation
from tests.engine_helpers import chain_ok, user_with
from tests.flows import action, drive, linear, start
from tests.providers.alpha import effects

pytestmark = pytest.mark.django_db

WAIT = {"id": "wait", "type": "timer", "duration": "PT1H"}


def charged(*nodes, on=("cancel",)):
    """An instance that charged ``nodes`` (alpha.charge) and waits on a long timer."""
    steps = [action(n, "alpha.charge", value=f"amount_{n}", compensate_on=list(on)) for n in nodes]
    variables = {f"amount_{n}": f"{n}-10EUR" for n in nodes}
    instance = drive(start(linear(*steps, WAIT), variables))
    assert instance.status == InstanceStatus.WAITING
    return instance


@pytest.fixture
def operator(django_user_model):
    return user_with(django_user_model, "operator", "engine.operate_instance")


def compensations(instance) -> list[api.CompensationView]:
    return api.compensations_of(api.Subject("govflow.instance", str(instance.pk)))


def test_cancel_compensates_in_reverse_order(operator):
    instance = charged("a", "b", "c")
    instance_cancel(instance_id=instance.pk, actor=operator, reason="applicant withdrew")
    planned = compensations(instance)
    assert [c.step_id for c in planned] == ["c", "b", "a"]
    assert all(c.key.startswith("cmp-") and c.state == "prepared" for c in planned)
    drive(instance)
    done = compensations(instance)
    assert [c.state for c in done] == ["succeeded"] * 3
    undone = [key for key, action, _ in effects.effects("alpha.undo")]
    assert len(undone) == 3
    # Reverse order: the undo operations were dispatched c, b, a.
    ops = Operation.objects.filter(key__in=[c.key for c in done]).order_by("updated_at", "pk")
    assert [op.step_id for op in ops] == ["c", "b", "a"]
    assert chain_ok(instance)


def test_a_second_intent_for_the_same_operation_is_refused_by_the_database(operator):
    instance = charged("a")
    instance_cancel(instance_id=instance.pk, actor=operator, reason="withdrawn")
    intent = Compensation.objects.get()
    with pytest.raises(IntegrityError), transaction.atomic():
        Compensation.objects.create(
            original=intent.original,
            operation=intent.original,
            subject_type=intent.subject_type,
            subject_id=intent.subject_id,
            position=1,
            tenant="x",
            trigger="cancel",
            approval="automatic",
            recorded_at=intent.recorded_at,
        )


def subject_of(instance) -> api.Subject:
    return api.Subject("govflow.instance", str(instance.pk))


def ledger_size(instance) -> tuple[int, int, int]:
    return (
        Compensation.objects.count(),
        Operation.objects.count(),
        api.subject_revision(subject_of(instance)),
    )


def _record(original_key: str, fence, **overrides):
    fp = "0" * 64
    kwargs = dict(
        original_key=original_key,
        action="alpha.undo",
        recovery_mode="non_atomic",
        definition_fp=fp,
        input_fp="1" * 64,
        preview_fp=fp,
        access_fp=fp,
        idempotency_fp="2" * 64,
        tenant="default",
        trigger="operator",
        approval="automatic",
        fence=fence,
    )
    return api.compensation_record(**{**kwargs, **overrides})


@pytest.mark.parametrize(
    ("script", "state", "says"),
    [
        (api_failed := "failed", "failed", "nothing happened"),
        ("raise_after", "outcome_unknown", "never compensated on a guess"),
        ("pending", "pending", "provider still owns the outcome"),
    ],
)
def test_an_ineligible_original_is_refused_with_its_reason_and_nothing_recorded(
    script, state, says
):
    from govflow.engine.provider import Failed, Pending

    effects.SCRIPT["alpha.charge"] = [
        {"failed": Failed("card declined", permanent=True), "pending": Pending(60)}.get(
            script, script
        )
    ]
    instance = drive(start(linear(action("a", "alpha.charge", compensate_on=["cancel"]))))
    original = Operation.objects.get(subject_id=str(instance.pk))
    assert original.state == state
    fence = api.lease_acquire(key=f"instance:{instance.pk}", holder="test", ttl=30)
    before = ledger_size(instance)
    with pytest.raises(api.CompensationRefused, match=says) as caught:
        _record(original.key, fence)
    assert caught.value.reason == "ineligible"
    assert ledger_size(instance) == before


def test_a_running_original_and_a_compensation_itself_are_refused(operator):
    instance = charged("a")
    instance_cancel(instance_id=instance.pk, actor=operator, reason="withdrawn")
    intent = Compensation.objects.select_related("operation").get()
    fence = api.lease_acquire(key=f"instance:{instance.pk}", holder="test", ttl=30)
    before = ledger_size(instance)
    with pytest.raises(api.CompensationRefused, match="itself a compensation"):
        _record(intent.operation.key, fence)
    running = api.operation_record(
        subject=subject_of(instance),
        step_id="a",
        action="alpha.charge",
        recovery_mode="non_atomic",
        definition_fp="3" * 64,
        input_fp="4" * 64,
        preview_fp="5" * 64,
        access_fp="6" * 64,
        idempotency_fp="7" * 64,
        nonce="running",
        ordinal=0,
        fence=fence,
    )
    before = ledger_size(instance)
    with pytest.raises(api.CompensationRefused, match="still running"):
        _record(running.key, fence)
    with pytest.raises(api.CompensationRefused, match="already has its compensation") as caught:
        _record(intent.original.key, fence)
    assert caught.value.reason == "exists"
    assert ledger_size(instance) == before


def test_cancel_without_declared_compensation_records_nothing_more(operator):
    instance = drive(start(linear(action("a", "alpha.charge"), WAIT)))
    instance_cancel(instance_id=instance.pk, actor=operator, reason="withdrawn")
    drive(instance)
    assert Compensation.objects.count() == 0
    assert effects.effects("alpha.undo") == []
    assert api.facts_read(subject=subject_of(instance), kind="engine.compensations_planned") == []


def test_a_failure_after_the_step_compensates_it():
    from govflow.engine.provider import Failed

    effects.SCRIPT["alpha.write"] = [Failed("registry refused", permanent=True)]
    document = linear(
        action("charge", "alpha.charge", compensate_on=["failure"]), action("register")
    )
    instance = drive(start(document))
    assert instance.status == InstanceStatus.FAILED
    [done] = compensations(instance)
    assert (done.step_id, done.trigger, done.state) == ("charge", "failure", "succeeded")
    assert len(effects.effects("alpha.undo")) == 1
    drive(instance)  # planned once: never a second intent
    assert Compensation.objects.count() == 1
    assert chain_ok(instance)


def test_cancel_does_not_trigger_a_failure_only_compensation(operator):
    instance = charged("a", on=("failure",))
    instance_cancel(instance_id=instance.pk, actor=operator, reason="withdrawn")
    drive(instance)
    assert Compensation.objects.count() == 0


def test_a_failed_compensation_stays_failed_and_stops_the_saga(operator):
    from govflow.engine.provider import Failed

    instance = charged("a", "b")
    effects.SCRIPT["alpha.undo"] = [Failed("refund rejected by the bank", permanent=True)]
    instance_cancel(instance_id=instance.pk, actor=operator, reason="withdrawn")
    drive(instance)
    assert [(c.step_id, c.state) for c in compensations(instance)] == [
        ("b", "failed"),
        ("a", "prepared"),
    ]
    drive(instance)
    # The scripted failure was used up: a second call would have reached the store.
    assert effects.call_count("alpha.undo") == 0
    assert [(c.step_id, c.state) for c in compensations(instance)] == [
        ("b", "failed"),
        ("a", "prepared"),
    ]


def test_an_unknown_compensation_is_never_run_twice_and_goes_on_once_decided(
    operator, requester, approver
):
    from govflow.handoffs.services.compensations import (
        compensation_outcome_approve,
        compensation_outcome_request,
    )
    from tests.engine_helpers import evidence

    instance = charged("a", "b")
    effects.SCRIPT["alpha.undo"] = ["raise_after"]
    instance_cancel(instance_id=instance.pk, actor=operator, reason="withdrawn")
    drive(instance)
    unknown, waiting = compensations(instance)
    assert (unknown.state, waiting.state) == ("outcome_unknown", "prepared")
    drive(instance)
    assert effects.call_count("alpha.undo") == 1
    decision = compensation_outcome_request(
        instance_id=instance.pk,
        key=unknown.key,
        kind="effect_confirmed",
        rationale="The alpha store holds the undo.",
        actor=requester,
        evidence=[evidence()],
    )
    compensation_outcome_approve(decision_id=decision.pk, actor=approver, instance_id=instance.pk)
    drive(instance)
    assert [c.state for c in compensations(instance)] == ["effect_confirmed", "succeeded"]
    assert effects.call_count("alpha.undo") == 2


def test_a_dispatched_compensation_whose_worker_died_becomes_unknown_never_called(operator):
    instance = charged("a")
    instance_cancel(instance_id=instance.pk, actor=operator, reason="withdrawn")
    [intent] = compensations(instance)
    fence = api.lease_acquire(key=f"instance:{instance.pk}", holder="dead-worker", ttl=30)
    api.compensation_dispatch(
        key=intent.key,
        fence=fence,
        tenant=intent.tenant,
        input_fp=intent.input_fp,
        preview_fp=intent.preview_fp,
    )
    api.lease_release(fence=fence)  # the worker died right after the dispatch
    drive(instance)
    [after] = compensations(instance)
    assert after.state == "outcome_unknown"
    assert effects.call_count("alpha.undo") == 0


def test_after_a_crash_before_dispatch_the_same_intent_is_used(operator, monkeypatch):
    from govflow.engine.services import saga

    instance = charged("a")
    instance_cancel(instance_id=instance.pk, actor=operator, reason="withdrawn")
    [before] = compensations(instance)

    def crash(**kwargs):
        raise KeyboardInterrupt("the worker died before the dispatch")

    monkeypatch.setattr(saga, "compensation_dispatch", crash)
    with pytest.raises(KeyboardInterrupt):
        drive(instance)
    monkeypatch.undo()
    drive(instance)
    [after] = compensations(instance)
    assert (after.key, after.input_fp, after.idempotency_fp) == (
        before.key,
        before.input_fp,
        before.idempotency_fp,
    )
    assert after.state == "succeeded"
    assert Compensation.objects.count() == 1
    [(_key, _action, calls)] = effects.effects("alpha.undo")
    assert calls == 1


def checked(operator):
    """A cancelled instance whose one compensation needs two people."""
    instance = drive(
        start(
            linear(action("a", "alpha.charge_checked", compensate_on=["cancel"]), WAIT),
        )
    )
    instance_cancel(instance_id=instance.pk, actor=operator, reason="withdrawn")
    [intent] = compensations(instance)
    return instance, intent


def request_and_approve(instance, intent, requester, approver):
    from govflow.handoffs.services.compensations import (
        compensation_approve_run,
        compensation_request_run,
    )

    decision = compensation_request_run(
        instance_id=instance.pk, key=intent.key, actor=requester, rationale="Refund it."
    )
    return compensation_approve_run(
        instance_id=instance.pk,
        decision_id=decision.pk,
        actor=approver,
        shown_revision=api.subject_revision(subject_of(instance)),
        shown_preview_fp=intent.preview_fp,
    )


def test_an_operator_compensation_waits_for_a_second_person(operator, approver, django_user_model):
    from govflow.handoffs.services.compensations import (
        compensation_approve_run,
        compensation_request_run,
    )

    requester = user_with(
        django_user_model, "both", "recovery.request_decision", "recovery.approve_decision"
    )
    instance, intent = checked(operator)
    assert intent.awaiting_approval
    drive(instance)
    assert effects.effects("alpha.undo") == []
    decision = compensation_request_run(
        instance_id=instance.pk, key=intent.key, actor=requester, rationale="Refund it."
    )
    shown = api.subject_revision(subject_of(instance))
    with pytest.raises(api.DecisionError, match="cannot approve it"):
        compensation_approve_run(
            instance_id=instance.pk,
            decision_id=decision.pk,
            actor=requester,
            shown_revision=shown,
            shown_preview_fp=intent.preview_fp,
        )
    compensation_approve_run(
        instance_id=instance.pk,
        decision_id=decision.pk,
        actor=approver,
        shown_revision=shown,
        shown_preview_fp=intent.preview_fp,
    )
    [bound] = compensations(instance)
    assert bound.approved and bound.bound_revision == shown + 1
    drive(instance)
    assert compensations(instance)[0].state == "succeeded"
    assert len(effects.effects("alpha.undo")) == 1
    assert chain_ok(instance)


def test_an_approval_after_drift_is_refused_and_nothing_recorded(operator, requester, approver):
    from govflow.handoffs.services.compensations import (
        compensation_approve_run,
        compensation_request_run,
    )

    instance, intent = checked(operator)
    decision = compensation_request_run(
        instance_id=instance.pk, key=intent.key, actor=requester, rationale="Refund it."
    )
    shown = api.subject_revision(subject_of(instance))
    api.fact_append(subject=subject_of(instance), kind="tests.moved_on", fact={"n": 1})
    before = ledger_size(instance)
    with pytest.raises(api.CompensationDrift, match="revision moved") as caught:
        compensation_approve_run(
            instance_id=instance.pk,
            decision_id=decision.pk,
            actor=approver,
            shown_revision=shown,
            shown_preview_fp=intent.preview_fp,
        )
    assert caught.value.drift == ("revision",)
    with pytest.raises(api.CompensationDrift, match="preview moved"):
        compensation_approve_run(
            instance_id=instance.pk,
            decision_id=decision.pk,
            actor=approver,
            shown_revision=shown + 1,
            shown_preview_fp="f" * 64,
        )
    assert ledger_size(instance) == before
    assert api.decision_get(decision_id=decision.pk).state == "requested"
    assert not compensations(instance)[0].approved


def test_drift_between_approval_and_dispatch_voids_the_approval(operator, requester, approver):
    instance, intent = checked(operator)
    request_and_approve(instance, intent, requester, approver)
    api.fact_append(subject=subject_of(instance), kind="tests.moved_on", fact={"n": 1})
    drive(instance)
    [voided] = compensations(instance)
    assert (voided.state, voided.approved) == ("prepared", False)
    assert effects.effects("alpha.undo") == []
    [void] = api.facts_read(subject=subject_of(instance), kind="compensation.approval_void")
    assert void["drift"] == ["revision"]
    # A new approval, bound to the revision as it is now, lets it run.
    request_and_approve(instance, voided, requester, approver)
    drive(instance)
    assert compensations(instance)[0].state == "succeeded"


@pytest.mark.parametrize(
    ("change", "drift"),
    [({"tenant": "elsewhere"}, ("tenant",)), ({"input_fp": "e" * 64}, ("input",))],
)
def test_a_changed_tenant_or_input_refuses_the_dispatch(
    operator, requester, approver, change, drift
):
    instance, intent = checked(operator)
    request_and_approve(instance, intent, requester, approver)
    fence = api.lease_acquire(key=f"instance:{instance.pk}", holder="test", ttl=30)
    presented = {"tenant": intent.tenant, "input_fp": intent.input_fp, **change}
    refused = api.compensation_dispatch(
        key=intent.key, fence=fence, preview_fp=intent.preview_fp, **presented
    )
    assert isinstance(refused, api.DispatchRefused)
    assert refused.drift == drift
    assert "approve it anew" in refused.message
    [after] = compensations(instance)
    assert (after.state, after.approved) == ("prepared", False)


def test_compensations_are_approved_in_the_order_they_run(operator, requester):
    from govflow.engine.errors import EngineConflict
    from govflow.handoffs.services.compensations import compensation_request_run

    instance = drive(
        start(
            linear(
                action("a", "alpha.charge_checked", compensate_on=["cancel"]),
                action("b", "alpha.charge_checked", compensate_on=["cancel"]),
                WAIT,
            )
        )
    )
    instance_cancel(instance_id=instance.pk, actor=operator, reason="withdrawn")
    first, second = compensations(instance)
    assert first.step_id == "b"
    with pytest.raises(EngineConflict, match="runs first"):
        compensation_request_run(
            instance_id=instance.pk, key=second.key, actor=requester, rationale="Refund."
        )


def test_an_atomic_step_is_compensated_from_its_own_operation(operator):
    import dataclasses

    from govflow.engine.provider import Compensate
    from govflow.engine.registry import registry
    from tests.providers.alpha import actions as alpha

    noted = dataclasses.replace(
        alpha.note,
        name="alpha.noted",
        compensate=Compensate(action="alpha.undo", input={"value": "output.noted"}),
    )
    with registry.override(noted):
        instance = drive(start(linear(action("a", "alpha.noted", compensate_on=["cancel"]), WAIT)))
        instance_cancel(instance_id=instance.pk, actor=operator, reason="withdrawn")
        drive(instance)
    [done] = compensations(instance)
    original = Operation.objects.get(key=done.original_key)
    assert (original.action, original.state, done.state) == (
        "alpha.noted",
        "succeeded",
        "succeeded",
    )
