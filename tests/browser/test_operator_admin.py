"""The operators' admin in a real browser: log in, publish, start, and resolve an unknown outcome.

What the integration tests check through the test client, these check on screen: the
forms render and submit in Chromium (file inputs, radio buttons, CSRF, redirects), and the
operator reads the outcome in the page's banners and sections.
"""

from __future__ import annotations

import json

import pytest

from govflow.engine.models import Definition, Instance, InstanceStatus, TokenState
from govflow.engine.services.definitions import definition_publish
from recovery.models import Decision
from tests.flows import action, drive, linear, start
from tests.providers.alpha import effects
from tests.tenancy import bind_only

pytestmark = pytest.mark.django_db(transaction=True)

CHECK_INSTRUCTION = "Look the idempotency key up in the alpha effect store."
RATIONALE = "The alpha store holds the record under this idempotency key."


def test_an_operator_logs_in_and_sees_the_work_queue(browser, operator):
    browser.log_in("olga", "wrong password")
    assert browser.path.startswith("/admin/login/")
    assert any("Please enter the correct username and password" in e for e in browser.errors())

    browser.log_in("olga", "pw-olga")
    assert browser.path == "/admin/"
    assert "GovFlow administration" in browser.text
    # Issue 10: the home is the work queue, no longer the list of tables.
    assert browser.title == "Work queue"
    summary = browser.shown("#queue-summary")
    assert "Outcome unknown" in summary and "Failed or blocked instances" in summary
    assert any(s.endswith("/static/admin/css/base.css") for s in browser.stylesheets())
    assert "welcome, olga" in browser.text.lower()  # the admin shows it in capitals
    browser.open("/admin/engine/")  # the stock app page is still there for her tables
    engine = browser.shown(".app-engine")
    assert "WORKFLOW ENGINE" in engine and "Definitions" in engine and "Instances" in engine


def test_a_definition_file_is_uploaded_and_listed_and_a_bad_one_shows_its_problems(
    browser, operator, tmp_path
):
    good = tmp_path / "permit.json"
    good.write_text(json.dumps(linear(action("write"), key="tests.browser_upload", version=1)))
    broken = linear(action("write", name="alpha.nope"), key="tests.browser_bad", version=1)
    broken["title"] = ""
    bad = tmp_path / "broken.json"
    bad.write_text(json.dumps(broken))
    browser.log_in("olga", "pw-olga")

    browser.open("/admin/engine/definition/")
    browser.follow("Upload definition")
    browser.attach("file", bad)
    browser.press("Publish")
    assert "The definition was not published: 2 problems" in browser.text
    problems = browser.errors()
    assert any("'title' must be a non-empty string" in p for p in problems)
    assert any("no installed provider registers action 'alpha.nope'" in p for p in problems)
    assert not Definition.objects.exists()

    browser.attach("file", good)
    browser.press("Publish")
    definition = Definition.objects.get()
    assert browser.path == f"/admin/engine/definition/{definition.pk}/change/"
    # casefold: the admin's message template capitalises the first letter (of the key).
    published = f"{definition} is published (fingerprint {definition.fingerprint[:12]}".casefold()
    assert [m for m in browser.messages() if m.casefold().startswith(published)]
    assert "Yes: every action it names is registered." in browser.text
    assert '"action": "alpha.write"' in browser.text
    assert "permit.json" in browser.text  # the source file is recorded

    browser.open("/admin/engine/definition/")
    listing = browser.shown("#result_list")
    assert "tests.browser_upload" in listing
    assert definition.fingerprint[:12] in listing
    assert "tests.browser_bad" not in listing


def test_an_instance_is_started_from_the_start_page_and_shown_with_its_steps(browser, operator):
    bind_only(operator, "default", "city-hall")  # the tenants the start form offers her
    definition = definition_publish(
        document=linear(
            action("write"),
            key="tests.browser_start",
            version=1,
            variables_schema={"type": "object", "properties": {"value": {"type": "string"}}},
        )
    )
    browser.log_in("olga", "pw-olga")
    browser.open("/admin/engine/instance/")
    browser.follow("Start instance")
    browser.select("definition", "Test flow (tests.browser_start v1)")
    browser.press("Continue")
    # The schema is a form (one text field), or JSON text when asked for.
    browser.follow("Enter the variables as JSON instead")
    browser.select("tenant", "city-hall")
    browser.fill("variables", '{"value": 7}')
    browser.press("Start instance")
    assert any("7 is not of type 'string'" in e for e in browser.errors())
    assert not Instance.objects.exists()

    browser.fill("variables", '{"value": "v7"}')
    browser.press("Start instance")
    instance = Instance.objects.get()
    assert instance.definition == definition
    # Words, not ids: the definition's title and the instance's number.
    assert any(f"Started Test flow #{instance.pk};" in m for m in browser.messages())

    browser.open("/admin/engine/instance/")
    assert "city-hall" in browser.shown("#result_list")
    browser.follow(f"Test flow #{instance.pk}")
    assert browser.title == f"Test flow #{instance.pk}"
    status = browser.section("Status")
    assert "Status Running" in status and "Tenant city-hall" in status
    assert "Started by olga" in status
    assert "value v7" in browser.section("Variables")
    steps = browser.section("Steps")
    assert "start" in steps and "Ready" in steps
    assert "Cancel instance" in browser.buttons()


def blocked_instance() -> Instance:
    """An instance whose only step raised after dispatch: its outcome is unknown."""
    effects.SCRIPT["alpha.write"] = ["raise_after"]
    instance = drive(start(linear(action("write"))))
    assert instance.status == InstanceStatus.BLOCKED
    assert instance.tokens.get(node_id="write").state == TokenState.OUTCOME_UNKNOWN
    return instance


def test_an_unknown_outcome_is_resolved_by_a_decision_with_evidence_and_a_second_person(
    browser, operator, checker, tmp_path
):
    instance = blocked_instance()
    page = f"/admin/engine/instance/{instance.pk}/change/"
    extract = tmp_path / "store-extract.txt"
    extract.write_text("alpha store: key found, value v1\n")
    olga = browser
    olga.log_in("olga", "pw-olga")
    olga.open(page)

    assert "Status Blocked" in olga.section("Status")
    step = olga.section("Step 'write'")
    assert "Outcome unknown" in step and "Retry is unavailable" in step
    assert not [b for b in olga.buttons() if b.startswith("Retry step")]
    assert CHECK_INSTRUCTION in step

    # Without evidence the request is refused on its own form, keeping what was typed.
    olga.choose("kind", "effect_confirmed")
    olga.fill("rationale", RATIONALE)
    olga.fill("check_store", "the key is in the store")
    olga.press("Request decision")
    assert any("needs at least one evidence file" in e for e in olga.errors())
    assert olga.value("rationale") == RATIONALE
    assert not Decision.objects.exists()

    olga.attach("evidence", extract)
    olga.press("Request decision")
    decision = Decision.objects.get()
    assert any(
        f"Decision {decision.pk} (Effect confirmed) is requested" in m for m in olga.messages()
    )
    assert "awaiting approval" in olga.section("Step 'write'")
    decisions = olga.section("Decisions")
    assert f"Decision {decision.pk}: Effect confirmed — Awaiting approval" in decisions
    assert "store-extract.txt (text/plain" in decisions
    assert "store: the key is in the store" in decisions

    # The requester may approve decisions in general, but not this one: hers. She is not
    # offered Approve/Reject on it (issue 9), only Withdraw.
    assert f"Approve decision {decision.pk}" not in olga.buttons()
    assert f"Withdraw decision {decision.pk}" in olga.buttons()
    assert "You requested this decision: a second person" in olga.section("Decisions")
    olga.screenshot(tmp_path / "own-decision.png")
    assert "Outcome unknown" in olga.section("Steps")
    decision.refresh_from_db()
    assert decision.state == "requested"
    olga.log_out()
    assert "Logged out" in olga.text

    carl = browser  # the next person at the same desk
    carl.log_in("carl", "pw-carl")
    carl.open(page)
    assert "Request decision" not in carl.buttons()  # Carl may approve, not operate
    carl.press(f"Approve decision {decision.pk}")
    assert any(
        f"Decision {decision.pk} (Effect confirmed) is approved" in m for m in carl.messages()
    )
    assert "Decided by carl" in carl.section("Decisions")

    drive(instance)  # what a worker does with the instance the approval queued
    carl.open(page)
    assert "Status Completed" in carl.section("Status")
    steps = carl.section("Steps")
    assert "Outcome unknown" not in steps and steps.count("Completed") >= 2
    assert f"Approve decision {decision.pk}" not in carl.buttons()
    carl.screenshot(tmp_path / "completed.png")
    decision.refresh_from_db()
    assert (decision.state, decision.requested_by, decision.decided_by) == (
        "approved",
        operator,
        checker,
    )
