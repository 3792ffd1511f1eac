"""Two demo approvers in a real browser: one requests and withdraws, then requests again;
the other opens the evidence link and approves (issue 9: decisions that cannot deadlock).
"""

from __future__ import annotations

import io

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from govflow.engine.models import InstanceStatus
from recovery.models import Decision
from tests.flows import drive
from tests.tenancy import bind_tenants

from .test_operator_admin import RATIONALE, blocked_instance

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "pw-demo-logins"


@pytest.fixture
def demo_logins():
    """The logins `make run` creates: operator, approver and approver2, who work for the
    demo tenant; here also for the tests' tenant the blocked instance runs in (ADR 0018)."""
    call_command("demo_setup", password=PASSWORD, stdout=io.StringIO())
    for user in get_user_model().objects.filter(username__in=["operator", "approver", "approver2"]):
        bind_tenants(user, "default")


def request_decision(browser, extract) -> Decision:
    browser.choose("kind", "effect_confirmed")
    browser.fill("rationale", RATIONALE)
    browser.fill("check_store", "the key is in the store")
    browser.attach("evidence", extract)
    browser.press("Request decision")
    return Decision.objects.get(state="requested")


def test_one_approver_withdraws_and_requests_again_and_the_other_approves(
    browser, demo_logins, tmp_path
):
    instance = blocked_instance()
    page = f"/admin/engine/instance/{instance.pk}/change/"
    extract = tmp_path / "store-extract.txt"
    extract.write_text("alpha store: key found, value v1\n")

    first = browser
    first.log_in("approver", PASSWORD)
    first.open(page)
    withdrawn = request_decision(first, extract)
    assert f"Approve decision {withdrawn.pk}" not in first.buttons()
    assert f"Reject decision {withdrawn.pk}" not in first.buttons()
    first.press(f"Withdraw decision {withdrawn.pk}")
    assert any(f"Decision {withdrawn.pk} is withdrawn" in m for m in first.messages())
    assert "Withdrawn by its requester" in first.section("Decisions")
    decision = request_decision(first, extract)
    assert f"Withdraw decision {decision.pk}" in first.buttons()
    first.log_out()

    second = browser  # approver2 at the same desk
    second.log_in("approver2", PASSWORD)
    second.open(page)
    assert f"Withdraw decision {decision.pk}" not in second.buttons()
    # The approver opens the evidence through the checked download view.
    hrefs = [
        e.get_attribute("href")
        for e in second.driver.find_elements("link text", "store-extract.txt")
    ]
    href = next(h for h in hrefs if h.endswith(f"/decision/evidence/{evidence_id(decision)}/"))
    status, disposition, nosniff, body = second.driver.execute_async_script(FETCH, href)
    assert (status, disposition, nosniff) == (
        200,
        'attachment; filename="store-extract.txt"',
        "nosniff",
    )
    assert body == "alpha store: key found, value v1\n"
    second.press(f"Approve decision {decision.pk}")
    assert any(
        f"Decision {decision.pk} (Effect confirmed) is approved" in m for m in second.messages()
    )
    drive(instance)
    second.open(page)
    assert "Status Completed" in second.section("Status")
    decision.refresh_from_db()
    assert (decision.requested_by.username, decision.decided_by.username) == (
        "approver",
        "approver2",
    )
    instance.refresh_from_db()
    assert instance.status == InstanceStatus.COMPLETED


def evidence_id(decision: Decision) -> int:
    return decision.evidence.get().pk


# Fetch a URL in the browser's own session and hand back what a download would get.
FETCH = """
const done = arguments[arguments.length - 1];
fetch(arguments[0]).then(r => r.text().then(t => done([
  r.status, r.headers.get('content-disposition'), r.headers.get('x-content-type-options'), t
])));
"""
