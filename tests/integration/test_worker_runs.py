"""``GOVFLOW_WORKER_RUNS``: runs at once per worker process (ADR 0041), on both databases.

The setting is checked like every engine setting, is 1 on SQLite whatever is asked (with a
warning), and sizes the broker's claim batch: workers x runs. Unset, it is the cluster's
runs (``GOVFLOW_CLUSTER_RUNS``) divided among its worker processes, at least 8 (ADR
0067). Outside a ``qcluster`` worker ``advance`` runs the instance itself, whatever the
setting.
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


@pytest.fixture
def unset(settings):
    """The settings without GOVFLOW_WORKER_RUNS: the default applies."""
    if hasattr(settings, "GOVFLOW_WORKER_RUNS"):
        del settings.GOVFLOW_WORKER_RUNS
    return settings


def problems(ids: tuple[str, ...]) -> list[checks.CheckMessage]:
    return [found for found in check_settings(None) if found.id in ids]


@pytest.mark.parametrize("value", [0, -2, 2.5, "4", True])
def test_a_worker_runs_value_that_is_no_positive_whole_number_is_refused(settings, value):
    settings.GOVFLOW_WORKER_RUNS = value
    [error] = problems(("engine.E003",))
    assert error.level == checks.ERROR
    assert f"GOVFLOW_WORKER_RUNS is {value!r}; it must be a positive whole number." in error.msg
    assert "remove it for the default (GOVFLOW_CLUSTER_RUNS / workers, at least 8)" in error.hint


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


@pytest.mark.parametrize(("workers", "expected"), [(1, 24), (2, 12), (3, 8), (4, 8), (16, 8)])
def test_by_default_the_clusters_24_runs_are_divided_among_its_workers_at_least_eight(
    unset, monkeypatch, workers, expected
):
    monkeypatch.setattr(Conf, "WORKERS", workers)
    assert problems(("engine.E003", "engine.W005")) == []
    assert conf.worker_runs() == (expected if connection.vendor == "postgresql" else 1)


@pytest.mark.parametrize(("cluster_runs", "expected"), [(40, 14), (48, 16), (9, 8), (1, 8)])
def test_the_clusters_runs_are_divided_rounded_up(unset, monkeypatch, cluster_runs, expected):
    unset.GOVFLOW_CLUSTER_RUNS = cluster_runs
    monkeypatch.setattr(Conf, "WORKERS", 3)
    assert conf.worker_runs() == (expected if connection.vendor == "postgresql" else 1)


def test_the_worker_runs_setting_wins_over_the_clusters(settings, monkeypatch):
    settings.GOVFLOW_CLUSTER_RUNS = 64
    settings.GOVFLOW_WORKER_RUNS = 2
    monkeypatch.setattr(Conf, "WORKERS", 1)
    assert conf.worker_runs() == (2 if connection.vendor == "postgresql" else 1)


def test_a_cluster_runs_value_that_is_no_positive_whole_number_is_refused(settings):
    settings.GOVFLOW_CLUSTER_RUNS = 0
    [error] = problems(("engine.E003",))
    assert "GOVFLOW_CLUSTER_RUNS is 0; it must be a positive whole number." in error.msg
    assert "remove it for the default (24)" in error.hint


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
