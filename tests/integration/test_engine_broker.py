"""GovFlow's broker while instance runs flow (ADR 0039): django-q2's own queue is asked
once per poll interval while claims fill whole batches, and at every dequeue otherwise,
so an ordinary task is never starved by a backlog of instances."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django_q.brokers import get_broker
from django_q.conf import Conf
from django_q.models import OrmQ
from django_q.tasks import async_task

from govflow.engine import broker as broker_module
from govflow.engine.broker import CLAIM_ACK, ClaimBroker
from tests.flows import action, linear, start

pytestmark = pytest.mark.django_db


def dequeued(broker: ClaimBroker) -> tuple[list[str], int]:
    """The ack ids of one dequeue, and how many statements asked django-q2's queue."""
    with CaptureQueriesContext(connection) as captured:
        found = broker.dequeue() or []
    asked = sum(OrmQ._meta.db_table in q["sql"] and "SELECT" in q["sql"] for q in captured)
    return [str(ack) for ack, _ in found], asked


@pytest.fixture
def one_per_batch(monkeypatch) -> ClaimBroker:
    monkeypatch.setattr(broker_module, "claim_batch", lambda: 1)
    monkeypatch.setattr(Conf, "POLL", 0.2)
    broker = get_broker()
    assert isinstance(broker, ClaimBroker)
    return broker


def test_an_ordinary_task_waits_at_most_a_poll_behind_a_backlog(one_per_batch, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(broker_module, "monotonic", lambda: clock[0])
    for i in range(3):
        start(linear(action("a")), {"value": f"v{i}"})
    async_task("math.floor", 2.5)
    acks, asked = dequeued(one_per_batch)
    assert len(acks) == 2 and asked == 1, "the first dequeue looks at the queue too"
    one_per_batch.acknowledge(acks[1])
    acks, asked = dequeued(one_per_batch)
    assert acks[0].startswith(CLAIM_ACK) and len(acks) == 1 and asked == 0, (
        "a full batch of claims within the poll interval: the queue is not asked"
    )
    async_task("math.floor", 3.5)
    clock[0] += Conf.POLL
    acks, asked = dequeued(one_per_batch)
    assert asked == 1 and len(acks) == 2, "asked again once a poll interval has passed"
    assert not acks[1].startswith(CLAIM_ACK)


def test_an_ordinary_task_is_taken_at_once_when_claims_leave_room(one_per_batch):
    dequeued(one_per_batch)  # nothing to do: the queue was just asked
    async_task("math.floor", 2.5)
    acks, asked = dequeued(one_per_batch)
    assert asked == 1 and len(acks) == 1 and not acks[0].startswith(CLAIM_ACK)
    assert OrmQ.objects.get().lock is not None
    acks, _ = dequeued(one_per_batch)
    assert acks == [], "a task taken is locked: not handed out twice"
