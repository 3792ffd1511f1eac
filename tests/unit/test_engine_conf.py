"""The engine's settings: one table of defaults, read lazily, checked at startup, documented.

No database: the system check is called directly, with settings overridden per test.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.test import override_settings

from govflow.engine import conf
from govflow.engine.checks import check_settings

ROOT = Path(__file__).resolve().parents[2]
DEPLOYMENT = ROOT / "docs" / "deployment.md"
BASE_SETTINGS = ROOT / "govflow" / "settings" / "base.py"


def ids(messages) -> list[str]:
    return [m.id for m in messages]


def test_the_default_settings_pass_the_check():
    assert check_settings(None) == []


def test_a_default_applies_when_a_setting_is_absent(settings):
    del settings.GOVFLOW_LEASE_TTL
    assert conf.lease_ttl() == 30.0
    assert conf.sweep_timer_batch() == 2000
    assert conf.operator_lease_ttl() == 30.0
    assert conf.delivery_lease_ttl() == 30.0


def test_a_setting_is_read_when_asked_not_at_import(settings):
    settings.GOVFLOW_RUN_BUDGET = 7
    assert conf.run_budget() == 7.0
    settings.GOVFLOW_RUN_BUDGET = 9.5
    assert conf.run_budget() == 9.5


@pytest.mark.parametrize(
    ("name", "value", "code", "says"),
    [
        ("GOVFLOW_SWEEP_TIMER_BATCH", -5, "engine.E003", "must be a positive whole number"),
        ("GOVFLOW_SWEEP_TIMER_BATCH", 2.5, "engine.E003", "must be a positive whole number"),
        ("GOVFLOW_LEASE_TTL", 0, "engine.E003", "must be a positive number of seconds"),
        ("GOVFLOW_LEASE_TTL", "30", "engine.E003", "must be a positive number of seconds"),
        ("GOVFLOW_RUN_BUDGET", True, "engine.E003", "must be a positive number of seconds"),
        ("GOVFLOW_DELIVERY_LEASE_TTL", -1, "engine.E003", "must be a positive number of"),
        ("GOVFLOW_PAYLOAD_MAX_BYTES", -1, "engine.E001", "must be a positive number of bytes"),
        ("GOVFLOW_DEFINITION_MAX_BYTES", 1.5, "engine.E001", "must be a positive number of"),
    ],
)
def test_a_setting_of_the_wrong_type_or_range_is_an_error(name, value, code, says):
    with override_settings(**{name: value}):
        found = check_settings(None)
    assert ids(found) == [code]
    assert found[0].msg.startswith(f"{name} is {value!r};")
    assert says in found[0].msg
    assert "remove it for the default" in found[0].hint


def test_an_instance_lease_shorter_than_the_sweep_interval_is_an_error():
    with override_settings(GOVFLOW_LEASE_TTL=0.2, GOVFLOW_SWEEP_TICK=0.25):
        found = check_settings(None)
    assert ids(found) == ["engine.E004"]
    assert "GOVFLOW_LEASE_TTL (0.2 s) is not longer than GOVFLOW_SWEEP_TICK (0.25 s)" in (
        found[0].msg
    )


def test_a_sweeper_lease_that_runs_out_between_passes_is_an_error():
    with override_settings(GOVFLOW_SWEEP_LEASE_TTL=2, GOVFLOW_SWEEP_TICK=2):
        found = check_settings(None)
    assert ids(found) == ["engine.E004"]  # the instance lease (30 s) is long enough
    assert "GOVFLOW_SWEEP_LEASE_TTL (2 s) is not longer than GOVFLOW_SWEEP_TICK (2 s)" in (
        found[0].msg
    )


def test_short_leases_that_outlast_the_sweep_tick_pass_the_check():
    # The process tests' timings: a full pass of deliveries as often as the lease lasts is
    # fine, because the sweeper renews its lease after every pass (every tick).
    with override_settings(
        GOVFLOW_LEASE_TTL=3,
        GOVFLOW_SWEEP_LEASE_TTL=2,
        GOVFLOW_SWEEP_TICK=0.1,
        GOVFLOW_SWEEP_FULL_EVERY=2,
    ):
        assert check_settings(None) == []


def test_a_run_budget_past_the_task_timeout_is_a_warning(settings):
    settings.Q_CLUSTER = {**settings.Q_CLUSTER, "timeout": 20}
    found = check_settings(None)
    assert ids(found) == ["engine.W004", "engine.W004"]  # the run budget and the sweep task
    assert "GOVFLOW_RUN_BUDGET (25 s) is not below django-q2's timeout (20 s)" in found[0].msg


def test_a_variables_limit_above_the_request_limit_is_a_warning():
    with override_settings(GOVFLOW_VARIABLES_MAX_BYTES=4096, DATA_UPLOAD_MAX_MEMORY_SIZE=1024):
        assert ids(check_settings(None)) == ["engine.W003"]


def test_the_deployment_guide_shows_the_generated_settings_table():
    text = DEPLOYMENT.read_text()
    assert conf.settings_table() in text, (
        "docs/deployment.md's settings table differs from govflow/engine/conf.py; paste "
        "the output of `python -c 'from govflow.engine.conf import settings_table as t; "
        "print(t())'` in its place"
    )


def test_every_govflow_setting_the_code_reads_is_in_the_table():
    read = set()
    for path in (ROOT / "govflow" / "engine").rglob("*.py"):
        read |= set(re.findall(r"getattr\(settings, \"(GOVFLOW_[A-Z_]+)\"", path.read_text()))
        read |= set(re.findall(r"_setting\(\"(GOVFLOW_[A-Z_]+)\"", path.read_text()))
    assert read <= {s.name for s in conf.SETTINGS}


def test_the_table_says_which_settings_base_reads_from_the_environment():
    source = BASE_SETTINGS.read_text()
    for setting in conf.SETTINGS:
        readers = ("os.environ.get", "env_int", "env_float")  # environ.py's readers too
        reads = any(f'{reader}("{setting.name}"' in source for reader in readers)
        assert reads == setting.environment, setting.name


@pytest.mark.parametrize("broker", [None, "django_q.brokers.orm.ORM", "no.such.Broker"])
def test_a_qcluster_without_the_claim_broker_is_an_error(settings, broker):
    from govflow.engine.checks import check_claim_broker

    settings.Q_CLUSTER = {k: v for k, v in settings.Q_CLUSTER.items() if k != "broker_class"}
    if broker:
        settings.Q_CLUSTER["broker_class"] = broker
    found = check_claim_broker(None)
    assert ids(found) == ["engine.E006"]
    assert "no workflow would ever move on" in found[0].msg
    assert "govflow.engine.broker.ClaimBroker" in found[0].hint


def test_the_claim_broker_passes_its_check():
    from govflow.engine.checks import check_claim_broker

    assert check_claim_broker(None) == []
