"""The outbox's write path besides events: subscriptions and dead letters delivered again.

Keyword-only services with an explicit ``actor``; each owns its commit. An API key's
scope is checked by the API, which passes ``actor=None`` and the key's prefix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models.functions import Now

from recovery.api import ConflictError, RecoveryValidationError

from .models import Delivery, DeliveryState, EventType, Subscription
from .signing import new_salt, secret_of
from .webhooks import url_check

__all__ = [
    "DeliveryConflict",
    "SubscriptionCreated",
    "SubscriptionRefused",
    "delivery_redeliver",
    "subscription_create",
    "subscription_rotate_secret",
    "subscription_set_active",
]

MANAGE = "events.change_subscription"
REDELIVER = "events.redeliver_delivery"


class SubscriptionRefused(RecoveryValidationError):
    """A subscription that cannot be made as asked; nothing was recorded."""

    def __init__(self, message: str, *, field: str = "") -> None:
        super().__init__(message)
        self.field = field


class DeliveryConflict(ConflictError):
    """The delivery is not (or no longer) a dead letter."""


@dataclass(frozen=True)
class SubscriptionCreated:
    subscription: Subscription
    secret: str
    """The signing secret: shown to its creator once, never stored."""


def _require(actor, perm: str, doing: str) -> None:
    if actor is not None and not actor.has_perm(perm):
        raise PermissionDenied(f"{actor} may not {doing}: the permission {perm!r} is required.")


def _admitted(name: str, url: str, tenant: str, event_types: Sequence[str]) -> list[str]:
    if not isinstance(name, str) or not name.strip() or len(name) > 100:
        raise SubscriptionRefused(
            "Give the subscription a name of 1 to 100 characters.", field="name"
        )
    if not isinstance(tenant, str) or not tenant.strip() or len(tenant) > 100:
        raise SubscriptionRefused("Name the tenant (1 to 100 characters).", field="tenant")
    if any("\x00" in text for text in (name, tenant)):
        raise SubscriptionRefused("Names cannot hold U+0000.", field="name")
    unknown = [t for t in event_types if t not in EventType.values]
    if unknown:
        raise SubscriptionRefused(
            f"Unknown event type(s) {', '.join(map(repr, unknown))}: the types are "
            f"{', '.join(EventType.values)} (none: every type).",
            field="event_types",
        )
    try:
        url_check(url)
    except RecoveryValidationError as exc:
        raise SubscriptionRefused(str(exc), field="url") from None
    return sorted(set(event_types))


def subscription_create(
    *,
    name: str,
    url: str,
    tenant: str,
    event_types: Sequence[str] = (),
    actor=None,
    api_key: str = "",
) -> SubscriptionCreated:
    """Register a webhook for ``tenant``'s events; the secret comes back once.

    The URL is checked (``webhooks.url_check``: scheme, public addresses) before anything
    is recorded; a refusal says what is wrong and records nothing.
    """
    _require(actor, "events.add_subscription", "register webhooks")
    types = _admitted(name, url, tenant, list(event_types))
    salt, key_id = new_salt()
    with transaction.atomic():
        subscription = Subscription.objects.create(
            name=name.strip(),
            url=url,
            tenant=tenant,
            event_types=types,
            secret_salt=salt,
            secret_key_id=key_id,
            created_at=Now(),
            created_by=actor if getattr(actor, "_meta", None) else None,
            created_by_key=api_key,
        )
    subscription.refresh_from_db()
    return SubscriptionCreated(subscription, secret_of(salt, key_id))


def subscription_set_active(*, subscription_id: int, active: bool, actor=None) -> Subscription:
    """Pause or resume a subscription. Its pending deliveries wait while it is paused."""
    _require(actor, MANAGE, "change webhooks")
    with transaction.atomic():
        Subscription.objects.filter(pk=subscription_id).update(active=active)
    return Subscription.objects.get(pk=subscription_id)


def subscription_rotate_secret(*, subscription_id: int, actor=None) -> SubscriptionCreated:
    """Give a subscription a new signing secret (shown once); the old one stops at once."""
    _require(actor, MANAGE, "change webhooks")
    salt, key_id = new_salt()
    with transaction.atomic():
        Subscription.objects.filter(pk=subscription_id).update(
            secret_salt=salt, secret_key_id=key_id
        )
    subscription = Subscription.objects.get(pk=subscription_id)
    return SubscriptionCreated(subscription, secret_of(salt, key_id))


def delivery_redeliver(*, delivery_id: int, actor) -> Delivery:
    """Deliver a dead letter again: pending now, with a fresh budget (the same event id).

    Conditional on its still being dead: two operators pressing at once deliver it once.
    The instance's later events for the subscription, held behind it, follow in order.
    """
    if actor is None or not actor.has_perm(REDELIVER):
        raise PermissionDenied(
            f"{actor} may not deliver webhook events again: the permission {REDELIVER!r} "
            "is required."
        )
    with transaction.atomic():
        changed = Delivery.objects.filter(pk=delivery_id, state=DeliveryState.DEAD).update(
            state=DeliveryState.PENDING,
            attempts=0,
            next_attempt_at=Now(),
            dead_at=None,
            redelivered_by=actor,
            updated_at=Now(),
        )
    if changed != 1:
        raise DeliveryConflict(
            f"Delivery {delivery_id} is not a dead letter (any more): it was delivered "
            "again already, or it never failed for good. Nothing was changed."
        )
    return Delivery.objects.get(pk=delivery_id)
