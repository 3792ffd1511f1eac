"""Webhooks on the desk: registered with the secret shown once, dead letters listed in the
work queue and delivered again by a permitted operator (POST only), per tenant."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Group, Permission
from django.test import Client
from django.urls import reverse

from govflow.engine.tenancy import tenant_group_name
from govflow.events.models import Delivery, DeliveryState, Subscription
from govflow.events.signing import secret_of
from tests.events.receiver import Receiver
from tests.events.test_publisher import publish_until
from tests.flows import action, drive, linear, start
from tests.identity import verified_login

pytestmark = pytest.mark.django_db
HOME = reverse("admin:index")


def member(django_user_model, username: str, *perms: str, tenant: str = "north", role=None):
    user = django_user_model.objects.create_user(username=username, password="pw", is_staff=True)
    if role:
        user.groups.add(Group.objects.get(name=role))
    user.groups.add(Group.objects.get_or_create(name=tenant_group_name(tenant))[0])
    codenames = [p.split(".")[1] for p in perms]
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    return verified_login(Client(), django_user_model.objects.get(pk=user.pk))


def dead_letter(settings, subscribe, receiver, tenant: str = "north"):
    """An instance of ``tenant`` whose first event is a dead letter for a subscription."""
    settings.GOVFLOW_WEBHOOK_MAX_ATTEMPTS = 2
    subscribe(receiver.url, tenant=tenant)
    instance = drive(start(linear(action("a")), tenant=tenant))
    publish_until(lambda: Delivery.objects.filter(state=DeliveryState.DEAD).exists())
    return instance, Delivery.objects.get(state=DeliveryState.DEAD)


def test_a_dead_letter_is_in_my_queue_and_delivered_again_in_order(
    django_user_model, settings, subscribe
):
    with Receiver([500, 500, 200]) as receiver:
        _, dead = dead_letter(settings, subscribe, receiver)
        olga = member(django_user_model, "olga", role="Operator")
        home = olga.get(HOME).content.decode()
        found = re.search(r'data-queue="webhooks" href="[^"]*">(\d+)</a>', home)
        assert found and found.group(1) == "1"
        page = reverse("admin:events_delivery_change", args=[dead.pk])
        assert page in home
        shown = olga.get(page).content.decode()
        assert "Deliver again" in shown and "HTTP 500" in shown
        again = reverse("admin:events_delivery_redeliver", args=[dead.pk])
        assert olga.get(again)["Location"] == page  # a GET goes back, never a bare 405
        response = olga.post(again, follow=True)
        assert "will be delivered again shortly" in response.content.decode()
        dead.refresh_from_db()
        assert dead.state == DeliveryState.PENDING and dead.attempts == 0
        publish_until(lambda: len(receiver.received) == 4)
    types = [r.json["type"] for r in receiver.received]
    assert types == ["instance.started"] * 3 + ["instance.completed"]
    assert len({r.event_id for r in receiver.received[:3]}) == 1  # the same event id
    dead.refresh_from_db()
    assert dead.state == DeliveryState.DELIVERED and dead.redelivered_by.username == "olga"


def test_without_the_permission_nothing_is_delivered_again(django_user_model, settings, subscribe):
    with Receiver([500]) as receiver:
        _, dead = dead_letter(settings, subscribe, receiver)
        viewer = member(django_user_model, "vera", "events.view_delivery")
        page = reverse("admin:events_delivery_change", args=[dead.pk])
        assert "Deliver again" not in viewer.get(page).content.decode()
        response = viewer.post(reverse("admin:events_delivery_redeliver", args=[dead.pk]))
        assert response.status_code == 403
    dead.refresh_from_db()
    assert dead.state == DeliveryState.DEAD and dead.attempts == 2


def test_another_tenants_dead_letters_are_neither_counted_nor_reachable(
    django_user_model, settings, subscribe
):
    with Receiver([500]) as receiver:
        _, dead = dead_letter(settings, subscribe, receiver, tenant="south")
        olga = member(django_user_model, "olga", role="Operator")
        home = olga.get(HOME).content.decode()
        assert re.search(r'data-queue="webhooks" href="[^"]*">0</a>', home)
        again = reverse("admin:events_delivery_redeliver", args=[dead.pk])
        assert olga.post(again).status_code == 404
    dead.refresh_from_db()
    assert dead.state == DeliveryState.DEAD


def test_registering_on_the_desk_shows_the_secret_once(django_user_model, settings):
    admin = member(django_user_model, "ada", "events.add_subscription", "events.view_subscription")
    add = reverse("admin:events_subscription_add")
    settings.GOVFLOW_WEBHOOK_ALLOW_PRIVATE = False
    refused = admin.post(
        add, {"name": "Case system", "url": "https://10.0.0.5/in", "tenant": "north"}
    )
    assert refused.status_code == 200
    assert "non-public address" in refused.content.decode()
    assert not Subscription.objects.exists()
    settings.GOVFLOW_WEBHOOK_ALLOW_PRIVATE = True
    response = admin.post(
        add,
        {
            "name": "Case system",
            "url": "https://127.0.0.1/in",
            "tenant": "north",
            "event_types": ["instance.completed", "handoff.opened"],
        },
    )
    assert response.status_code == 200 and "no-store" in response["Cache-Control"]
    subscription = Subscription.objects.get()
    secret = secret_of(subscription.secret_salt, subscription.secret_key_id)
    assert secret in response.content.decode()
    assert subscription.event_types == ["handoff.opened", "instance.completed"]
    assert subscription.created_by.username == "ada"
    # The page of the subscription never shows it again.
    page = admin.get(reverse("admin:events_subscription_change", args=[subscription.pk]))
    assert page.status_code == 200 and secret not in page.content.decode()
    # A tenant the user does not work for is not offered.
    other = admin.post(add, {"name": "x", "url": "https://127.0.0.1/in", "tenant": "south"})
    assert other.status_code == 200 and Subscription.objects.count() == 1


def test_the_desk_speaks_german_about_webhooks(django_user_model, settings, subscribe):
    with Receiver([500]) as receiver:
        _, dead = dead_letter(settings, subscribe, receiver)
        olga = member(django_user_model, "olga", role="Operator")
        olga.cookies["django_language"] = "de"
        home = olga.get(HOME).content.decode()
        assert "Unzustellbare Webhook-Ereignisse" in home
        page = olga.get(reverse("admin:events_delivery_change", args=[dead.pk]))
        assert "Erneut zustellen" in page.content.decode()
