"""A claimed run's lease handover rides in its first commit (ADR 0042).

The worker takes the claimed lease over and loads the instance in a transaction that the
run's first commit closes (``services/handover.py``). What must still hold: a worker that
dies before that commit changed nothing and leaves the lease with the pusher that claimed
it, so the next claim after the lease runs the instance and each effect happens once; a
first commit that fails rolls back alone and the run carries on under its lease; an
unexpected error in the window still releases the lease and defers the mark.
"""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from govflow.engine.models import Instance, InstanceStatus
from govflow.engine.queue import instances_claim
from govflow.engine.services import dispatch as dispatch_module
from govflow.engine.services import opening, steps
from govflow.engine.services.runtime import instance_run
from recovery import api
from recovery.models import Lease
from tests.engine_helpers import chain_ok
from tests.flows import action, linear, start
from tests.providers.alpha import effects

pytestmark = pytest.mark.django_db(transaction=True)


def lease_of(instance: Instance) -> Lease:
    return Lease.objects.get(key=f"instance:{instance.pk}")


def test_a_worker_that_dies_before_its_first_commit_changed_nothing_and_the_next_claim_runs_it():
    instance = start(linear(action("a"), action("b")))
    [claim] = instances_claim(holder="pusher-1", limit=1, ttl=30)
    # The worker takes the lease over and loads the instance, then dies before the run's
    # first commit: its transaction never commits (the server rolls it back).
    fence, run = opening.handed_over_and_loaded_run(instance.pk, "worker-1", claim)
    assert fence.fence == claim.fence + 1 and run.opened.is_open
    run.opened.rollback(RuntimeError("worker killed"), again=False)
    lease = lease_of(instance)
    assert (lease.holder, lease.fence) == ("pusher-1", claim.fence), "the pusher's claim stands"
    assert effects.call_count() == 0
    # The pusher is alive, so the lease runs out by its time; then the next claim takes it.
    assert instances_claim(holder="pusher-2", limit=1, ttl=30) == []
    Lease.objects.filter(pk=lease.pk).update(expires_at=timezone.now() - dt.timedelta(seconds=1))
    [again] = instances_claim(holder="pusher-2", limit=1, ttl=30)
    assert again.instance_id == instance.pk and again.fence == claim.fence + 1
    report = instance_run(instance_id=instance.pk, worker="worker-2", claim=again)
    assert report.status == InstanceStatus.COMPLETED
    assert effects.call_count() == 2, "each effect once"
    instance.refresh_from_db()
    assert chain_ok(instance) and instance.runnable_at is None


def test_a_stale_worker_that_resumes_after_the_next_claim_changes_nothing():
    instance = start(linear(action("a")))
    [claim] = instances_claim(holder="pusher-1", limit=1, ttl=30)
    Lease.objects.filter(key=f"instance:{instance.pk}").update(
        expires_at=timezone.now() - dt.timedelta(seconds=1)
    )
    [newer] = instances_claim(holder="pusher-2", limit=1, ttl=30)
    report = instance_run(instance_id=instance.pk, worker="worker-1", claim=claim)
    assert report.skipped.startswith("claim lapsed") and effects.call_count() == 0
    assert lease_of(instance).holder == "pusher-2"
    report = instance_run(instance_id=instance.pk, worker="worker-2", claim=newer)
    assert report.status == InstanceStatus.COMPLETED and effects.call_count() == 1


def test_a_failed_first_commit_rolls_back_alone_and_the_run_keeps_its_lease(monkeypatch):
    """The start node's commit carries the handover; when it is refused (here: its chained
    dispatch), the handover is made again on its own and the run carries on."""
    instance = start(linear(action("a"), action("b")))
    [claim] = instances_claim(holder="pusher-1", limit=1, ttl=30)
    real, refused = steps.dispatch_next, []

    def refused_once(run, *args, **kwargs):
        if not refused:
            refused.append(lease_of(instance).holder)
            raise dispatch_module.ChainedDispatchRefused(api.IntegrityViolation("refused"))
        return real(run, *args, **kwargs)

    monkeypatch.setattr(steps, "dispatch_next", refused_once)
    report = instance_run(instance_id=instance.pk, worker="worker-1", claim=claim)
    assert refused == ["worker-1"], "the handover is inside the first commit"
    assert report.status == InstanceStatus.COMPLETED and not report.stale
    assert effects.call_count() == 2
    instance.refresh_from_db()
    assert chain_ok(instance) and instance.runnable_at is None


def test_an_unexpected_error_before_the_first_commit_releases_the_lease_and_defers(monkeypatch):
    instance = start(linear(action("a")))
    [claim] = instances_claim(holder="pusher-1", limit=1, ttl=30)

    def broken(*args, **kwargs):
        raise RuntimeError("a bug in planning")

    monkeypatch.setattr(steps, "dispatch_next", broken)
    with pytest.raises(RuntimeError):
        instance_run(instance_id=instance.pk, worker="worker-1", claim=claim)
    assert effects.call_count() == 0
    lease = lease_of(instance)
    # The handover was made again on its own, so the run could release its lease and
    # put the instance back in line later, as when the handover had a commit of its own.
    assert lease.holder is None and lease.fence == claim.fence + 1, "released by worker-1"
    instance.refresh_from_db()
    assert instance.runnable_at > timezone.now(), "deferred, not claimed again at once"
    monkeypatch.undo()
    assert instance_run(instance_id=instance.pk).status == InstanceStatus.COMPLETED
    assert effects.call_count() == 1


def test_an_unclaimed_runs_acquire_rides_in_its_first_commit_and_is_taken_again_if_refused(
    monkeypatch,
):
    """An unclaimed run (no claim: ``advance`` without one, an in-process run) acquires
    its lease in the transaction its first commit closes (ADR 0042 amended; the commits
    are counted in ``test_engine_cost.py``). Refused, that commit rolls the acquire back
    too; the lease is acquired again on its own, under the same fence, and the run
    carries on."""
    instance = start(linear(action("a"), action("b")))
    real, refused = steps.dispatch_next, []

    def refused_once(run, *args, **kwargs):
        if not refused:
            refused.append((lease_of(instance).holder, run.fence.fence))
            raise dispatch_module.ChainedDispatchRefused(api.IntegrityViolation("refused"))
        return real(run, *args, **kwargs)

    monkeypatch.setattr(steps, "dispatch_next", refused_once)
    report = instance_run(instance_id=instance.pk, worker="worker-1")
    assert refused == [("worker-1", 1)]
    assert report.status == InstanceStatus.COMPLETED and not report.stale
    assert effects.call_count() == 2
    lease = lease_of(instance)
    assert (lease.holder, lease.fence) == (None, 1), "the same fence, released at the end"
    instance.refresh_from_db()
    assert chain_ok(instance)


def test_an_unclaimed_run_that_dies_before_its_first_commit_leaves_no_lease():
    instance = start(linear(action("a")))
    fence, run = opening.lease_and_load(instance.pk, "worker-1", None)
    assert fence.fence == 1 and run.opened.is_open
    run.opened.rollback(RuntimeError("worker killed"), again=False)
    assert not Lease.objects.filter(key=f"instance:{instance.pk}").exists()
    assert instance_run(instance_id=instance.pk, worker="worker-2").steps == 2
    assert lease_of(instance).fence == 1, "the next run took the first fence"
