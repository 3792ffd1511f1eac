"""The engine benchmark's pause scenario counts what the paused cluster held, and only that.

``make bench`` measured "2 of 14 leases of a SIGSTOPped cluster never taken over": the
leases it watched included the other cluster's own running instances, whose fences never
grow once they complete and release. These check the two reads the scenario (and
``make chaos``) judge a takeover by, on PostgreSQL, where the benchmark runs.
"""

from __future__ import annotations

import pytest
from django.db import connection

from bench.engine import govflow_db as gdb
from govflow.engine.models import Instance
from govflow.engine.services.run import instance_lease_key
from recovery import api
from tests.dbclock import wait_until_expired
from tests.flows import action, linear, start

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def postgresql_only():
    if connection.vendor != "postgresql":
        pytest.skip("the benchmark runs on PostgreSQL only (clock_timestamp, ANY)")


def test_the_paused_clusters_leases_are_its_own_processes_only():
    mine, theirs = (start(linear(action("a")), {"value": v}).pk for v in ("m", "t"))
    api.lease_acquire(key=instance_lease_key(mine), holder="host:101:1+pg", ttl=60)
    api.lease_acquire(key=instance_lease_key(theirs), holder="host:202:1+pg", ttl=60)
    assert gdb.held_leases([mine, theirs], {101}) == {instance_lease_key(mine): 1}
    assert len(gdb.held_leases([mine, theirs])) == 2, "without pids: every live lease"


def test_taken_over_is_a_newer_fence_and_released_with_nothing_due_needs_no_takeover():
    expired, ended, stopped_with_work = (
        start(linear(action("a")), {"value": v}).pk for v in ("e", "d", "w")
    )
    held = {}
    for pk in (expired, ended, stopped_with_work):
        lease = api.lease_acquire(key=instance_lease_key(pk), holder="host:101:1+pg", ttl=0.5)
        held[lease.key] = lease.fence
    # The paused holder's last commits, in flight at the stop: one instance ended, one
    # stopped at its budget with work left (still marked, due now).
    for pk in (ended, stopped_with_work):
        api.lease_release(
            fence=api.Fence(key=instance_lease_key(pk), holder="host:101:1+pg", fence=1)
        )
    Instance.objects.filter(pk=ended).update(runnable_at=None)
    assert gdb.takeover_progress(held) == (set(), {instance_lease_key(ended)})
    wait_until_expired(instance_lease_key(expired))
    api.lease_acquire(key=instance_lease_key(expired), holder="host:303:1+pg", ttl=60)
    api.lease_acquire(key=instance_lease_key(stopped_with_work), holder="host:303:1+pg", ttl=60)
    taken, released = gdb.takeover_progress(held)
    assert taken == {instance_lease_key(expired), instance_lease_key(stopped_with_work)}
    assert released == {instance_lease_key(ended)}
