"""The publisher: delivers events to their subscriptions, fenced like the sweeper.

One publisher runs at a time, proven by the ``govflow:publisher`` lease; every
``qcluster`` started through GovFlow's command runs one in a thread of its main process
(``govflow/engine/cluster.py``): the one holding the lease publishes, the others stand by.

1. Take the lease (fence + 1, database time); while another live publisher holds it,
   wait until it runs out (at once when ``is_dead`` says its process is gone).
2. Pass after pass, while holding it: **fan out** events not yet fanned out into one
   delivery per matching active subscription (one commit: the events' flag is a fenced
   write), then **deliver** what is due — pending, its next attempt due, and no earlier
   event of its instance pending or dead-lettered for the same subscription (in order per
   instance). Each subscription's due deliveries go as one batch to one of
   ``GOVFLOW_WEBHOOK_CONCURRENCY`` worker threads (:class:`Deliverer`), one batch out per
   subscription at a time: a slow receiver holds up only its own events. Each attempt is
   a POST outside any transaction, bounded in all by ``GOVFLOW_WEBHOOK_TIMEOUT``; its
   outcome is recorded by the publisher's own thread with a write fenced on the lease and
   conditional on the delivery's state and attempt count. The lease is renewed every pass
   (a pass waits at most ``GOVFLOW_PUBLISHER_TICK``).
3. ``StaleFence``: another publisher took over; this one changes nothing and stands by.
4. Killed mid-attempt, a publisher recorded nothing of it: the delivery stays pending
   and the next publisher sends it again with the same event id (at least once).
"""

from __future__ import annotations

import datetime as dt
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

from django.db.models import Exists, OuterRef
from django.db.models.functions import Now

from recovery.api import (
    Fence,
    LeaseHeld,
    StaleFence,
    atomic,
    fenced_update,
    lease_acquire,
    lease_current,
    lease_expire,
    lease_release_if_held,
    lease_renew,
)

from .conf import CONCURRENCY, LEASE_TTL, MAX_ATTEMPTS, RETRY_BASE, RETRY_MAX, TICK, TIMEOUT
from .models import Delivery, DeliveryState, Event, Subscription
from .sending import Attempt, body_of, headers_of, post
from .signing import SecretUnavailable, secret_of
from .webhooks import UrlRefused, url_check

__all__ = ["PUBLISHER", "Publisher", "backoff", "deliveries_due", "events_fan_out"]

log = logging.getLogger("govflow.events")

PUBLISHER = "govflow:publisher"
BATCH = 50
FAN_OUT_BATCH = 500


def backoff(attempts: int) -> float:
    """Seconds to wait after ``attempts`` failed attempts: doubling, capped."""
    return min(RETRY_BASE.value() * 2 ** max(attempts - 1, 0), RETRY_MAX.value())


def events_fan_out(*, fence: Fence, limit: int = FAN_OUT_BATCH) -> int:
    """One delivery per active subscription that wants each new event (owns its commit)."""
    with atomic():
        events = list(Event.objects.filter(fanned_out=False).order_by("pk")[:limit])
        if not events:
            return 0
        subscriptions = list(
            Subscription.objects.filter(active=True, tenant__in={e.tenant for e in events})
        )
        # The fence check is inside this UPDATE: a stale publisher fans out nothing.
        fenced_update(
            Event.objects.filter(pk__in=[e.pk for e in events], fanned_out=False),
            fence=fence,
            fanned_out=True,
        )
        Delivery.objects.bulk_create(
            [
                Delivery(
                    subscription=s,
                    event=e,
                    instance_id=e.instance_id,
                    seq=e.seq,
                    next_attempt_at=Now(),
                    created_at=Now(),
                    updated_at=Now(),
                )
                for e in events
                for s in subscriptions
                if s.tenant == e.tenant and s.wants(e.type)
            ],
            ignore_conflicts=True,
        )
    return len(events)


def deliveries_due(limit: int = BATCH) -> list[Delivery]:
    """Pending deliveries due now, none behind an earlier one of its instance (reads)."""
    earlier = Delivery.objects.filter(
        subscription_id=OuterRef("subscription_id"),
        instance_id=OuterRef("instance_id"),
        seq__lt=OuterRef("seq"),
        state__in=[DeliveryState.PENDING, DeliveryState.DEAD],
    )
    return list(
        Delivery.objects.filter(
            state=DeliveryState.PENDING, next_attempt_at__lte=Now(), subscription__active=True
        )
        .exclude(Exists(earlier))
        .select_related("event", "subscription")
        .order_by("next_attempt_at", "pk")[:limit]
    )


def attempt(delivery: Delivery) -> Attempt:
    """Send one delivery once (outside any transaction); never raises for the receiver."""
    subscription, event = delivery.subscription, delivery.event
    try:
        url_check(subscription.url)  # a name may resolve elsewhere than when it was checked
        secret = secret_of(subscription.secret_salt, subscription.secret_key_id)
    except (UrlRefused, SecretUnavailable) as exc:
        return Attempt(False, str(exc)[:200])
    body = body_of(event)
    headers = headers_of(event, body, secret, delivery.attempts + 1)
    return post(subscription.url, body, headers, timeout=TIMEOUT.value())


def attempt_record(*, fence: Fence, delivery: Delivery, result: Attempt) -> bool:
    """Record an attempt's outcome, fenced and conditional (owns its commit)."""
    attempts = delivery.attempts + 1
    values: dict[str, object] = {
        "attempts": attempts,
        "last_outcome": result.outcome[:200],
        "updated_at": Now(),
    }
    if result.ok:
        values.update(state=DeliveryState.DELIVERED, delivered_at=Now())
    elif attempts >= MAX_ATTEMPTS.value():
        values.update(state=DeliveryState.DEAD, dead_at=Now())
    else:
        values["next_attempt_at"] = Now() + dt.timedelta(seconds=backoff(attempts))
    with atomic():
        changed = fenced_update(
            Delivery.objects.filter(
                pk=delivery.pk, state=DeliveryState.PENDING, attempts=delivery.attempts
            ),
            fence=fence,
            **values,
        )
    if changed and values.get("state") == DeliveryState.DEAD:
        log.warning("webhook delivery %s is a dead letter: %s", delivery.pk, result.outcome)
    return bool(changed)


class Publisher:
    """The publisher loop (the protocol is the module's docstring)."""

    def __init__(
        self,
        *,
        holder: str,
        stop: threading.Event | None = None,
        is_dead: Callable[[str], bool] = lambda holder: False,
    ) -> None:
        self.holder = holder
        self.stop = stop if stop is not None else threading.Event()
        self.is_dead = is_dead
        self.ttl = LEASE_TTL.value()
        self.stats = {"fanned_out": 0, "attempts": 0, "delivered": 0, "passes": 0}

    def run(self, *, standby: bool = True, passes: int | None = None) -> dict[str, int]:
        """Publish until ``stop`` is set (or ``passes`` passes); owns its commits."""
        while not self.stop.is_set():
            fence = self._acquire(standby=standby)
            if fence is None:
                return self.stats
            log.info("publishing as %s", fence)
            try:
                self._publish(fence, passes)
                return self.stats
            except StaleFence:
                log.warning("the publisher lost its lease; another publisher carries on")
            finally:
                lease_release_if_held(fence=fence)
        return self.stats

    def _acquire(self, *, standby: bool) -> Fence | None:
        while not self.stop.is_set():
            lease = lease_current(PUBLISHER)
            if lease is not None and self.is_dead(lease.fence.holder):
                lease_expire(fence=lease.fence)
                continue
            if lease is None:
                try:
                    return lease_acquire(key=PUBLISHER, holder=self.holder, ttl=self.ttl)
                except LeaseHeld:
                    self.stop.wait(0.01)
                    continue
            if not standby:
                return None
            self.stop.wait(min(0.5, max(lease.left.total_seconds(), 0.02)))
        return None

    def _publish(self, fence: Fence, passes: int | None) -> None:
        with Deliverer(CONCURRENCY.value()) as deliverer:
            while not self.stop.is_set():
                self.stats["fanned_out"] += events_fan_out(fence=fence)
                self._record(fence, deliverer.finished())
                due = [d for d in deliveries_due() if not deliverer.busy(d.subscription_id)]
                started = deliverer.start(due)
                lease_renew(fence=fence, ttl=self.ttl)
                self.stats["passes"] += 1
                if passes is not None and self.stats["passes"] >= passes:
                    self._record(fence, deliverer.drain(self.stop))
                    return
                if not started:
                    deliverer.wait(self.stop, TICK.value())

    def _record(self, fence: Fence, results: list[tuple[Delivery, Attempt]]) -> None:
        for delivery, result in results:
            self.stats["attempts"] += 1
            if attempt_record(fence=fence, delivery=delivery, result=result) and result.ok:
                self.stats["delivered"] += 1


class Deliverer:
    """Attempts for several subscriptions at once, one subscription per worker thread.

    A subscription's due deliveries go to one worker as a batch, attempted one after the
    other; while it has a batch out, its later deliveries wait (``busy``). A batch holds at
    most one delivery per instance (``deliveries_due`` leaves out any with an earlier one
    still pending), so order per instance and subscription holds. The workers only send:
    the publisher records each outcome in its own thread, fenced (``finished``), so the
    workers touch no database and a slow receiver holds up only its own subscription.
    """

    def __init__(self, workers: int) -> None:
        self.workers = max(1, workers)
        self.pool = ThreadPoolExecutor(self.workers, thread_name_prefix="govflow-webhook")
        self.out: dict[int, Future] = {}
        self.results: queue.SimpleQueue[tuple[Delivery, Attempt]] = queue.SimpleQueue()

    def __enter__(self) -> Deliverer:
        return self

    def __exit__(self, *exc) -> None:
        # Attempts still out are not waited for: unrecorded, they are sent again.
        self.pool.shutdown(wait=False, cancel_futures=True)

    def busy(self, subscription_id: int) -> bool:
        return subscription_id in self.out

    def start(self, due: list[Delivery]) -> int:
        """Hand each subscription's due deliveries to a free worker; how many batches."""
        batches: dict[int, list[Delivery]] = {}
        for delivery in due:
            batches.setdefault(delivery.subscription_id, []).append(delivery)
        started = 0
        for subscription_id, batch in batches.items():
            if len(self.out) >= self.workers:
                break
            self.out[subscription_id] = self.pool.submit(self._send, batch)
            started += 1
        return started

    def _send(self, batch: list[Delivery]) -> None:
        for delivery in batch:
            self.results.put((delivery, attempt(delivery)))

    def finished(self) -> list[tuple[Delivery, Attempt]]:
        """The outcomes sent since the last call; frees the subscriptions whose batch is
        done (its outcomes are among them: each is queued before its batch ends)."""
        done = [s for s, future in self.out.items() if future.done()]
        results = []
        while True:
            try:
                results.append(self.results.get_nowait())
            except queue.Empty:
                break
        for subscription_id in done:
            self.out.pop(subscription_id).result()  # a bug in a worker is not swallowed
        return results

    def wait(self, stop: threading.Event, seconds: float) -> None:
        """Until an attempt finishes, ``stop`` is set, or ``seconds`` pass."""
        deadline = time.monotonic() + seconds
        while not stop.is_set() and time.monotonic() < deadline:
            if (
                self.out
                and wait(list(self.out.values()), timeout=0.02, return_when=FIRST_COMPLETED)[0]
            ):
                return
            if not self.results.empty():
                return
            if not self.out:
                stop.wait(min(0.05, max(0.0, deadline - time.monotonic())))

    def drain(self, stop: threading.Event) -> list[tuple[Delivery, Attempt]]:
        """Every outcome of the attempts out now (for a bounded run: ``passes``)."""
        while self.out and not stop.is_set():
            wait(list(self.out.values()), timeout=0.1)
            if all(f.done() for f in self.out.values()):
                break
        return self.finished()
