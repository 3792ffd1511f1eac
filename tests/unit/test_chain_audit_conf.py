"""The chain audit's settings (ADR 0038): defaults, read lazily, bad values refused."""

from __future__ import annotations

import pytest
from django.test import override_settings

from govflow.engine import conf
from govflow.engine.checks import check_settings


def test_the_audit_defaults_apply_when_the_settings_are_absent():
    assert (conf.chain_audit_interval(), conf.chain_audit_subjects()) == (60.0, 20)
    assert conf.chain_audit_settle() == 60.0


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("GOVFLOW_CHAIN_AUDIT_SUBJECTS", 0, "must be a positive whole number"),
        ("GOVFLOW_CHAIN_AUDIT_SUBJECTS", 2.5, "must be a positive whole number"),
        ("GOVFLOW_CHAIN_AUDIT_INTERVAL", -1, "must be a positive number of seconds"),
        ("GOVFLOW_CHAIN_AUDIT_SETTLE", "60", "must be a positive number of seconds"),
    ],
)
def test_a_bad_audit_setting_is_refused_at_startup(name, value, says):
    with override_settings(**{name: value}):
        found = check_settings(None)
    assert [m.id for m in found] == ["engine.E003"]
    assert name in found[0].msg and says in found[0].msg
