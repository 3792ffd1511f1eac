"""The publisher delivers events signed, at least once, in order per instance, fenced."""

from __future__ import annotations

import hashlib
import hmac
import re
from pathlib import Path

import pytest

from govflow.events.models import Delivery, DeliveryState, Event
from govflow.events.publisher import (
    PUBLISHER,
    Publisher,
    attempt_record,
    deliveries_due,
    events_fan_out,
)
from govflow.events.sending import Attempt
from recovery import api
from tests.dbclock import wait_until_expired
from tests.events.receiver import Receiver
from tests.flows import action, drive, linear, start

pytestmark = pytest.mark.django_db

DOCS = Path(__file__).resolve().parents[2] / "docs" / "integrations.md"


def publish(passes: int = 1, holder: str = "publisher-1") -> dict[str, int]:
    return Publisher(holder=holder).run(standby=False, passes=passes)


def publish_until(condition, *, passes: int = 200) -> None:
    for _ in range(passes):
        if condition():
            return
        publish()
    raise AssertionError("the condition never held")


def documented_verify():
    """The verification example of docs/integrations.md, run as the docs show it."""
    text = DOCS.read_text()
    code = re.search(r"```python\n(# Verifying a GovFlow webhook.*?)```", text, re.S).group(1)
    scope: dict = {}
    exec(compile(code, "docs/integrations.md", "exec"), scope)
    return scope["verify"]


def test_a_receiver_that_fails_first_gets_the_event_again_with_the_same_id(subscribe):
    with Receiver([500, 200]) as receiver:
        subscribe(receiver.url)
        instance = drive(start(linear(action("a"))))
        publish_until(lambda: Delivery.objects.filter(state=DeliveryState.DELIVERED).count() == 2)
        got = receiver.received
    # started failed once (500), then started and completed: three requests, in order.
    assert [r.json["type"] for r in got] == [
        "instance.started",
        "instance.started",
        "instance.completed",
    ]
    assert got[0].event_id == got[1].event_id and got[0].body == got[1].body
    assert [r.headers["GovFlow-Delivery-Attempt"] for r in got] == ["1", "2", "1"]
    started = Event.objects.get(instance_id=instance.pk, type="instance.started")
    assert got[0].event_id == str(started.event_id)
    assert got[0].json == {
        "id": str(started.event_id),
        "type": "instance.started",
        "tenant": "default",
        "instance": instance.pk,
        "seq": 1,
        "occurred_at": got[0].json["occurred_at"],
        "data": started.data,
    }
    delivery = Delivery.objects.get(event=started)
    assert delivery.attempts == 2 and delivery.last_outcome == "HTTP 200"
    assert delivery.delivered_at is not None


def test_the_signature_verifies_with_the_documented_example(subscribe):
    verify = documented_verify()
    with Receiver([204]) as receiver:
        subscription, secret = subscribe(receiver.url)
        drive(start(linear(action("a"))))
        publish_until(lambda: len(receiver.received) == 2)
    request = receiver.received[0]
    headers = request.headers
    expected = hmac.new(
        secret.encode(),
        headers["GovFlow-Timestamp"].encode() + b"." + request.body,
        hashlib.sha256,
    ).hexdigest()
    assert headers["GovFlow-Signature"] == f"v1={expected}"
    now = int(headers["GovFlow-Timestamp"])
    assert verify(secret, headers, request.body, now=now) is True
    assert verify(secret, headers, request.body + b" ", now=now) is False
    assert verify("whsec_other", headers, request.body, now=now) is False
    assert verify(secret, headers, request.body, now=now + 3600) is False  # replayed late
    # The secret is derived, never stored.
    subscription.refresh_from_db()
    assert secret not in str(subscription.__dict__)


def test_a_dead_letter_after_the_budget_holds_the_instances_later_events(settings, subscribe):
    settings.GOVFLOW_WEBHOOK_MAX_ATTEMPTS = 3
    with Receiver([500]) as receiver:
        subscribe(receiver.url)
        instance = drive(start(linear(action("a"))))
        publish_until(lambda: Delivery.objects.filter(state=DeliveryState.DEAD).exists())
        for _ in range(5):
            publish()
        # Only the first event was tried, three times; the completion waits behind it.
        assert [r.json["type"] for r in receiver.received] == ["instance.started"] * 3
    dead = Delivery.objects.get(state=DeliveryState.DEAD)
    assert dead.attempts == 3 and dead.last_outcome == "HTTP 500" and dead.dead_at
    held = Delivery.objects.get(event__type="instance.completed", instance_id=instance.pk)
    assert held.state == DeliveryState.PENDING and held.attempts == 0
    assert deliveries_due() == []


def test_a_timeout_is_a_failed_attempt(settings, subscribe):
    settings.GOVFLOW_WEBHOOK_TIMEOUT = 0.3
    with Receiver([200], delay=1.0) as receiver:
        subscribe(receiver.url)
        start(linear(action("a")))
        publish()
    delivery = Delivery.objects.get()
    assert delivery.state == DeliveryState.PENDING and delivery.attempts == 1
    assert delivery.last_outcome == "timed out after 0.3 s"


def test_events_go_only_to_their_tenants_subscriptions_of_their_types(subscribe):
    with Receiver([200]) as receiver:
        subscribe(receiver.url, tenant="t-one", types=["instance.completed"])
        subscribe(receiver.url, tenant="t-two")
        drive(start(linear(action("a")), tenant="t-one"))
        drive(start(linear(action("a")), tenant="t-three"))
        publish_until(
            lambda: not deliveries_due() and not Event.objects.filter(fanned_out=False).exists()
        )
    assert [(r.json["tenant"], r.json["type"]) for r in receiver.received] == [
        ("t-one", "instance.completed")
    ]


def test_each_instance_is_delivered_in_order(subscribe):
    with Receiver([200]) as receiver:
        subscribe(receiver.url)
        instances = [start(linear(action("a"), action("b"))) for _ in range(3)]
        for instance in instances:
            drive(instance)
        publish_until(lambda: len(receiver.received) == 6)
    for instance in instances:
        seqs = [r.json["seq"] for r in receiver.received if r.json["instance"] == instance.pk]
        assert seqs == [1, 2]


def test_a_stale_publisher_changes_nothing(subscribe):
    with Receiver([200]) as receiver:
        subscribe(receiver.url)
        start(linear(action("a")))
        old = api.lease_acquire(key=PUBLISHER, holder="publisher-old", ttl=0.2)
        wait_until_expired(PUBLISHER)
        api.lease_acquire(key=PUBLISHER, holder="publisher-new", ttl=30)
        with pytest.raises(api.StaleFence):
            events_fan_out(fence=old)
        assert not Delivery.objects.exists()
        assert Event.objects.filter(fanned_out=False).count() == 1
    new = api.lease_current(PUBLISHER).fence
    events_fan_out(fence=new)
    delivery = Delivery.objects.get()
    with pytest.raises(api.StaleFence):
        attempt_record(fence=old, delivery=delivery, result=Attempt(True, "HTTP 200"))
    delivery.refresh_from_db()
    assert delivery.state == DeliveryState.PENDING and delivery.attempts == 0
