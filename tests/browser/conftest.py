"""Fixtures for browser tests: a live server, Debian's Chromium and operators who log in.

Without Chromium, chromedriver or selenium the tests skip and say why; in CI (``CI`` set)
they fail instead, so a broken CI image cannot pass by running nothing.
"""

from __future__ import annotations

import os

import pytest
from django.contrib.auth.models import Permission

from tests.tenancy import bind_tenants

from .chromium import Browser, missing


@pytest.fixture
def browser(live_server, tmp_path, monkeypatch):
    """A fresh Chromium profile against the live server, closed at the end."""
    reason = missing()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    from selenium.webdriver.common.selenium_manager import SeleniumManager

    def no_selenium_manager(self, args):
        raise AssertionError(f"Selenium Manager was invoked ({args}); it may download a browser")

    # Belt and braces: the explicit paths in Browser already keep it from running.
    monkeypatch.setattr(SeleniumManager, "binary_paths", no_selenium_manager)
    browser = Browser(live_server.url, tmp_path / "chromium-profile")
    yield browser
    browser.quit()


def make_user(django_user_model, username: str, *perms: str):
    """A staff user with ``perms`` whose password is ``pw-<username>``."""
    user = django_user_model.objects.create_user(
        username=username, password=f"pw-{username}", is_staff=True
    )
    bind_tenants(user)
    for perm in perms:
        app_label, codename = perm.split(".")
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label=app_label, codename=codename)
        )
    return user


OPERATOR_PERMS = (
    "engine.view_definition",
    "engine.publish_definition",
    "engine.view_instance",
    "engine.start_instance",
    "engine.operate_instance",
    "engine.view_token",
    "recovery.view_operation",
    "recovery.view_decision",
    "recovery.request_decision",
    "recovery.approve_decision",
)


@pytest.fixture
def operator(django_user_model):
    """Olga runs the engine desk: publishes, starts, operates and requests decisions."""
    return make_user(django_user_model, "olga", *OPERATOR_PERMS)


@pytest.fixture
def checker(django_user_model):
    """Carl is the second pair of eyes: he may view instances and approve decisions."""
    return make_user(django_user_model, "carl", "engine.view_instance", "recovery.approve_decision")
