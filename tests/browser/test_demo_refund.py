"""The demo's refund in a real browser: cancelling a building permit after its fee was
collected refunds the fee (its compensation, docs/compensation.md), shown on the instance
page; a refund whose answer was lost waits for a person in the work queue."""

from __future__ import annotations

import dataclasses
import io
import shutil
from pathlib import Path

import pytest
from django.core.management import call_command

from govflow.demo import refunds, store
from govflow.demo.sample import sample_variables
from govflow.engine.models import Definition, InstanceStatus, WaitKind
from govflow.engine.provider import registry
from govflow.engine.services.instances import instance_cancel, instance_start
from recovery import api
from tests.integration.test_demo import drive, waiting

pytestmark = pytest.mark.django_db(transaction=True)
PASSWORD = "pw-demo-refund"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def demo(tmp_path, settings):
    """The demo's stores in a temporary file, and the demo logins and workflows."""
    settings.GOVFLOW_DEMO_STORE = str(tmp_path / "demo-registry.sqlite3")
    call_command("demo_setup", "--password", PASSWORD, stdout=io.StringIO())


def paid_permit():
    """A building permit in the demo tenant whose fee the citizen has paid."""
    definition = Definition.objects.get(key="demo.building_permit")
    instance = drive(
        instance_start(
            definition=definition, variables=sample_variables(), tenant="demo-municipality"
        )
    )
    waiting(instance, WaitKind.TIMER)  # the fee is collected: the objection period runs
    assert instance.variables["payment"]["reference"].startswith("PAY-")
    return instance


def refunds_of(instance) -> list:
    return api.compensations_of(api.Subject("govflow.instance", str(instance.pk)))


def keep(browser, tmp_path, name: str) -> None:
    """A screenshot kept as a test artefact (var/screenshots, git-ignored)."""
    shot = browser.screenshot(tmp_path / name)
    target = ROOT / "var" / "screenshots"
    target.mkdir(parents=True, exist_ok=True)
    shutil.copy(shot, target / name)


def test_cancelling_a_paid_permit_shows_its_refund_on_the_instance_page(browser, tmp_path):
    instance = paid_permit()
    application_id = instance.variables["application"]["id"]
    page = f"/admin/engine/instance/{instance.pk}/change/"
    browser.log_in("operator", PASSWORD)
    browser.open(page)
    assert "No compensation is recorded" in browser.section("Compensations")
    browser.fill("reason", "The applicant withdrew the application.")
    browser.press("Cancel instance")
    assert browser.path == page

    # Recorded in the cancel's commit, in the order it runs; the worker has not run it yet.
    section = browser.section("Compensations")
    assert "Collect the permit fee" in section and "demo.refund_fee" in section
    assert "to run" in section and "the instance was cancelled" in section
    assert "automatically" in section
    assert store.records_for(application_id)["refunds"] == []

    instance = drive(instance)  # what a worker does next
    assert instance.status == InstanceStatus.CANCELLED
    browser.open(page)
    section = browser.section("Compensations")
    assert "done" in section and "to run" not in section
    [refund] = store.records_for(application_id)["refunds"]
    assert refund["payment_reference"] == instance.variables["payment"]["reference"]
    [view] = refunds_of(instance)
    assert view.key[:16] in section  # its cmp- key, shortened, to find it at the provider
    timeline = browser.section("Timeline")
    assert "Compensation recorded (to undo this step) — #" in timeline
    assert "step Collect the permit fee" in timeline and "Compensations planned" in timeline
    keep(browser, tmp_path, "instance-refund.png")


def _refunded_then_lost(context):
    refunds.refund_fee.execute(context)  # the payment provider refunds…
    raise TimeoutError("the payment provider's answer never arrived")  # …the answer is lost


def test_a_refund_whose_answer_was_lost_waits_in_the_work_queue(browser, tmp_path):
    instance = paid_permit()
    instance_cancel(
        instance_id=instance.pk,
        actor=_demo_user("operator"),
        reason="The applicant withdrew the application.",
    )
    lost = dataclasses.replace(refunds.refund_fee, execute=_refunded_then_lost)
    with registry.override(lost):
        instance = drive(instance)
    [view] = refunds_of(instance)
    assert view.state == "outcome_unknown"

    browser.log_in("operator", PASSWORD)
    assert browser.path == "/admin/"
    count = browser.shown('#queue-summary a.queue-count[data-queue="compensations"]')
    assert count == "1"
    queue = browser.shown("#section-compensations")
    assert "undo 'collect_fee' by demo.refund_fee: outcome unknown" in queue
    keep(browser, tmp_path, "queue-refund-unknown.png")

    browser.follow(f"Instance {instance.pk}")
    assert browser.path == f"/admin/engine/instance/{instance.pk}/change/#compensations-heading"
    section = browser.section("Compensations")
    assert "outcome unknown" in section and "It is never called again" in section
    assert "Record what happened" in section  # the decision form: a second person approves
    assert len(store.records_for(instance.variables["application"]["id"])["refunds"]) == 1


def _demo_user(username: str):
    from django.contrib.auth import get_user_model

    return get_user_model().objects.get(username=username)
