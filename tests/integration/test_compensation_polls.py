"""A compensating action that answers Pending is polled like any action (issue 13 gaps).

Only an exhausted poll budget or an Unknown answer makes it an unknown outcome with its
handoff; a provider that says it is working on it is asked again, not a person.
"""

from __future__ import annotations

import dataclasses

import pytest

from govflow.engine.models import Instance
from govflow.engine.provider import Pending, Unknown
from govflow.engine.registry import registry
from govflow.engine.services.instances import instance_cancel
from recovery import api
from recovery.models import Operation
from tests.engine_helpers import chain_ok, user_with
from tests.flows import action, drive, linear, start
from tests.providers.alpha import effects

pytestmark = pytest.mark.django_db

WAIT = {"id": "wait", "type": "timer", "duration": "PT1H"}


@pytest.fixture
def operator(django_user_model):
    return user_with(django_user_model, "operator", "engine.operate_instance")


def cancelled_after_charge(operator) -> Instance:
    instance = drive(
        start(
            linear(action("a", "alpha.charge", compensate_on=["cancel"]), WAIT),
            {"value": "a-10EUR"},
        )
    )
    instance_cancel(instance_id=instance.pk, actor=operator, reason="applicant withdrew")
    return instance


def the_compensation(instance) -> api.CompensationView:
    [view] = api.compensations_of(api.Subject("govflow.instance", str(instance.pk)))
    return view


def waiting_for_a_person() -> list[str]:
    return [c.operation.key for c in api.compensations_waiting(subject_type="govflow.instance")]


def undo_operations(instance) -> list[Operation]:
    return list(
        Operation.objects.filter(subject_id=str(instance.pk), key__startswith="cmp-").order_by(
            "ordinal"
        )
    )


def test_a_pending_compensation_is_polled_until_it_succeeds_with_no_handoff(operator):
    effects.SCRIPT["alpha.undo"] = [Pending(0)]
    effects.SCRIPT["alpha.undo:poll"] = [Pending(0)]  # then the poll answers Succeeded
    instance = cancelled_after_charge(operator)
    drive(instance)
    pending = the_compensation(instance)
    assert (pending.state, pending.polls) == ("pending", 0)
    assert waiting_for_a_person() == []  # the provider is working on it: nobody is asked
    drive(instance)
    assert the_compensation(instance).state == "pending"
    drive(instance)
    done = the_compensation(instance)
    assert (done.state, done.polls) == ("succeeded", 2)
    assert waiting_for_a_person() == []
    ops = undo_operations(instance)
    # Each poll is a new cmp- operation with the same idempotency key (invariant I4).
    assert [op.state for op in ops] == ["pending", "pending", "succeeded"]
    assert len({op.idempotency_fp for op in ops}) == 1
    assert ops[-1].key == done.key
    instance.refresh_from_db()
    assert instance.status == "cancelled"
    assert chain_ok(instance)


def test_a_pending_compensation_is_not_polled_before_its_time(operator):
    effects.SCRIPT["alpha.undo"] = [Pending(3600)]
    effects.SCRIPT["alpha.undo:poll"] = [Unknown("must not be asked yet")]
    instance = cancelled_after_charge(operator)
    drive(instance)
    drive(instance)  # claimed early: nothing is asked, the mark stays for the poll's time
    view = the_compensation(instance)
    assert (view.state, view.polls) == ("pending", 0)
    assert effects.SCRIPT["alpha.undo:poll"], "the provider was polled before its time"
    instance.refresh_from_db()
    assert instance.runnable_at is not None and instance.runnable_at >= view.not_before
    due = api.compensation_subjects_due(subject_type="govflow.instance", now=view.not_before)
    assert due == [str(instance.pk)]


def budget_of(polls: int):
    charge = registry.get("alpha.charge")
    spec = dataclasses.replace(charge.compensate, poll_budget=polls)
    return registry.override(dataclasses.replace(charge, compensate=spec))


def test_a_compensation_pending_past_its_poll_budget_becomes_a_handoff(operator):
    effects.SCRIPT["alpha.undo"] = [Pending(0)]
    effects.SCRIPT["alpha.undo:poll"] = [Pending(0), Pending(0)]
    with budget_of(1):
        instance = cancelled_after_charge(operator)
        drive(instance)
        drive(instance)
        drive(instance)
    view = the_compensation(instance)
    assert (view.state, view.polls) == ("outcome_unknown", 1)
    assert waiting_for_a_person() == [view.key]
    assert effects.SCRIPT["alpha.undo:poll"] == [Pending(0)], "polled past its budget"
    assert [op.state for op in undo_operations(instance)] == ["pending", "outcome_unknown"]


def test_an_unknown_answer_to_a_poll_becomes_a_handoff_at_once(operator):
    effects.SCRIPT["alpha.undo"] = [Pending(0)]
    effects.SCRIPT["alpha.undo:poll"] = [Unknown("the bank cannot say")]
    instance = cancelled_after_charge(operator)
    drive(instance)
    drive(instance)
    view = the_compensation(instance)
    assert (view.state, view.polls) == ("outcome_unknown", 1)
    assert waiting_for_a_person() == [view.key]
    drive(instance)
    assert the_compensation(instance).state == "outcome_unknown"  # never asked again


def test_a_poll_budget_outside_its_range_is_refused_at_registration():
    from govflow.engine.registry import RegistryError, validate_action

    charge = registry.get("alpha.charge")
    spec = dataclasses.replace(charge.compensate, poll_budget=-1)
    with pytest.raises(RegistryError, match="poll_budget must be an integer from 0 to 1000"):
        validate_action(dataclasses.replace(charge, compensate=spec))
