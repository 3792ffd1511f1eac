"""An operator switches the desk to German: the work queue and a handoff read German.

The switch is the form in the admin's header (a POST to Django's set_language, no
script); the choice is kept in the language cookie, so every following page is German,
dates day first. The screenshot of the German handoff is kept in var/screenshots/.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from tests.flows import action, drive, linear, start
from tests.providers.alpha import effects

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def german_catalogue():
    """The German .mo, as `make` compiles it at install (it is never committed)."""
    from django.utils import translation

    call_command("compilemessages", locale=["de"], ignore_patterns=[".venv", "var"], verbosity=0)
    translation.trans_real._translations.clear()
    translation.trans_real._default = None


def test_an_operator_switches_to_german_and_reads_the_queue_and_a_handoff(browser, tmp_path):
    call_command("demo_setup", "--password", "pw-demo", verbosity=0)
    assert get_user_model().objects.get(username="operator").groups.filter(name="Operator")
    effects.SCRIPT["alpha.write"] = ["raise_after"]  # raised after dispatch: unknown
    document = linear(action("write", title="Write the notice"))
    instance = drive(start(document, tenant="demo-municipality"))

    browser.log_in("operator", "pw-demo")
    assert browser.title == "Work queue"
    browser.press("Deutsch")
    assert browser.path == "/admin/"  # back on the page the switch was pressed on
    assert browser.title == "Arbeitsvorrat"
    queue = browser.shown("#content")
    assert "Ergebnis unbekannt" in queue and "Entscheidungen, die auf meine Freigabe" in queue
    header = browser.shown("#user-tools").lower()  # the admin shows it in capitals
    assert "abmelden" in header and "english" in header  # the way back, in its own name
    assert "Work queue" not in browser.text and "What needs attention" not in queue

    browser.follow(f"Test flow #{instance.pk}")
    assert browser.path == f"/admin/engine/instance/{instance.pk}/change/"
    step = browser.section("Schritt „Write the notice“")
    assert "Ergebnis unbekannt" in step
    assert "Wirkung bestätigt" in step and "Wirkung nicht eingetreten" in step
    assert "Idempotenzschlüssel" in step
    assert "Entscheidung beantragen" in browser.buttons()
    timeline = browser.section("Zeitleiste")
    assert "Vorgang gestartet" in timeline
    assert instance.created_at.strftime("%d.%m.%Y, %H:%M:%S") in browser.section("Status")

    screenshot = browser.screenshot(tmp_path / "desk-german-handoff.png")
    keep = ROOT / "var" / "screenshots"  # git-ignored: the artefact outlives tmp_path
    keep.mkdir(parents=True, exist_ok=True)
    shutil.copy(screenshot, keep / "desk-german-handoff.png")

    browser.press("English")
    assert browser.title.startswith("Test flow #")
    assert "Steps" in browser.text and "Schritte" not in browser.text
