"""An operator opens an instance whose step's outcome is unknown and reads the case: the
keys, what the provider was asked, the checks to answer, and the timeline of what happened.

Screenshots of the handoff and of the timeline are kept as test artefacts in
``test-artefacts/screenshots`` (git-ignored; ``GOVFLOW_TEST_ARTEFACTS`` moves them).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By

from tests.integration.test_engine_admin import blocked

pytestmark = pytest.mark.django_db(transaction=True)


def artefacts() -> Path:
    where = Path(os.environ.get("GOVFLOW_TEST_ARTEFACTS", "test-artefacts")) / "screenshots"
    where.mkdir(parents=True, exist_ok=True)
    return where


def test_an_operator_sees_the_case_and_the_timeline_of_an_unknown_outcome(browser, operator):
    instance = blocked()
    token = instance.tokens.get(node_id="write")
    browser.log_in("olga", "pw-olga")
    browser.open(f"/admin/engine/instance/{instance.pk}/change/")

    step = browser.section("Step 'write'")
    assert "Write to the alpha store" in step
    assert token.idempotency_key[:16] in step and token.idempotency_key not in step
    assert "this is the input the provider received" in step
    assert "Outcome unknown" in browser.shown(".govflow-attempts")
    assert "Look the idempotency key up in the alpha effect store." in step
    assert "Plain retry is not offered" in step
    # The full key is a hover away, and on the copy button.
    key = browser.driver.find_element(By.CSS_SELECTOR, f"#case-{token.pk} .govflow-key")
    assert key.get_attribute("title") == token.idempotency_key
    copy = browser.driver.find_element(By.CSS_SELECTOR, f"#case-{token.pk} .govflow-copy")
    assert copy.get_attribute("data-copy") == token.idempotency_key
    # The check's field is marked required as the admin marks required fields.
    label = browser.driver.find_element(
        By.CSS_SELECTOR, f"label[for=id_handoff_{token.pk}_check_store]"
    )
    assert "required" in label.get_attribute("class")
    browser.driver.execute_script("arguments[0].scrollIntoView();", key)
    browser.screenshot(artefacts() / "handoff-case.png")

    timeline = browser.section("Timeline")
    assert "chain verified" in timeline
    assert "Ledger operation recorded (before dispatch)" in timeline
    assert "Provider's answer observed: outcome unknown" in timeline
    assert browser.driver.find_elements(By.CSS_SELECTOR, "svg.govflow-graph g.current")
    browser.driver.execute_script("document.getElementById('timeline').scrollIntoView();")
    browser.screenshot(artefacts() / "instance-timeline.png")
    assert (artefacts() / "instance-timeline.png").stat().st_size > 0
