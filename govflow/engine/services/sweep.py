"""The sweep: fires due timers, re-enqueues stuck work, retries buffered messages.

One sweeper runs at a time, proven by the ``govflow:sweeper`` lease. It loops for most of
a django-q2 task's timeout, then enqueues its successor; a django-q2 schedule (every
minute, ``catch_up`` off) and every worker start enqueue one too, so a killed sweeper is
replaced within a lease period. Timers are rows, so nothing needs re-arming after a
restart: a timer that fell due while everything was down fires on the first pass.
"""

from __future__ import annotations

import datetime as dt
import logging
import time

from django.conf import settings
from django.db.models import CharField, Exists, F, OuterRef, Q, Value
from django.db.models.functions import Cast, Concat, Now

from recovery.api import (
    Fence,
    LeaseHeld,
    StaleFence,
    fenced_update,
    lease_acquire,
    lease_release_if_held,
    lease_renew,
)
from recovery.models import Lease

from ..models import Instance, InstanceStatus, Timer, Token, TokenState, TriggerDelivery, WaitKind
from ..queue import enqueue_many, enqueue_sweep
from .runtime import step_commit, worker_name
from .triggers import delivery_consume

log = logging.getLogger("govflow.engine.sweep")

SWEEPER = "govflow:sweeper"


def _setting(name: str, default: float) -> float:
    return float(getattr(settings, name, default))


def timers_fire(*, fence: Fence, limit: int = 1000) -> int:
    """Fire up to ``limit`` due timers (database clock) in one fenced commit."""
    with step_commit():
        due = list(
            Timer.objects.filter(state="scheduled", due_at__lte=Now())
            .order_by("due_at")
            .values_list("pk", "token_id", "instance_id")[:limit]
        )
        if not due:
            return 0
        fired = fenced_update(
            Timer.objects.filter(pk__in=[d[0] for d in due], state="scheduled"),
            fence=fence,
            state="fired",
            fire_fence=fence.fence,
            fired_at=Now(),
        )
        fenced_update(
            Token.objects.filter(
                pk__in=[d[1] for d in due],
                state=TokenState.WAITING,
                wait_kind=WaitKind.TIMER,
                timer__state="fired",
                timer__fire_fence=fence.fence,
            ),
            fence=fence,
            state=TokenState.READY,
            updated_at=Now(),
        )
        enqueue_many(d[2] for d in due)
    return fired


def instances_requeue(*, fence: Fence, limit: int = 500) -> int:
    """Enqueue instances with runnable or orphaned work and no live lease."""
    reenqueue_after = dt.timedelta(seconds=_setting("GOVFLOW_REENQUEUE_AFTER", 30))
    live = Lease.objects.filter(
        key=Concat(Value("instance:"), Cast(OuterRef("pk"), CharField())),
        holder__isnull=False,
        expires_at__gt=Now(),
    )
    tokens = Token.objects.filter(instance=OuterRef("pk"))
    runnable = tokens.filter(
        Q(state=TokenState.EXECUTING)
        | Q(state=TokenState.READY) & (Q(not_before__isnull=True) | Q(not_before__lte=Now()))
    )
    # A retry or poll that fell due after the instance was last queued needs a run now,
    # not after the stale-enqueue period: its backoff is what the provider asked for.
    fell_due = tokens.filter(
        state=TokenState.READY, not_before__lte=Now(), not_before__gt=OuterRef("enqueued_at")
    )
    ids = list(
        Instance.objects.filter(
            status__in=[InstanceStatus.RUNNING, InstanceStatus.WAITING, InstanceStatus.BLOCKED]
        )
        .filter(Exists(runnable))
        .exclude(Exists(live))
        .filter(
            Q(enqueued_at__isnull=True)
            | Q(enqueued_at__lt=Now() - reenqueue_after)
            | Exists(fell_due)
        )
        .values_list("pk", flat=True)[:limit]
    )
    if not ids:
        return 0
    with step_commit():
        # Proves this sweeper still holds its lease before it queues anything.
        fenced_update(Lease.objects.filter(key=fence.key), fence=fence)
        enqueue_many(ids)
    return len(ids)


def deliveries_retry(limit: int = 200) -> int:
    """Messages that arrived while their instance was between states get another try."""
    waiting_keys = Token.objects.filter(state=TokenState.WAITING, wait_kind=WaitKind.TRIGGER)
    candidates = (
        TriggerDelivery.objects.filter(state="received")
        .filter(
            Exists(
                waiting_keys.filter(
                    wait_key=Concat(OuterRef("message"), Value(":"), OuterRef("correlation"))
                )
            )
        )
        .values_list("pk", flat=True)[:limit]
    )
    return sum(1 for pk in list(candidates) if delivery_consume(delivery_id=pk))


def sweep_once(*, fence: Fence) -> dict[str, int]:
    return {
        "timers": timers_fire(fence=fence),
        "requeued": instances_requeue(fence=fence),
        "deliveries": deliveries_retry(),
    }


def _sweeper_renewing(ttl: float, tick: float) -> bool:
    remaining = (
        Lease.objects.filter(key=SWEEPER, holder__isnull=False)
        .annotate(left=F("expires_at") - Now())
        .values_list("left", flat=True)
        .first()
    )
    if remaining is None:
        return False
    return remaining.total_seconds() > ttl - max(2.0, 4 * tick)


def sweep_loop(*, duration: float | None = None, chain: bool = True) -> dict:
    """Run the sweeper for ``duration`` seconds if no other sweeper is alive."""
    ttl = _setting("GOVFLOW_SWEEP_LEASE_TTL", 10)
    tick = _setting("GOVFLOW_SWEEP_TICK", 0.25)
    full_every = _setting("GOVFLOW_SWEEP_FULL_EVERY", 2)  # buffered-message retries
    duration = _setting("GOVFLOW_SWEEP_DURATION", 40) if duration is None else duration
    holder = worker_name()
    fence = None
    give_up = time.monotonic() + ttl + 1
    while fence is None:
        try:
            fence = lease_acquire(key=SWEEPER, holder=holder, ttl=ttl)
        except LeaseHeld:
            # A live sweeper renews every tick, so its lease always has nearly the whole
            # ttl left: leave at once and keep this worker free. Only a lease that is
            # running out (its holder stopped renewing: killed or stuck) is worth waiting
            # for, so a replacement takes over as soon as it expires.
            if _sweeper_renewing(ttl, tick) or time.monotonic() > give_up:
                return {"skipped": "another sweeper is alive"}
            time.sleep(min(1.0, ttl / 4))
    stats = {"timers": 0, "requeued": 0, "deliveries": 0, "passes": 0}
    deadline = time.monotonic() + duration
    last_full = 0.0
    try:
        while True:
            fired = timers_fire(fence=fence)
            stats["timers"] += fired
            stats["requeued"] += instances_requeue(fence=fence)
            if time.monotonic() - last_full >= full_every:
                stats["deliveries"] += deliveries_retry()
                last_full = time.monotonic()
            stats["passes"] += 1
            lease_renew(fence=fence, ttl=ttl)
            if time.monotonic() >= deadline:
                break
            if not fired:
                time.sleep(tick)
        if chain:
            enqueue_sweep()
    except StaleFence:
        log.warning("sweeper lost its lease; another sweeper carries on")
        return stats
    finally:
        lease_release_if_held(fence=fence)
    return stats
