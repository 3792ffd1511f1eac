"""PostgreSQL: claimers racing for the same runnable instances never share one (ADR 0026).

Several threads (each its own connection, as the pushers of several clusters) claim from
the same marked instances at once, round after round. ``SKIP LOCKED`` lets them pass each
other by instead of waiting, and the lease taken in the same statement is the proof: no
instance is claimed twice while its lease is live, every instance is claimed, and every
lease's fence is exactly 1 (taken once, by one claim).
"""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connections

from govflow.engine.queue import instances_claim
from recovery.models import Lease
from tests.concurrency.test_lease_race import run_threads
from tests.flows import action, linear, start

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.postgres,
    pytest.mark.usefixtures("on_postgres"),
]

CLAIMERS = 4
INSTANCES = 60


def test_racing_claimers_take_each_runnable_instance_exactly_once():
    ids = [start(linear(action("a")), {"value": f"v{i}"}).pk for i in range(INSTANCES)]
    ready = threading.Barrier(CLAIMERS)

    def claimer(number: int) -> list[int]:
        got: list[int] = []
        try:
            ready.wait()
            while batch := instances_claim(holder=f"pusher-{number}", limit=3, ttl=60):
                got.extend(claim.instance_id for claim in batch)
            return got
        finally:
            connections.close_all()

    claimed = run_threads([lambda n=n: claimer(n) for n in range(CLAIMERS)])
    every = [pk for got in claimed for pk in got]
    assert sorted(every) == sorted(ids), "each instance claimed once, none left over"
    fences = dict(Lease.objects.filter(key__startswith="instance:").values_list("key", "fence"))
    assert set(fences.values()) == {1}, fences
    for number, got in enumerate(claimed):
        mine = {f"instance:{pk}" for pk in got}
        assert all(
            holder == f"pusher-{number}"
            for holder in Lease.objects.filter(key__in=mine).values_list("holder", flat=True)
        ), "each claim's leases are its claimer's"


def test_a_claim_passes_over_a_lease_row_a_paused_holder_keeps_locked():
    """A worker stopped (SIGSTOP) inside a commit keeps its lease row share-locked by its
    fenced writes. The claim must not wait for it, or every claim of the cluster would
    stall behind one paused process: that instance is passed over, the others claimed."""
    from django.db import transaction

    from govflow.engine.services.run import instance_lease_key
    from recovery import api
    from tests.dbclock import wait_until_expired

    stuck, free = (start(linear(action("a")), {"value": f"v{i}"}).pk for i in range(2))
    paused = api.lease_acquire(key=instance_lease_key(stuck), holder="paused", ttl=0.3)
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                api.lease_require_live(fence=paused, doing="write mid-commit")  # FOR SHARE
                locked.set()
                release.wait(30)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    try:
        assert locked.wait(30)
        wait_until_expired(paused.key)
        began = time.monotonic()
        claims = instances_claim(holder="pusher-b", limit=10, ttl=60)
        assert time.monotonic() - began < 5, "the claim waited for the paused holder's lock"
        assert [c.instance_id for c in claims] == [free]
    finally:
        release.set()
        holder.join(30)
    [claim] = instances_claim(holder="pusher-b", limit=10, ttl=60)
    assert claim.instance_id == stuck and claim.fence == paused.fence + 1, "taken once free"
