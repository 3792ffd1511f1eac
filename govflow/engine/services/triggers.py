"""Trigger messages: deduplicated by delivery id, consumed under their own fence."""

from __future__ import annotations

import json
from typing import Any

from django.db import IntegrityError, transaction

from recovery.api import (
    Fence,
    LeaseHeld,
    StaleFence,
    canonical_bytes,
    fenced_update,
    lease_acquire,
    lease_release_if_held,
)

from ..conf import delivery_lease_ttl
from ..db import clock
from ..errors import EngineConflict, InvalidRequest
from ..limits import admit_json, admit_text, payload_max_bytes
from ..liveness import worker_name
from ..models import DeliveryState, Token, TokenState, TriggerDelivery, WaitKind
from ..queue import instance_mark_runnable
from ..waitkeys import WAIT_KEY_MAX, message_key

__all__ = ["delivery_consume", "delivery_take", "trigger_deliver"]


def trigger_deliver(
    *,
    message: str,
    correlation: str,
    delivery_id: str,
    payload: dict[str, Any] | None = None,
    tenant: str = "",
) -> TriggerDelivery:
    """Record a message and hand it to the instance waiting for it (or keep it buffered).

    ``tenant`` names whose steps may take the message; a message is never handed to
    another tenant's step, now or when one begins to wait. Empty: any tenant's (for
    trusted code in this process; the REST API always names one).

    Delivering the same ``delivery_id`` again is a no-op that returns the first delivery;
    the same id with different content (or tenant) is refused. Owns its commits: the delivery is
    recorded in one, and handed over in another (:func:`delivery_consume`).
    """
    payload = {} if payload is None else payload
    for name, value in (
        ("message", message),
        ("correlation", correlation),
        ("delivery_id", delivery_id),
    ):
        admit_text(value, name=name, max_length=200)
    _refuse_unkeyable(message, correlation)
    if not isinstance(payload, dict):
        raise InvalidRequest("payload must be a JSON object.")
    body = admit_json(payload, what="payload is malformed", max_bytes=payload_max_bytes())
    if tenant:
        admit_text(tenant, name="tenant", max_length=100)
    try:
        with transaction.atomic():
            delivery = TriggerDelivery.objects.create(
                delivery_id=delivery_id,
                tenant=tenant,
                message=message,
                correlation=correlation,
                payload=payload,
                received_at=clock(),
            )
    except IntegrityError:
        delivery = TriggerDelivery.objects.get(delivery_id=delivery_id)
        same = (
            delivery.tenant,
            delivery.message,
            delivery.correlation,
            canonical_bytes(delivery.payload),
        ) == (tenant, message, correlation, body)
        if not same:
            raise EngineConflict(
                f"Delivery id {delivery_id!r} was already used for a different message. "
                "Delivery ids identify one message; use a new id for a new message."
            ) from None
        return delivery
    delivery_consume(delivery_id=delivery.pk)
    delivery.refresh_from_db()
    return delivery


def delivery_consume(*, delivery_id: int) -> bool:
    """Hand a received delivery to its waiting token, under the delivery's own lease.

    Owns its commits (the lease's, and the hand-over's). Returns whether it handed it over.
    """
    try:
        fence = lease_acquire(
            key=f"trigger:{delivery_id}", holder=worker_name(), ttl=delivery_lease_ttl()
        )
    except LeaseHeld:
        return False
    try:
        return _consume(delivery_id, fence)
    except StaleFence:
        # This consumer's lease lapsed mid-way: it changed nothing, and the delivery stays
        # received for the next consumer (the sweep retries buffered deliveries).
        return False
    finally:
        lease_release_if_held(fence=fence)


def _refuse_unkeyable(message: str, correlation: str) -> None:
    if message_key(message, correlation) is None:
        raise InvalidRequest(
            f"message and correlation together are too long ({len(message)} + "
            f"{len(correlation)} characters): no step can wait for them. A waiting step's "
            f"message name and correlation value fit in {WAIT_KEY_MAX - 1} characters "
            "(a ':' or '\\' in the name counts twice)."
        )


def _consume(delivery_id: int, fence) -> bool:
    """Hand the delivery over with conditional writes on ``fence`` (its own lease).

    Owns its commit: the token readied, the delivery consumed and the instance queued.
    """
    delivery = TriggerDelivery.objects.get(pk=delivery_id)
    if delivery.state != DeliveryState.RECEIVED:
        return False
    wait_key = message_key(delivery.message, delivery.correlation)
    if wait_key is None:
        return False  # no step can wait under so long a key (routing refuses it)
    waiting = Token.objects.filter(
        state=TokenState.WAITING, wait_kind=WaitKind.TRIGGER, wait_key=wait_key
    )
    if delivery.tenant:
        waiting = waiting.filter(instance__tenant=delivery.tenant)
    token = waiting.order_by("created_at", "pk").first()
    if token is None:
        return False  # buffered until an instance waits for it
    with transaction.atomic():
        moved = fenced_update(
            Token.objects.filter(pk=token.pk, state=TokenState.WAITING),
            fence=fence,
            state=TokenState.READY,
            payload=delivery.payload,
            updated_at=clock(),
        )
        if moved != 1:
            return False
        taken = fenced_update(
            TriggerDelivery.objects.filter(pk=delivery.pk, state=DeliveryState.RECEIVED),
            fence=fence,
            state=DeliveryState.CONSUMED,
            token_id=token.pk,
            consumer_fence=fence.fence,
            consumed_at=clock(),
        )
        if taken != 1:
            transaction.set_rollback(True)
            return False
        instance_mark_runnable(token.instance_id)
    return True


def delivery_take(*, delivery: TriggerDelivery, token: Token, fence: Fence) -> dict | None:
    """Mark a buffered delivery consumed by ``token``, which just began to wait for it.

    Conditional on the delivery still being received and on ``fence`` (the instance's):
    returns the payload for the token, or None when someone else took the message first.
    Needs the caller's commit; the caller readies the token in it.
    """
    taken = fenced_update(
        TriggerDelivery.objects.filter(pk=delivery.pk, state=DeliveryState.RECEIVED),
        fence=fence,
        state=DeliveryState.CONSUMED,
        token_id=token.pk,
        consumer_fence=fence.fence,
        consumed_at=clock(),
    )
    if taken != 1:
        return None
    return json.loads(json.dumps(delivery.payload))
