"""A message reaches exactly the step that waits for it: names with ':', long values,
values that cannot correlate (found by an audit of hostile definitions)."""

from __future__ import annotations

import pytest

from govflow.engine.errors import InvalidRequest
from govflow.engine.models import InstanceStatus, TriggerDelivery
from govflow.engine.services.sweep import deliveries_retry
from govflow.engine.services.triggers import trigger_deliver
from tests.engine_helpers import node, token_of
from tests.flows import action, drive, linear, start

pytestmark = pytest.mark.django_db


def waiting_for(message: str, ref, *, key: str):
    document = linear(
        node("w", "trigger", message=message, correlation="ref", output={"got": "n"}),
        action("a"),
        key=key,
    )
    return drive(start(document, {"value": "v", "ref": ref}))


def test_a_colon_in_the_message_name_does_not_let_another_message_in():
    colon = waiting_for("permit:approved", "X", key="tests.colon")
    plain = waiting_for("permit", "approved:X", key="tests.plain")
    assert token_of(colon, "w").wait_key == "permit\\:approved:X"
    assert token_of(plain, "w").wait_key == "permit:approved:X"
    to_plain = trigger_deliver(
        message="permit", correlation="approved:X", delivery_id="d-plain", payload={"n": 1}
    )
    assert to_plain.token == token_of(plain, "w")
    assert drive(colon).status == InstanceStatus.WAITING
    to_colon = trigger_deliver(
        message="permit:approved", correlation="X", delivery_id="d-colon", payload={"n": 2}
    )
    assert to_colon.token == token_of(colon, "w")
    assert (drive(plain).variables["got"], drive(colon).variables["got"]) == (1, 2)


def test_the_sweep_finds_the_step_of_a_message_with_a_colon_or_backslash():
    """The sweep's retry joins deliveries to steps by the key built in SQL: the same key."""
    from django.utils import timezone

    instance = waiting_for("a:b\\c", "d", key="tests.sweep_key")
    kept = TriggerDelivery.objects.create(  # as if it arrived while the step was moving
        delivery_id="d-kept", message="a:b\\c", correlation="d", received_at=timezone.now()
    )
    decoy = TriggerDelivery.objects.create(
        delivery_id="d-decoy", message="a", correlation="b\\c:d", received_at=timezone.now()
    )
    assert deliveries_retry() == 1
    assert TriggerDelivery.objects.get(pk=kept.pk).token == token_of(instance, "w")
    assert TriggerDelivery.objects.get(pk=decoy.pk).state == "received"


def test_long_values_that_share_their_first_300_characters_stay_two_waits():
    name = "m" * 200
    first = waiting_for(name, "r" * 97 + "A", key="tests.long_a")
    second = waiting_for(name, "r" * 97 + "B", key="tests.long_b")
    delivery = trigger_deliver(message=name, correlation="r" * 97 + "B", delivery_id="d-b")
    assert delivery.token == token_of(second, "w")
    assert drive(first).status == InstanceStatus.WAITING


def test_a_wait_no_delivery_could_reach_blocks_saying_why():
    instance = waiting_for("m" * 150, "r" * 160, key="tests.too_long")
    assert instance.status == InstanceStatus.BLOCKED
    assert "160 characters" in instance.reason and "shorter value" in instance.reason
    with pytest.raises(InvalidRequest, match="too long"):
        trigger_deliver(message="m" * 150, correlation="r" * 160, delivery_id="d-long")
    assert not TriggerDelivery.objects.filter(delivery_id="d-long").exists()


@pytest.mark.parametrize("ref", [None, True, 1.5, {"id": 1}])
def test_a_correlation_value_that_is_not_text_or_a_whole_number_blocks_saying_why(ref):
    instance = waiting_for("paid", ref, key="tests.odd_ref")
    assert instance.status == InstanceStatus.BLOCKED
    assert "correlated by a string or a whole number" in instance.reason


def test_a_whole_number_correlates_as_its_digits():
    instance = waiting_for("paid", 42, key="tests.number_ref")
    delivery = trigger_deliver(message="paid", correlation="42", delivery_id="d-42")
    assert delivery.token == token_of(instance, "w")
