"""The demo operator logs in and works from the queue: the right counts, a link followed."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from tests.desk_rows import definitions, make_rows

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[2]


def test_the_demo_operator_sees_the_queue_and_follows_a_link(browser, tmp_path):
    from selenium.webdriver.common.by import By  # installed where the browser fixture runs

    call_command("demo_setup", "--password", "pw-demo", verbosity=0)
    operator = get_user_model().objects.get(username="operator")
    definitions()
    made = make_rows("demo-municipality", 3, requester=operator)
    make_rows("another-town", 4, requester=operator)  # not her tenant: never counted

    browser.log_in("operator", "pw-demo")
    assert browser.path == "/admin/"
    assert browser.title == "Work queue"
    counts = {
        link.get_attribute("data-queue"): int(link.text)
        for link in browser.driver.find_elements(By.CSS_SELECTOR, "#queue-summary a.queue-count")
    }
    assert counts == {
        "unknown": 3,
        "approve": 0,  # an operator approves no decisions
        "batches": 0,  # nor batches of them (bulk triage)
        "requests": 3,
        "approvals": 3,
        "compensations": 0,  # the rows made here have none
        "integrity": 3,
        "incidents": 3,
        "stuck": 3,
        "leases": 3,
        "dead": 3,
        "webhooks": 0,  # no webhook here (tests/events/test_desk_webhooks.py counts them)
    }
    assert "demo-municipality" in browser.shown("#my-tenants")
    screenshot = browser.screenshot(tmp_path / "desk-home.png")
    keep = ROOT / "var" / "screenshots"  # git-ignored: the artefact outlives tmp_path
    keep.mkdir(parents=True, exist_ok=True)
    shutil.copy(screenshot, keep / "desk-home.png")

    oldest = made.instances[0]
    browser.follow(f"Test flow #{oldest.pk}")  # the oldest unknown outcome, listed first
    assert browser.path == f"/admin/engine/instance/{oldest.pk}/change/"
