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
    steps = [
        action(n, "alpha.charge", value=f"amount_{n}", compensate_on=list(on)) for n in nodes
    ]
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
