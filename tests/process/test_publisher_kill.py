"""kill -9 the publisher (a real ``qcluster``) mid-delivery: the event comes again, same id.

The receiving server holds the first request open; the test kills the whole cluster while
it waits, so the attempt's outcome was never recorded. A second cluster takes the
publisher's lease over (its holder's liveness lock is free) and delivers the event again
with the same ``GovFlow-Event-Id`` — at least once — then the instance's later events,
in order.
"""

from __future__ import annotations

import pytest

from govflow.engine.services.definitions import definition_publish
from govflow.engine.services.instances import instance_start
from govflow.events.models import Delivery, DeliveryState, Event
from govflow.events.services import subscription_create
from tests.events.receiver import Receiver
from tests.flows import action, linear

from .support import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

PUBLISHER = {
    "GOVFLOW_PUBLISHER_LEASE_TTL": "10",
    "GOVFLOW_WEBHOOK_TIMEOUT": "5",
    "GOVFLOW_PUBLISHER_TICK": "0.1",
}


def test_a_publisher_killed_mid_delivery_is_replaced_and_the_event_sent_again(workspace):
    ws = workspace
    with Receiver([200]) as receiver:
        receiver.hold = True
        made = subscription_create(name="Case system", url=receiver.url, tenant="default")
        document = linear(action("a"), key="tests.outbox_kill")
        instance = instance_start(
            definition=definition_publish(document=document), variables={"value": "v1"}
        )
        ws.watch(instance.pk)
        started = Event.objects.get(instance_id=instance.pk, type="instance.started")

        first = ws.start_cluster(**PUBLISHER)
        wait_for(
            receiver.held.is_set,
            timeout=60,
            what="the publisher's first request to reach the receiver",
            explain=first.log_tail,
        )
        assert receiver.received[0].event_id == str(started.event_id)
        # The instance ends on the first cluster while its publisher waits: killing it in
        # the middle of the step would leave an unknown outcome, not what this test is about.
        wait_for(
            lambda: Event.objects.filter(
                instance_id=instance.pk, type="instance.completed"
            ).exists(),
            timeout=60,
            what="the instance to complete on the first cluster",
            explain=first.log_tail,
        )
        first.kill()  # mid-delivery: the receiver has not answered yet
        delivery = Delivery.objects.get(event=started, subscription=made.subscription)
        assert delivery.state == DeliveryState.PENDING and delivery.attempts == 0

        receiver.hold = False
        receiver.release.set()
        second = ws.start_cluster(**PUBLISHER)
        wait_for(
            lambda: (
                Delivery.objects.filter(
                    subscription=made.subscription, state=DeliveryState.DELIVERED
                ).count()
                == 2
            ),
            timeout=60,
            what="the started and completed events to be delivered by the second cluster",
            explain=second.log_tail,
        )
    ids = [r.event_id for r in receiver.received]
    assert ids.count(str(started.event_id)) == 2, ids  # sent again, with the same id
    assert receiver.received[0].body == receiver.received[1].body
    types = [r.json["type"] for r in receiver.received]
    assert types == ["instance.started", "instance.started", "instance.completed"]
    delivery.refresh_from_db()
    assert delivery.state == DeliveryState.DELIVERED and delivery.attempts == 1
