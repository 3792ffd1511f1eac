"""The sweeper runs in each real ``qcluster``'s main process (ADR 0005).

The main process of the cluster that holds the ``govflow:sweeper`` lease sweeps; the
others stand by and take over once its lease expires. Timers fire even while every
worker is busy, and a cluster stopped by a signal releases the lease on its way out.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from django.db.models.functions import Now

from govflow.engine.models import Timer, TokenState
from govflow.engine.services.definitions import definition_publish
from govflow.engine.services.instances import instance_start
from recovery.models import Lease
from tests.flows import action, drive, linear, start

from .support import (
    FAST,
    SWEEPER_LEASE,
    sweeper_pid,
    token,
    wait_for,
    wait_until_sweeping,
)

pytestmark = pytest.mark.django_db(transaction=True)

SWEEP_TTL = float(FAST["GOVFLOW_SWEEP_LEASE_TTL"])


def test_the_main_process_sweeps_and_releases_the_lease_on_sigterm(workspace):
    cluster = workspace.start_cluster()
    assert wait_until_sweeping(cluster) == cluster.proc.pid, "the main process, not a worker"
    os.kill(cluster.proc.pid, signal.SIGTERM)
    cluster.proc.wait(timeout=30)
    # Released on the way out, not left to expire: a standby can take over at once.
    lease = Lease.objects.get(key=SWEEPER_LEASE)
    assert lease.holder is None, lease.__dict__
    wait_for(
        lambda: not cluster.pids(),
        timeout=15,
        check_clusters=False,
        what="every process of the stopped cluster to exit",
    )


def test_a_standby_cluster_takes_over_within_a_lease_period_of_a_kill(workspace):
    first = workspace.start_cluster()
    wait_until_sweeping(first)
    second = workspace.start_cluster()
    wait_for(
        lambda: "standing by" in second.log_path.read_text(errors="replace"),
        timeout=45,
        what="the second cluster's sweeper to stand by",
        explain=second.log_tail,
    )
    assert sweeper_pid() == first.proc.pid
    first.kill()
    killed = time.monotonic()
    wait_for(
        lambda: sweeper_pid() == second.proc.pid,
        timeout=SWEEP_TTL + 5,
        what="the standby to take the sweeper lease over",
        explain=second.log_tail,
    )
    took = time.monotonic() - killed
    print(f"[standby took over {took:.2f} s after the kill; lease ttl {SWEEP_TTL:g} s]")
    assert took <= SWEEP_TTL + 1.5


def test_timers_fire_while_every_worker_is_busy(workspace):
    ws = workspace
    ws.pause("preview")
    # An instance waiting on its timer, run to it here before any cluster exists: a
    # cluster's claim could take it first, and this run would then step aside.
    waiting = drive(start(linear({"id": "t", "type": "timer", "duration": "PT1H"}, key="proc.t")))
    ws.watch(waiting.pk)
    timer = Timer.objects.get(instance=waiting)
    # One worker process with one run at a time (ADR 0041): with free run threads, the
    # fired timer's instance would be claimed and run on before its token is looked at.
    cluster = ws.start_cluster(GOVFLOW_Q_WORKERS="1", GOVFLOW_WORKER_RUNS="1")
    busy = instance_start(
        definition=definition_publish(document=linear(action("a"), key="proc.busy")),
        variables={"value": "busy"},
    )
    ws.watch(busy.pk)
    wait_for(
        lambda: ws.reached("preview"),
        timeout=60,
        what="the only worker to park in a step",
        explain=ws.report,
    )
    # The timer falls due behind the parked worker, with nobody free to take its work.
    Timer.objects.filter(pk=timer.pk).update(due_at=Now())
    began = time.monotonic()
    wait_for(
        lambda: Timer.objects.filter(pk=timer.pk, state="fired").exists(),
        timeout=10,
        what="the due timer to fire while the only worker is busy",
        explain=ws.report,
    )
    print(f"[timer fired {time.monotonic() - began:.2f} s after it fell due]")
    assert token(waiting.pk, "t").state == TokenState.READY
    from govflow.engine.models import Instance

    # Marked runnable with the firing (ADR 0026): the next free worker's claim takes it.
    assert Instance.objects.filter(pk=waiting.pk, runnable_at__isnull=False).exists()
    assert cluster.alive()
