"""The desk in German: the catalogue is complete, and an operator who switches the
language reads the work queue, an instance and its handoff in German, dates day first."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from django.core.management import call_command
from django.test import Client
from django.urls import reverse
from django.utils import translation

from govflow.engine.models import TokenState
from tests.engine_helpers import user_with
from tests.flows import action, drive, linear, start
from tests.identity import verified_login
from tests.providers.alpha import effects

ROOT = Path(__file__).resolve().parents[2]
CATALOGUE = ROOT / "locale" / "de" / "LC_MESSAGES" / "django.po"
SOURCES = ("govflow", "recovery", "templates")


@pytest.fixture(scope="module", autouse=True)
def compiled():
    """The German .mo, as `make` compiles it at install (never committed)."""
    call_command("compilemessages", locale=["de"], ignore_patterns=[".venv", "var"], verbosity=0)
    translation.trans_real._translations.clear()  # reread with the fresh catalogue
    translation.trans_real._default = None


def entries(po: Path) -> list[tuple[str, list[str], bool]]:
    """(msgid, msgstrs, fuzzy) for each entry of ``po`` but the header."""
    found = []
    for block in po.read_text(encoding="utf-8").split("\n\n"):
        if "\nmsgid " not in "\n" + block:
            continue
        parts: dict[str, str] = {}
        key = None
        for line in block.splitlines():
            match = re.match(r'(msgid|msgid_plural|msgstr(?:\[\d\])?) "(.*)"$', line)
            if match:
                key, parts[match.group(1)] = match.group(1), match.group(2)
            elif line.startswith('"') and key:
                parts[key] += line[1:-1]
        if parts.get("msgid"):
            strs = [v for k, v in parts.items() if k.startswith("msgstr")]
            found.append((parts["msgid"], strs, "fuzzy" in block.split("msgid")[0]))
    return found


def test_every_marked_string_has_a_german_translation(tmp_path, settings, monkeypatch):
    """makemessages over a copy of the sources, merged into a copy of the catalogue:
    every msgid of the desk's domain has a non-empty, non-fuzzy German msgstr. Needs GNU
    gettext (apt-get install gettext; .ci/run installs it), as `make` does to compile."""
    assert shutil.which("xgettext"), "GNU gettext is missing: apt-get install gettext"
    for name in SOURCES:
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("*.pyc"))
    target = tmp_path / "locale" / "de" / "LC_MESSAGES"
    target.mkdir(parents=True)
    shutil.copy(CATALOGUE, target / "django.po")
    settings.LOCALE_PATHS = [tmp_path / "locale"]
    monkeypatch.chdir(tmp_path)
    call_command("makemessages", locale=["de"], no_location=True, verbosity=0)
    found = entries(target / "django.po")
    assert len(found) > 300
    untranslated = [m for m, strs, _ in found if not all(strs)]
    fuzzy = [m for m, _, is_fuzzy in found if is_fuzzy]
    assert not untranslated, f"not translated into German: {untranslated}"
    assert not fuzzy, f"German translation marked fuzzy (check it): {fuzzy}"
    subprocess.run(["msgfmt", "--check", "-o", "/dev/null", str(target / "django.po")], check=True)


@pytest.fixture
def olga(django_user_model):
    return user_with(
        django_user_model,
        "olga",
        "engine.view_instance",
        "engine.operate_instance",
        "recovery.view_operation",
        "recovery.view_decision",
        "recovery.request_decision",
    )


@pytest.mark.django_db
def test_the_desk_speaks_german_after_the_switch(olga):
    desk = verified_login(Client(), olga)
    home = desk.get(reverse("admin:index"))
    assert 'lang="en"' in home.content.decode() and "Work queue" in home.content.decode()
    # The switch: a POST to set_language, back to the page it was pressed on.
    switched = desk.post("/i18n/setlang/", {"language": "de", "next": reverse("admin:index")})
    assert switched.status_code == 302 and switched["Location"] == reverse("admin:index")
    home = desk.get(reverse("admin:index")).content.decode()
    assert 'lang="de"' in home
    assert "Arbeitsvorrat" in home and "Ergebnis unbekannt" in home
    assert 'value="en"' in home and ">English</button>" in home  # the way back
    assert "Abmelden" in home and "Log out" not in home

    effects.SCRIPT["alpha.write"] = ["raise_after"]  # raised after dispatch: unknown
    instance = drive(start(linear(action("write", title="Write the notice"))))
    token = instance.tokens.get(state=TokenState.OUTCOME_UNKNOWN)
    page = desk.get(reverse("admin:engine_instance_change", args=[instance.pk])).content.decode()
    assert "Schritte" in page and "Zeitleiste" in page and "Prüfpunktkette" in page
    assert "Schritt „Write the notice“" in page and ": Ergebnis unbekannt" in page
    assert "Wirkung bestätigt" in page and "Wirkung nicht eingetreten" in page
    assert "Entscheidung beantragen" in page  # the handoff form's button
    assert "Begründung" in page and "Nachweisdateien" in page
    # Dates day first, to the second.
    created = instance.created_at.strftime("%d.%m.%Y, %H:%M:%S")
    assert created in page
    assert "Request decision" not in page and "Effect confirmed" not in page

    # A refused request says what to do, in German.
    refused = desk.post(
        reverse("admin:engine_instance_handoff", args=[instance.pk, token.pk]),
        {"kind": "effect_confirmed", "rationale": ""},
    )
    assert refused.status_code == 200
    assert "Dieses Feld ist zwingend erforderlich." in refused.content.decode()

    # And back to English.
    desk.post("/i18n/setlang/", {"language": "en", "next": "/admin/"})
    assert "Work queue" in desk.get(reverse("admin:index")).content.decode()


@pytest.mark.django_db
def test_the_login_page_offers_the_switch_and_a_get_on_it_is_no_bare_405():
    client = Client()
    login = client.get(reverse("admin:login")).content.decode()
    assert 'action="/i18n/setlang/"' in login and ">Deutsch</button>" in login
    assert client.get("/i18n/setlang/").status_code == 302  # set_language redirects
    client.post("/i18n/setlang/", {"language": "de", "next": reverse("admin:login")})
    assert "Anmelden" in client.get(reverse("admin:login")).content.decode()
