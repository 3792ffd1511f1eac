"""Fixtures of the outbox's tests: quick retries, a subscription to a local receiver."""

from __future__ import annotations

import pytest

from govflow.events.services import subscription_create


@pytest.fixture(autouse=True)
def quick_retries(settings):
    settings.GOVFLOW_WEBHOOK_RETRY_BASE = 0.05
    settings.GOVFLOW_WEBHOOK_RETRY_MAX = 0.2
    settings.GOVFLOW_PUBLISHER_TICK = 0.02
    settings.GOVFLOW_WEBHOOK_TIMEOUT = 2


@pytest.fixture
def subscribe():
    """Subscribe a receiver's URL to a tenant's events; returns (subscription, secret)."""

    def make(url: str, tenant: str = "default", types=()):
        made = subscription_create(name="Case system", url=url, tenant=tenant, event_types=types)
        return made.subscription, made.secret

    return make
