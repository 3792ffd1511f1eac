"""The sweep: fires due timers, marks stranded work runnable, retries buffered messages.

One sweeper runs at a time, proven by the ``govflow:sweeper`` lease (:class:`Sweeper`).
Every ``qcluster`` started through GovFlow's command runs one in its main process
(``govflow/engine/cluster.py``, ADR 0005): the one that holds the lease sweeps, the others
stand by and take over once it expires. The django-q2 task ``govflow.engine.tasks.sweep``
runs the same loop for a while and is the fallback for clusters started otherwise (a
schedule enqueues it every minute; it leaves at once while a live sweeper renews).
Timers are rows, so nothing needs re-arming after a restart: a timer that fell due while
everything was down fires on the first pass.
"""

from __future__ import annotations

import functools
import logging
import threading
import time

from django.db.models import CharField, Exists, OuterRef, Q, Value
from django.db.models.functions import Cast, Concat

from recovery.api import (
    CompiledAt,
    Fence,
    LeaseHeld,
    StaleFence,
    anchor_if_due,
    lease_acquire,
    lease_current,
    lease_expire,
    lease_release_if_held,
    lease_renew,
    lease_require_live,
    leases_held,
    leases_live,
)

from ..conf import (
    lease_ttl,
    sweep_duration,
    sweep_full_every,
    sweep_lease_ttl,
    sweep_tick,
    sweep_timer_batch,
)
from ..db import clock_read, engine_commit, engine_read
from ..liveness import LOCK_MARK, holder_is_dead, stalled_sessions_end, worker_name
from ..models import (
    DeliveryState,
    Instance,
    InstanceStatus,
    Token,
    TokenState,
    TriggerDelivery,
    WaitKind,
)
from ..queue import enqueue_sweep, instances_mark_runnable
from ..waitkeys import message_key_sql
from .chain_audit import chains_audit_if_due
from .saga_requeue import saga_requeue_candidates
from .timers import timers_fire_only
from .triggers import delivery_consume

log = logging.getLogger("govflow.engine.sweep")

SWEEPER = "govflow:sweeper"
REQUEUE_LIMIT = 500
"""Instances one sweep pass marks runnable at most."""
RENEW_AFTER = 0.25
"""The share of its lease after which the sweeper renews it (at the end of a pass)."""
STALLED_LOOK_EVERY = 0.5
"""Seconds between a standby sweeper's looks for stalled sessions (ADR 0063): one read of
``pg_stat_activity`` each, while another sweeper holds the lease."""


def instances_requeue(
    *, fence: Fence, limit: int = REQUEUE_LIMIT, ids: list[int] | None = None
) -> int:
    """Mark runnable the instances with work that may run now, no mark and no live lease.

    Every commit that makes an instance runnable marks it, and a claimed instance keeps
    its mark until its run ends (ADR 0026): what is left for the sweep is work that fell
    due with nobody to mark it — a retry's or a poll's backoff that ran out, a provider
    due to be asked again — and, as a safety net, any runnable work without a mark. Owns
    its commit (the sweeper's fence proven in it, then the marks). ``ids``: the candidates,
    read already (the sweeper's pass reads them with its other look, ADR 0042).
    """
    if ids is None:
        with engine_read():
            ids = _requeue_candidates(limit)
    if not ids:
        return 0
    with engine_commit():
        # Proves this sweeper still holds its lease before it marks anything.
        lease_require_live(fence=fence, doing="mark instances runnable")
        instances_mark_runnable(ids)
    return len(ids)


def _requeue_candidates(limit: int) -> list[int]:
    """The instances :func:`instances_requeue` marks: reads only, one read transaction."""
    # The database clock, read once: a clock that moves during the statement would keep
    # PostgreSQL from joining the EXISTS below (each would run once per instance).
    now = clock_read()
    # Ended instances whose recorded compensations a run must take up (saga_requeue).
    return _unmarked_with_work(limit)(now) + saga_requeue_candidates(now=now, limit=limit)


@functools.lru_cache(maxsize=8)
def _unmarked_with_work(limit: int) -> CompiledAt:
    """The read of :func:`_requeue_candidates`, compiled once (every sweep pass asks it)."""

    def build(now):
        lease_key = Concat(Value("instance:"), Cast(OuterRef("pk"), CharField()))
        live = Exists(leases_held().filter(key=lease_key, expires_at__gt=now))
        tokens = Token.objects.filter(instance=OuterRef("pk"))
        # An uncertain step whose provider is due to be asked (the reconciliation ladder)
        # waits like a backoff.
        asks = Q(state=TokenState.OUTCOME_UNKNOWN, wait_kind=WaitKind.RECONCILE)
        runnable = tokens.filter(
            Q(state=TokenState.EXECUTING)
            | Q(state=TokenState.READY) & (Q(not_before__isnull=True) | Q(not_before__lte=now))
            | asks & Q(not_before__lte=now)
        )
        return (
            Instance.objects.filter(
                status__in=[InstanceStatus.RUNNING, InstanceStatus.WAITING, InstanceStatus.BLOCKED],
                runnable_at__isnull=True,
            )
            .filter(Exists(runnable))
            .exclude(live)
            .values_list("pk", flat=True)[:limit]
        )

    return CompiledAt(build)


def deliveries_retry(limit: int = 200) -> int:
    """Messages that arrived while their instance was between states get another try.

    Each hand-over owns its commit (``delivery_consume``, under the delivery's lease).
    """
    key = message_key_sql()
    waiting = Token.objects.filter(
        state=TokenState.WAITING, wait_kind=WaitKind.TRIGGER, wait_key=key
    )
    # A delivery that names a tenant goes only to that tenant's steps.
    candidates = (
        TriggerDelivery.objects.filter(state=DeliveryState.RECEIVED)
        .filter(
            (Q(tenant="") & Exists(waiting))
            | Exists(waiting.filter(instance__tenant=OuterRef("tenant")))
        )
        .values_list("pk", flat=True)[:limit]
    )
    return sum(1 for pk in list(candidates) if delivery_consume(delivery_id=pk))


def dead_holders_expire(*, fence: Fence, dead: list[Fence] | None = None) -> int:
    """Expire the live instance leases of processes known to be gone.

    A worker killed mid-run leaves its instance lease live for up to
    ``GOVFLOW_LEASE_TTL``. When its holder is known dead (``liveness.holder_is_dead``: a
    process of this host that no longer exists, or, on PostgreSQL, a worker of any host
    whose liveness lock is free), the lease is expired now (``recovery.api.lease_expire``,
    conditional on holder and fence) and the instance marked runnable in the same commit:
    the next claim takes it over. Each holder process is judged once per
    pass. django-q2 tasks a dead cluster had claimed stay locked for ``retry`` seconds:
    when a death was found, every claimed task is handed out again at once (a live
    cluster's claimed tasks run twice at worst, and the instance lease makes that
    harmless). All expiries of a pass are one commit. ``dead``: those leases, read already (the
    sweeper's pass reads them with its other look, ADR 0042).
    """
    leases = _dead_holders_leases() if dead is None else dead
    expired = _dead_leases_expire(fence, leases) if leases else []
    for lease in expired:
        log.warning(
            "lease %s of %s expired: that process no longer exists", lease.key, lease.holder
        )
    if expired:
        claimed_tasks_release()
    return len(expired)


def _dead_holders_leases() -> list[Fence]:
    """The live instance leases whose holder is known dead: the leases and the liveness
    probes read in one read transaction (one at the server, not one per probe: ADR 0042);
    each holder process judged once."""
    verdicts: dict[str, bool] = {}
    dead = []
    with engine_read():
        live = leases_live().filter(key__startswith="instance:")
        for key, holder, number in list(live.values_list("key", "holder", "fence")):
            process = holder.rpartition(":")[0] + (LOCK_MARK if holder.endswith(LOCK_MARK) else "")
            if process not in verdicts:
                verdicts[process] = holder_is_dead(holder)
            if verdicts[process]:
                dead.append(Fence(key=key, holder=holder, fence=number))
    return dead


def _dead_leases_expire(fence: Fence, leases: list[Fence]) -> list[Fence]:
    """Expire dead holders' instance leases and mark their instances runnable, in one
    commit (owns it): a restart after a killed cluster finds its leases all at once, and a
    commit each made the last stranded instance wait for all the others' (ADR 0043).

    The instances keep the marks they were claimed with (``queue.KEEP_PLACE``, ADR 0037):
    they have waited longest, so the next claims take them ahead of the backlog marked
    since. Returns the leases expired (each conditional on its holder and fence).
    """
    with engine_commit():
        lease_require_live(fence=fence, doing="expire a dead holder's lease")
        expired = [lease for lease in leases if lease_expire(fence=lease)]
        instances_mark_runnable(int(lease.key.partition(":")[2]) for lease in expired)
    return expired


def claimed_tasks_release() -> int:
    """Hand out again, at once, every task a cluster has claimed and not acknowledged.

    Called when a process of this host was found dead: the tasks its cluster had claimed
    would otherwise stay locked for django-q2's ``retry`` period. A live cluster's claimed
    tasks may run twice; the instance lease makes the second run a no-op. One statement
    (its own commit).
    """
    from django.utils import timezone
    from django_q.models import OrmQ

    released = OrmQ.objects.filter(lock__gt=timezone.now()).update(lock=timezone.now())
    if released:
        log.warning("%d claimed task(s) handed out again after a process died", released)
    return released


class Sweeper:
    """The sweeper loop, shared by the cluster's sweeper thread and the sweep task.

    1. Take the ``govflow:sweeper`` lease (fence + 1, database time). While another
       sweeper holds it, a *standby* sweeper waits until that lease runs out and tries
       again; a non-standby one (the task) leaves at once if the holder is renewing, and
       otherwise waits at most one lease period for it to expire.
    2. While holding it, pass after pass: fire due timers (batch after batch without a
       pause while batches come back full), re-enqueue orphaned and stuck instances, and
       every ``GOVFLOW_SWEEP_FULL_EVERY`` seconds retry buffered trigger messages, and
       anchor new chain heads when due (``recovery.api.anchor_if_due``), audit the whole
       chains that grew when due (``chain_audit.chains_audit_if_due``); renew the lease
       after every pass. Each write is fenced, so a sweeper that lost its lease
       unnoticed changes nothing.
    3. ``StaleFence`` means another sweeper took over: a standby sweeper goes back to 1,
       the task leaves.
    4. At the end (``stop`` set, or ``duration`` passed) it releases the lease, so a
       standby takes over without waiting for it to expire.
    """

    def __init__(self, *, stop: threading.Event | None = None, holder: str | None = None):
        self.stop = stop if stop is not None else threading.Event()
        self.holder = holder or worker_name()
        self.ttl = sweep_lease_ttl()
        self.tick = sweep_tick()
        self.full_every = sweep_full_every()
        self.batch = sweep_timer_batch()
        self.stats = dict.fromkeys(
            ("timers", "dead", "stalled", "requeued", "deliveries", "passes"), 0
        )
        self.ended = ""
        """Why :meth:`run` returned: ``stopped``, ``duration``, ``skipped`` or ``lost``."""

    def run(self, *, duration: float | None = None, standby: bool = False) -> dict[str, int]:
        """Sweep for ``duration`` seconds (at least one pass), or until ``stop`` is set.

        Owns its commits; outside any transaction.
        """
        deadline = None if duration is None else time.monotonic() + duration
        while True:
            fence = self._acquire(standby=standby)
            if fence is None:
                self.ended = "stopped" if self.stop.is_set() else "skipped"
                return self.stats
            log.info("sweeping as %s", fence)
            try:
                self._sweep(fence, deadline)
                return self.stats
            except StaleFence:
                log.warning("the sweeper lost its lease; another sweeper carries on")
                self.ended = "lost"
                if not standby:
                    return self.stats
            finally:
                lease_release_if_held(fence=fence)

    def _acquire(self, *, standby: bool) -> Fence | None:
        """Step 1: the sweeper's lease, or None (each attempt owns its commit)."""
        poll = min(0.5, self.ttl / 4)
        give_up = time.monotonic() + self.ttl + 1
        announced = False
        next_stalled_look = time.monotonic()
        while not self.stop.is_set():
            lease = lease_current(SWEEPER)
            if lease is not None and holder_is_dead(lease.fence.holder):
                # Its process is gone (this host, or its liveness lock is free): take
                # over now, not at its expiry.
                if lease_expire(fence=lease.fence):
                    log.warning("the sweeper %s no longer exists; taking over", lease.fence.holder)
                    # Its cluster died with it, and with it the workers that had claimed
                    # tasks, whether or not they held an instance lease at that moment.
                    claimed_tasks_release()
                continue
            left = None if lease is None else lease.left.total_seconds()
            if left is None:
                try:
                    return lease_acquire(key=SWEEPER, holder=self.holder, ttl=self.ttl)
                except LeaseHeld:
                    # Another sweeper was quicker: look again at how long it holds.
                    self.stop.wait(0.01)
                    continue
            if not standby:
                # A live sweeper renews once a quarter of its lease has passed (ADR 0042),
                # so its lease has three quarters of the ttl left or more: leave at once
                # and keep this worker free. Only a lease that is running out (its holder
                # was killed or is stuck) is worth waiting for.
                if left > self.ttl * (1 - RENEW_AFTER) - max(2.0, 4 * self.tick) or (
                    time.monotonic() > give_up
                ):
                    return None
            else:
                if not announced:
                    log.info("standing by: another sweeper holds the lease")
                    announced = True
                if time.monotonic() >= next_stalled_look:
                    # The sweeper holding the lease may be in the cluster that stopped
                    # inside a batch; its stalled sessions are ended from here, not once
                    # its own lease has run out too (ADR 0063).
                    self.stats["stalled"] += stalled_sessions_end(after=lease_ttl())
                    next_stalled_look = time.monotonic() + STALLED_LOOK_EVERY
            # Wake up when that lease runs out, to take over as soon as it has expired.
            self.stop.wait(min(poll, max(left, 0.02)))
        return None

    def _sweep(self, fence: Fence, deadline: float | None) -> None:
        """Step 2: pass after pass under ``fence`` (each write owns its commit)."""
        last_full = last_requeue = -self.full_every
        renewed = time.monotonic()  # acquired (or renewed) just now
        while True:
            # First, before any write of the pass could wait on their rows: the sessions
            # of workers stopped inside a batch of statements (ADR 0063).
            self.stats["stalled"] += stalled_sessions_end(after=lease_ttl())
            # A burst of due timers is fired batch after batch first (a commit each, the
            # facts only), for up to a quarter of the lease; then their instances are
            # queued. A full last batch means more are due: the next pass goes on at once.
            began, fired_ids, full = time.monotonic(), [], False
            while True:
                batch = timers_fire_only(fence=fence, limit=self.batch)
                fired_ids.extend(batch)
                full = len(batch) >= self.batch
                if not full or time.monotonic() - began > self.ttl / 4:
                    break
            fired = len(fired_ids)
            self.stats["timers"] += fired
            # Look for stuck work between bursts only once a second while they last.
            if not full or time.monotonic() - last_requeue >= 1.0:
                with engine_read():  # both looks: one read transaction (ADR 0042)
                    dead, stuck = _dead_holders_leases(), _requeue_candidates(REQUEUE_LIMIT)
                self.stats["dead"] += dead_holders_expire(fence=fence, dead=dead)
                self.stats["requeued"] += instances_requeue(fence=fence, ids=stuck)
                last_requeue = time.monotonic()
                if time.monotonic() - last_full >= self.full_every:
                    self.stats["deliveries"] += deliveries_retry()
                    last_full = time.monotonic()
                anchor_if_due()  # chain heads outside the database (docs/recovery.md)
                chains_audit_if_due()  # whole chains that grew, on a slow cadence (ADR 0038)
            self.stats["passes"] += 1
            if time.monotonic() - renewed >= self.ttl * RENEW_AFTER:
                # Not every pass (a writing commit four times a second, ADR 0042); each
                # pass's fenced statements (the timers' above) still find a lost lease.
                lease_renew(fence=fence, ttl=self.ttl)
                renewed = time.monotonic()
            if deadline is not None and time.monotonic() >= deadline:
                self.ended = "duration"
                return
            if self.stop.is_set() or (not full and self.stop.wait(self.tick)):
                self.ended = "stopped"
                return


def sweep_loop(*, duration: float | None = None, chain: bool = True) -> dict:
    """The sweep task: sweep ``duration`` seconds if no other sweeper is alive.

    Having swept to the end, it enqueues its successor (``chain``), which keeps a cluster
    started without GovFlow's ``qcluster`` command sweeping between the schedule's runs.
    Owns its commits; outside any transaction.
    """
    duration = sweep_duration() if duration is None else duration
    sweeper = Sweeper()
    stats = sweeper.run(duration=duration)
    if sweeper.ended == "skipped":
        return {"skipped": "another sweeper is alive"}
    if chain and sweeper.ended == "duration":
        enqueue_sweep()
    return stats
