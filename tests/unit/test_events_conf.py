"""The outbox's settings table in docs/deployment.md is the one govflow/events/conf.py holds."""

from __future__ import annotations

from pathlib import Path

from django.test import override_settings

from govflow.events import conf
from govflow.events.checks import check_outbox_settings

DEPLOYMENT = Path(__file__).resolve().parents[2] / "docs" / "deployment.md"


def test_the_deployment_guide_shows_the_generated_outbox_settings_table():
    assert conf.settings_table() in DEPLOYMENT.read_text(), (
        "docs/deployment.md's webhook settings table differs from govflow/events/conf.py; "
        "paste the output of `govflow.events.conf.settings_table()` in its place"
    )


def test_the_defaults_pass_the_check():
    assert check_outbox_settings() == []


def test_a_timeout_near_the_lease_and_bad_keys_are_refused():
    with override_settings(GOVFLOW_WEBHOOK_TIMEOUT=25, GOVFLOW_WEBHOOK_KEYS="k1:beef"):
        found = check_outbox_settings()
    assert [e.id for e in found] == ["govflow.events.E001", "govflow.events.E002"]
    assert "'k1:beef' is not 'id:<64 hex characters>'" in found[0].msg
