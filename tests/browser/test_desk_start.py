"""Starting a demo permit from the generated form, then finding it by the applicant's name.

The operator chooses the building permit, sees the schema's fields with their required
marks and examples, is told on the field what is wrong, starts the case for the demo's
tenant (the only one her groups give her, so it is chosen for her), and finds it in the
list by typing the applicant's name; an auditor downloads its audit trail, which
verifies offline.
"""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command

from govflow.engine.models import Instance

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "pw-demo-desk"
VALUES = {
    "var.applicant.name": "Tomasz Nowak",
    "var.applicant.email": "t.nowak@example.org",
    "var.parcel.id": "UTR-C-1907",
    "var.parcel.address": "Oudegracht 45, Utrecht",
    "var.project.description": "Dormer window on the street side of the attic",
    "var.project.floor_area_m2": "6",
    "var.fee.amount_cents": "20600",
}


@pytest.fixture(autouse=True)
def demo(tmp_path, settings):
    settings.GOVFLOW_DEMO_STORE = str(tmp_path / "demo-registry.sqlite3")
    call_command("demo_setup", "--password", PASSWORD, stdout=io.StringIO())


def test_an_operator_starts_a_permit_from_the_generated_form_and_finds_it_by_name(
    browser, tmp_path
):
    browser.log_in("operator", PASSWORD)
    browser.open("/admin/engine/instance/")
    browser.follow("Start instance")
    browser.select("definition", "Building permit (demo.building_permit v4)")
    browser.press("Continue")
    assert browser.title == "Start: Building permit"
    assert browser.value("tenant") == "demo-municipality"  # her one tenant (its group)
    form = browser.shown("fieldset")
    assert "Applicant: Name (required):" in form and "Floor area (m²) (required):" in form
    assert "As the land registry writes it." in form
    name = browser._field("var.applicant.name")
    assert name.get_attribute("placeholder") == "T. Nowak"

    for field, value in VALUES.items():
        browser.fill(field, value)
    browser.fill("var.project.floor_area_m2", "0")  # the currency is left unchosen
    browser.press("Start instance")
    errors = browser.errors()
    assert "Ensure this value is greater than or equal to 1." in errors
    assert "This field is required." in errors
    assert not Instance.objects.exists()
    assert browser.value("var.applicant.name") == "Tomasz Nowak"  # nothing typed is lost

    browser.fill("var.project.floor_area_m2", "6")
    browser.select("var.fee.currency", "EUR")
    browser.press("Start instance")
    instance = Instance.objects.get()
    assert instance.tenant == "demo-municipality"
    assert instance.variables["project"]["floor_area_m2"] == 6
    heading = f"Building permit #{instance.pk} — Tomasz Nowak, UTR-C-1907"
    assert browser.title == heading
    assert any(f"Started {heading}" in m for m in browser.messages())

    browser.open("/admin/engine/instance/")
    browser.fill("q", "Nowak")
    browser.press("Search")
    listing = browser.shown("#result_list")
    assert heading in listing and "Applicant: Tomasz Nowak" in listing
    browser.fill("q", "Jansen")
    browser.press("Search")
    assert heading not in browser.text
    browser.screenshot(tmp_path / "desk-start-found.png")


def test_an_auditor_downloads_a_trail_that_verifies_offline(browser, tmp_path, live_server):
    from django.contrib.auth import get_user_model

    from govflow.demo.sample import sample_variables
    from govflow.engine.models import Definition
    from govflow.engine.services.instances import instance_start

    definition = Definition.objects.get(key="demo.building_permit")
    instance = instance_start(
        definition=definition, variables=sample_variables(), tenant="demo-municipality"
    )  # the demo logins' tenant: another tenant's instance is not found for them
    page = f"/admin/engine/instance/{instance.pk}/change/"
    browser.log_in("operator", PASSWORD)  # the Operator role does not read the chain
    browser.open(page)
    assert "Download the audit trail" not in browser.text
    browser.log_out()
    auditor = get_user_model().objects.get(username="auditor")
    assert auditor.groups.filter(name="Auditor").exists()
    browser.log_in("auditor", PASSWORD)
    browser.open(page)
    link = browser.driver.find_element("id", "download-trail")
    href = link.get_attribute("href")
    assert href.endswith(f"/admin/engine/instance/{instance.pk}/trail/")
    # Fetch it with the browser's session (a download dialog is not part of the page).
    body = browser.driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "fetch(arguments[0], {credentials: 'same-origin'}).then(r => r.text()).then(done);",
        href,
    )
    trail = tmp_path / "trail.json"
    trail.write_text(body)
    assert json.loads(body)["format"] == "govflow.trail/1"
    out = io.StringIO()
    call_command("recovery_verify", "--file", str(trail), stdout=out)
    assert out.getvalue().startswith(f"ok govflow.instance:{instance.pk}:")
