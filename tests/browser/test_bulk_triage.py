"""Bulk triage in a real browser: after one outage three steps of the same action have an
unknown outcome; an operator selects them, previews, submits with evidence; a second person
approves the batch, and the instances complete (issue 10 part 8)."""

from __future__ import annotations

import pytest
from selenium.webdriver.common.by import By

from govflow.engine.models import InstanceStatus
from govflow.handoffs.models import BatchState, DecisionBatch
from recovery.models import Decision
from tests.flows import drive
from tests.integration.test_desk_batches import uncertain

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_operator_triages_three_unknown_outcomes_and_a_second_person_approves(
    browser, operator, checker, tmp_path
):
    steps = uncertain(4)
    chosen = steps[:3]
    export = tmp_path / "registry-export.csv"
    export.write_text("".join(f"{s.idempotency_key},stored\n" for s in chosen))

    desk = browser
    desk.log_in("olga", "pw-olga")
    desk.follow("Triage several of one kind at once (bulk triage)")
    desk.follow("alpha.write")
    for step in chosen:
        desk.driver.find_element(By.ID, f"step-{step.pk}").click()
    desk.choose("kind", "effect_confirmed")
    desk.fill("rationale", "The registry's export after the outage\nlists these three writes.")
    desk.fill("check_store", "Each idempotency key is in the export.")
    desk.press("Preview the batch")

    rows = desk.shown("#batch-preview tbody")
    for step in chosen:
        assert f"Test flow #{step.instance_id}" in rows
    assert f"Test flow #{steps[3].instance_id}" not in rows
    assert "3 operations" in desk.text
    for number, step in enumerate(chosen, start=1):
        desk.fill(f"reference_{step.pk}", f"export line {number}")
    desk.attach("shared", export)
    desk.press("Submit the batch for approval")
    batch = DecisionBatch.objects.get()
    assert any(f"Batch {batch.pk} is requested: 3 decision(s)" in m for m in desk.messages())
    assert "You requested this batch" in desk.text
    desk.log_out()

    approver = browser
    approver.log_in("carl", "pw-carl")
    assert f"Batch {batch.pk}:" in approver.shown("#section-batches")
    approver.follow(f"Batch {batch.pk}: Effect confirmed on 3 step(s) of alpha.write")
    assert "registry-export.csv" in approver.shown("#batch-decisions")
    approver.press("Approve the batch")
    assert any(f"Batch {batch.pk} is approved" in m for m in approver.messages())
    approver.screenshot(tmp_path / "batch-approved.png")

    batch.refresh_from_db()
    assert batch.state == BatchState.APPROVED
    assert set(Decision.objects.values_list("state", flat=True)) == {"approved"}
    for step in chosen:
        assert drive(step.instance).status == InstanceStatus.COMPLETED
