"""Webhook subscriptions: URLs GovFlow will call, secrets shown once, nothing kept on refusal."""

from __future__ import annotations

import socket

import pytest
from django.core.exceptions import PermissionDenied

from govflow.events.models import Subscription
from govflow.events.services import (
    SubscriptionRefused,
    subscription_create,
    subscription_rotate_secret,
)
from govflow.events.signing import secret_of

pytestmark = pytest.mark.django_db


@pytest.fixture
def production_rules(settings, monkeypatch):
    """No http, no private addresses; names resolve as a test's table says."""
    settings.GOVFLOW_WEBHOOK_ALLOW_HTTP = False
    settings.GOVFLOW_WEBHOOK_ALLOW_PRIVATE = False
    table = {
        "hooks.example.org": ["93.184.216.34"],
        "intranet.example.org": ["10.1.2.3"],
        "mixed.example.org": ["93.184.216.34", "192.168.0.7"],
        "localhost": ["127.0.0.1", "::1"],
    }

    def resolve(host, port, *args, **kwargs):
        if host not in table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port)) for a in table[host]]

    monkeypatch.setattr(socket, "getaddrinfo", resolve)


def create(url: str):
    return subscription_create(name="Case system", url=url, tenant="t-one")


@pytest.mark.parametrize(
    ("url", "says"),
    [
        (
            "http://hooks.example.org/in",
            "https:// only (http:// only where GOVFLOW_WEBHOOK_ALLOW_HTTP",
        ),
        ("ftp://hooks.example.org/in", "scheme is 'ftp'"),
        ("hooks.example.org/in", "scheme is 'missing'"),
        ("https:///in", "names no host"),
        ("https://user:pw@hooks.example.org/in", "user name or password"),
        ("https://127.0.0.1/in", "resolves to 127.0.0.1, a loopback, private, link-local"),
        ("https://[::1]/in", "resolves to ::1"),
        ("https://localhost:8443/in", "resolves to 127.0.0.1"),
        ("https://10.0.0.5/in", "resolves to 10.0.0.5"),
        ("https://169.254.169.254/latest/meta-data", "resolves to 169.254.169.254"),
        ("https://[::ffff:192.168.1.1]/in", "resolves to 192.168.1.1"),
        ("https://intranet.example.org/in", "resolves to 10.1.2.3"),
        ("https://mixed.example.org/in", "resolves to 192.168.0.7"),
        ("https://nowhere.invalid/in", "could not be resolved"),
        ("https://hooks.example.org/in put", "spaces or control characters"),
        ("https://hooks.example.org:99999/", "cannot be read"),
    ],
)
def test_a_bad_url_is_refused_with_what_to_do_and_nothing_recorded(production_rules, url, says):
    with pytest.raises(SubscriptionRefused) as refused:
        create(url)
    assert says in str(refused.value)
    assert refused.value.field == "url"
    assert not Subscription.objects.exists()


def test_a_public_https_url_is_taken(production_rules):
    made = create("https://hooks.example.org/in")
    assert made.subscription.url == "https://hooks.example.org/in"
    assert Subscription.objects.count() == 1


def test_development_settings_allow_http_and_this_machine(settings):
    settings.GOVFLOW_WEBHOOK_ALLOW_HTTP = True
    settings.GOVFLOW_WEBHOOK_ALLOW_PRIVATE = True
    assert create("http://127.0.0.1:8001/hook").subscription.pk


def test_unknown_event_types_and_empty_names_are_refused():
    with pytest.raises(SubscriptionRefused, match="Unknown event type"):
        subscription_create(
            name="x", url="https://127.0.0.1/", tenant="t", event_types=["instance.exploded"]
        )
    with pytest.raises(SubscriptionRefused, match="name"):
        subscription_create(name=" ", url="https://127.0.0.1/", tenant="t")
    assert not Subscription.objects.exists()


def test_the_secret_is_derived_not_stored_and_rotation_replaces_it(settings):
    made = create("https://127.0.0.1/hook")
    stored = Subscription.objects.filter(pk=made.subscription.pk).values().get()
    assert made.secret.startswith("whsec_")
    assert made.secret not in repr(stored)
    assert secret_of(stored["secret_salt"], stored["secret_key_id"]) == made.secret
    rotated = subscription_rotate_secret(subscription_id=made.subscription.pk)
    assert rotated.secret != made.secret


def test_secrets_follow_their_key_through_a_key_rotation(settings):
    settings.GOVFLOW_WEBHOOK_KEYS = "k1:" + "aa" * 32
    made = create("https://127.0.0.1/hook")
    assert made.subscription.secret_key_id == "k1"
    settings.GOVFLOW_WEBHOOK_KEYS = "k2:" + "bb" * 32 + ",k1:" + "aa" * 32
    sub = made.subscription
    assert secret_of(sub.secret_salt, sub.secret_key_id) == made.secret
    assert create("https://127.0.0.1/other").subscription.secret_key_id == "k2"


def test_a_user_without_the_permission_cannot_register(django_user_model):
    user = django_user_model.objects.create_user(username="clerk", password="x")
    with pytest.raises(PermissionDenied, match=r"events\.add_subscription"):
        subscription_create(name="x", url="https://127.0.0.1/", tenant="t", actor=user)
    assert not Subscription.objects.exists()
