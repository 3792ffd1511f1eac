"""``GOVFLOW_WORKER_RUNS``: runs at once per worker process (ADR 0041), on both databases.

The setting is checked like every engine setting, is 1 on SQLite whatever is asked (with a
warning), and sizes the broker's claim batch: workers x runs. Outside a ``qcluster``
worker ``advance`` runs the instance itself, whatever the setting.
"""

from __future__ import annotations

import pytest
from django.core import checks
from django.db import connection
from django_q.conf import Conf

from govflow.engine import conf
from govflow.engine.broker import claim_batch
from govflow.engine.checks import check_settings
from govflow.engine.models import InstanceStatus
from govflow.engine.queue import instances_claim
from govflow.engine.runpool import run_pool
from govflow.engine.tasks import advance
from tests.flows import action, linear, start

pytestmark = pytest.mark.django_db


def problems(ids: tuple[str, ...]) -> list[checks.CheckMessage]:
    return [found for found in check_settings(None) if found.id in ids]


@pytest.mark.parametrize("value", [0, -2, 2.5, "4", True])
def test_a_worker_runs_value_that_is_no_positive_whole_number_is_refused(settings, value):
    settings.GOVFLOW_WORKER_RUNS = value
    [error] = problems(("engine.E003",))
    assert error.level == checks.ERROR
    assert f"GOVFLOW_WORKER_RUNS is {value!r}; it must be a positive whole number." in error.msg
    assert "remove it for the default (8)" in error.hint


def test_several_runs_per_worker_are_postgresqls_and_ignored_with_a_warning_on_sqlite(settings):
    settings.GOVFLOW_WORKER_RUNS = 8
    warnings = problems(("engine.W005",))
    if connection.vendor == "postgresql":
        assert warnings == []
        assert conf.worker_runs() == 8
    else:
        [warning] = warnings
        assert "GOVFLOW_WORKER_RUNS is 8, but the database is sqlite" in warning.msg
        assert "the setting is ignored" in warning.msg
        assert conf.worker_runs() == 1


def test_the_default_is_eight_runs_on_postgresql_and_one_on_sqlite(settings):
    if hasattr(settings, "GOVFLOW_WORKER_RUNS"):
        del settings.GOVFLOW_WORKER_RUNS
    assert problems(("engine.E003", "engine.W005")) == []
    assert conf.worker_runs() == (8 if connection.vendor == "postgresql" else 1)


def test_the_claim_batch_is_one_instance_per_run_the_workers_run_at_once(settings, monkeypatch):
    monkeypatch.setattr(Conf, "WORKERS", 3)
    monkeypatch.setattr(Conf, "BULK", 1)
    settings.GOVFLOW_WORKER_RUNS = 4
    expected = 12 if connection.vendor == "postgresql" else 3
    assert claim_batch() == expected
    settings.GOVFLOW_WORKER_RUNS = 1
    assert claim_batch() == 3


def test_outside_a_qcluster_worker_advance_runs_the_claimed_instance_itself(settings):
    settings.GOVFLOW_WORKER_RUNS = 4
    instance = start(linear(action("a"), action("b")))
    [claim] = instances_claim(holder="pusher", limit=5, ttl=30)
    assert run_pool() is None
    report = advance(claim.instance_id, claim.fence, claim.holder, claim.wakeups)
    assert report["status"] == InstanceStatus.COMPLETED
    assert report["steps"] >= 2
    instance.refresh_from_db()
    assert instance.status == InstanceStatus.COMPLETED
