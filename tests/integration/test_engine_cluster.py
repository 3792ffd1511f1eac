"""GovFlow's ``qcluster``: django-q2's cluster, with the sweeper in its main process."""

from __future__ import annotations

import signal
import threading

import pytest
from django.core.management import call_command, get_commands, load_command_class
from django.db.models.functions import Now
from django_q.cluster import Cluster
from django_q.management.commands.qcluster import Command as DjangoQClusterCommand

from govflow.engine import cluster as cluster_module
from govflow.engine.cluster import SweeperThread, SweepingCluster, cluster_run
from govflow.engine.models import Timer, TokenState
from govflow.engine.services import sweep
from govflow.engine.services.sweep import SWEEPER
from recovery.models import Lease
from tests.engine_helpers import marked_runnable, node, token_of, unmark_all
from tests.flows import drive, linear, start


def test_qcluster_is_the_engines_command_with_django_q2s_options():
    assert get_commands()["qcluster"] == "govflow.engine"
    command = load_command_class("govflow.engine", "qcluster")
    assert isinstance(command, DjangoQClusterCommand)
    parser = command.create_parser("manage.py", "qcluster")
    options = parser.parse_args(["--run-once", "--name", "other"])
    assert options.run_once and options.cluster_name == "other"


def test_the_command_runs_the_cluster_with_its_sweeper(monkeypatch):
    calls = []
    monkeypatch.setattr(
        "govflow.engine.management.commands.qcluster.cluster_run",
        lambda **kwargs: calls.append(kwargs),
    )
    call_command("qcluster")
    call_command("qcluster", "--run-once")
    assert calls == [{"run_once": False}, {"run_once": True}]


class FakeCluster:
    """Stands in for django-q2's cluster: records the order of events, forks nothing."""

    def __init__(self, events, *, sweeper_stop, alive_checks=2):
        self.events = events
        self.sweeper_stop = sweeper_stop
        self.alive_checks = alive_checks
        self.sentinel = self

    def start(self):
        self.events.append("cluster started")

    def stop(self):
        self.events.append("cluster stopped")

    def is_alive(self):
        self.alive_checks -= 1
        return self.alive_checks >= 0


class FakeThread:
    def __init__(self, events, *, stop_event, name="sweeper"):
        self.events = events
        self.stop_event = stop_event
        self.name = name

    def start(self):
        self.events.append(f"{self.name} started")

    def join(self, timeout=None):
        self.events.append(f"{self.name} joined, stop set: {self.stop_event.is_set()}")

    def is_alive(self):
        return False


@pytest.fixture
def fake_cluster(monkeypatch):
    events = []
    monkeypatch.setattr(cluster_module, "SweepingCluster", lambda **kw: FakeCluster(events, **kw))
    monkeypatch.setattr(cluster_module, "SweeperThread", lambda **kw: FakeThread(events, **kw))
    monkeypatch.setattr(
        cluster_module,
        "PublisherThread",
        lambda **kw: FakeThread(events, name="publisher", **kw),
    )
    monkeypatch.setattr(
        cluster_module.connections, "close_all", lambda: events.append("connections closed")
    )
    monkeypatch.setattr(cluster_module.time, "sleep", lambda seconds: None)
    return events


def test_the_sweeper_starts_only_after_the_sentinel_was_forked(fake_cluster):
    cluster_run()
    assert fake_cluster == [
        "connections closed",  # nothing open is inherited by the forked sentinel
        "cluster started",  # Cluster.start() forks the sentinel and returns
        "sweeper started",
        "publisher started",  # the outbox's publisher too, after the fork (ADR 0032)
        "sweeper joined, stop set: True",  # once the sentinel has stopped
        "publisher joined, stop set: True",
    ]


def test_run_once_starts_and_stops_the_cluster_without_a_sweeper(fake_cluster):
    cluster_run(run_once=True)
    assert fake_cluster == ["connections closed", "cluster started", "cluster stopped"]


def test_a_stop_signal_stops_the_sweeper_before_the_cluster(monkeypatch):
    order = []
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    stop = threading.Event()
    try:
        cluster = SweepingCluster(sweeper_stop=stop)
        assert signal.getsignal(signal.SIGTERM) == cluster.sig_handler
        monkeypatch.setattr(Cluster, "stop", lambda self: order.append(stop.is_set()))
        cluster.sig_handler(signal.SIGTERM, None)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    assert order == [True], "the sweeper was told to stop before the cluster stopped"


@pytest.mark.django_db
def test_the_sweeper_thread_survives_an_error_and_stands_by_again(monkeypatch):
    stop = threading.Event()
    runs = []

    def run(self, **kwargs):
        runs.append(kwargs)
        if len(runs) == 1:
            raise ConnectionError("the database went away")
        stop.set()
        return self.stats

    monkeypatch.setattr(sweep.Sweeper, "run", run)
    monkeypatch.setattr(cluster_module, "RESTART_AFTER", 0)
    SweeperThread(stop_event=stop).sweep_until_stopped()
    assert runs == [{"standby": True}, {"standby": True}]


@pytest.mark.django_db(transaction=True)
def test_the_sweeper_thread_fires_due_timers_and_releases_its_lease_when_stopped(monkeypatch):
    instance = drive(start(linear(node("t", "timer", duration="PT0S"))))
    Timer.objects.update(due_at=Now())
    unmark_all()
    fired = threading.Event()
    real = sweep.timers_fire_only

    def timers_fire_only(**kwargs):
        instance_ids = real(**kwargs)
        if instance_ids:
            fired.set()
        return instance_ids

    monkeypatch.setattr(sweep, "timers_fire_only", timers_fire_only)
    stop = threading.Event()
    thread = SweeperThread(stop_event=stop)
    thread.start()
    try:
        assert fired.wait(10), "the thread fired the due timer"
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive()
    assert Timer.objects.get(instance=instance).state == "fired"
    assert token_of(instance, "t").state == TokenState.READY
    assert marked_runnable() == [instance.pk]
    lease = Lease.objects.get(key=SWEEPER)
    assert lease.holder is None and lease.fence >= 1
