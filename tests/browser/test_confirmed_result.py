"""The demo's building permit in a real browser, after the registry's answer was lost.

The demo operator records *effect confirmed* on the ``register`` step with the application
number the registry shows, the demo approver checks exactly those values and approves,
and the permit goes on to be issued.
"""

from __future__ import annotations

import dataclasses
import io

import pytest
from django.core.management import call_command

from govflow.demo import actions, store
from govflow.demo.sample import sample_variables
from govflow.engine.models import Definition, InstanceStatus, TokenState, WaitKind
from govflow.engine.provider import registry
from govflow.engine.services.instances import instance_start
from govflow.engine.services.triggers import trigger_deliver
from recovery.models import Decision
from tests.integration.test_demo import drive, fire_timers, waiting

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "pw-demo-desk"
RATIONALE = "The municipal registry lists the application under this step's key."


@pytest.fixture(autouse=True)
def demo(tmp_path, settings):
    """The demo registry in a temporary file, and the demo logins and workflows."""
    settings.GOVFLOW_DEMO_STORE = str(tmp_path / "demo-registry.sqlite3")
    call_command("demo_setup", "--password", PASSWORD, stdout=io.StringIO())


def _registered_then_lost(context):
    actions.register_application.execute(context)  # the registry has it now
    raise TimeoutError("the registry's answer never arrived")


def register_uncertain():
    definition = Definition.objects.get(key="demo.building_permit")
    lost = dataclasses.replace(actions.register_application, execute=_registered_then_lost)
    with registry.override(lost):
        # In the demo tenant, as demo_start starts it: the demo logins work for it.
        instance = drive(
            instance_start(
                definition=definition, variables=sample_variables(), tenant="demo-municipality"
            )
        )
    register = instance.tokens.get(node_id="register")
    assert register.state == TokenState.OUTCOME_UNKNOWN
    return instance, store.application_find(register.idempotency_key)


def request_confirmation(desk, record, extract) -> None:
    desk.choose("kind", "effect_confirmed")
    desk.fill("rationale", RATIONALE)
    desk.fill("check_registry-search", f"Found {record['application_id']} under this key.")
    desk.fill("check_no-duplicate", "One application for the parcel today.")
    desk.attach("evidence", extract)
    desk.fill("result_registered_at", record["registered_at"])
    desk.press("Request decision")


def on_to_the_permits_officer(instance, number: str):
    """What the workers, the timer and the inspector's system do after the approval."""
    instance = drive(instance)
    assert instance.variables["application"]["id"] == number
    waiting(instance, WaitKind.TIMER)
    assert fire_timers(instance) == 1
    instance = drive(instance)
    trigger_deliver(
        message="inspection.completed",
        correlation=number,
        delivery_id=f"inspection:{number}",
        payload={"result": "passed", "inspector": "J. de Vries", "remarks": "ok"},
    )
    return drive(instance)


def test_the_operator_confirms_register_with_the_application_number_and_the_permit_completes(
    browser, tmp_path
):
    instance, record = register_uncertain()
    number = record["application_id"]
    page = f"/admin/engine/instance/{instance.pk}/change/"
    extract = tmp_path / "registry-extract.txt"
    extract.write_text(f"municipal registry: {number} registered at {record['registered_at']}\n")

    operator = browser
    operator.log_in("operator", PASSWORD)
    operator.open(page)
    step = operator.section("Step 'Register the application'")
    assert "Outcome unknown" in step
    assert "Application number" in step and "Registered at" in step

    # The provider's reconcile was asked first: its finding pre-fills the number (issue 9,
    # item 2). Without the application number the request is refused on its form, naming
    # the field.
    assert operator.value("result_application_id") == number
    assert "Pre-filled from the provider's finding above" in step
    operator.fill("result_application_id", "")
    request_confirmation(operator, record, extract)
    assert "Required to record effect confirmed." in operator.errors()
    assert not Decision.objects.exists()
    operator.fill("result_application_id", number)
    request_confirmation(operator, record, extract)
    decision = Decision.objects.get()
    assert any(
        f"Decision {decision.pk} (Effect confirmed) is requested" in m for m in operator.messages()
    )
    operator.log_out()

    approver = browser  # the second demo operator, at the same desk
    approver.log_in("approver", PASSWORD)
    approver.open(page)
    decisions = approver.section("Decisions")
    assert f"Application number (application_id): {number}" in decisions
    assert f"Registered at (registered_at): {record['registered_at']}" in decisions
    assert "Approving completes the step with exactly these values" in decisions
    approver.press(f"Approve decision {decision.pk}")
    assert any(
        "step 'register' is completed with the confirmed result" in m for m in approver.messages()
    )

    instance = on_to_the_permits_officer(instance, number)
    approver.open(page)  # the approver is also the demo's permits officer
    approver.choose("decision", "approve")
    approver.fill("note", "Complies with the zoning plan.")
    approver.press("Record decision")
    assert any(
        "You approved 'Permits officer decides'; it is recorded." in m for m in approver.messages()
    )
    instance = drive(instance)
    assert instance.status == InstanceStatus.COMPLETED, instance.reason

    approver.open(page)
    assert "Status Completed" in approver.section("Status")
    permit = instance.variables["permit"]["number"]
    assert permit in approver.section("Variables")
    assert [p["permit_number"] for p in store.records_for(number)["permits"]] == [permit]
    approver.screenshot(tmp_path / "permit-completed.png")
