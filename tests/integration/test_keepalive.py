"""A provider call's lease is renewed by one thread per process (ADR 0030).

A call slower than its lease keeps its authority (the lease is renewed every third of
it); the renewing thread is shared by every call of the process, and nothing renews a
lease after its call returned.
"""

from __future__ import annotations

import math
import threading
import time

import pytest

from govflow.engine.models import InstanceStatus
from govflow.engine.registry import registry
from govflow.engine.services.keepalive import Keepalive
from govflow.engine.services.runtime import instance_run
from tests.engine_helpers import alpha_write, op_states
from tests.flows import action, linear, start
from tests.providers.alpha import actions as alpha


@pytest.mark.django_db(transaction=True)
def test_a_call_slower_than_its_lease_keeps_it_and_its_step_completes(settings):
    settings.GOVFLOW_LEASE_TTL = 1.0

    def slow(context):
        time.sleep(1.6)  # past the lease: only the renewals keep it
        return alpha.write.execute(context)

    with registry.override(alpha_write(execute=slow)):
        instance = start(linear(action("a")))
        report = instance_run(instance_id=instance.pk, worker="worker-1")
    assert not report.stale, "the lease was kept alive"
    assert report.status == InstanceStatus.COMPLETED
    assert op_states(instance) == ["succeeded"]


def test_one_thread_renews_every_call_of_the_process_until_it_returns():
    keeper = Keepalive()
    renewed: dict[str, int] = {"a": 0, "b": 0}

    def renewer(name):
        def renew():
            renewed[name] += 1

        return renew

    before = threading.active_count()
    a = keeper.watch(renewer("a"), interval=0.05, what="a")
    b = keeper.watch(renewer("b"), interval=0.05, what="b")
    time.sleep(0.3)
    assert threading.active_count() == before + 1, "one thread for both calls"
    a.done()
    b.done()
    counted = dict(renewed)
    assert counted["a"] >= 2 and counted["b"] >= 2, counted
    time.sleep(0.2)
    assert renewed == counted, "nothing is renewed after its call returned"


def test_done_waits_for_a_renewal_under_way():
    keeper = Keepalive()
    started, finished = threading.Event(), threading.Event()

    def slow_renew():
        started.set()
        time.sleep(0.2)
        finished.set()

    entry = keeper.watch(slow_renew, interval=0.01, what="slow")
    assert started.wait(2)
    entry.done()
    assert finished.is_set(), "the call returned only after its lease's renewal ended"


def test_a_renewal_that_fails_stops_renewing_that_lease_only():
    keeper = Keepalive()
    calls = {"lost": 0, "kept": 0}

    def lost():
        calls["lost"] += 1
        raise RuntimeError("the lease is gone")

    def kept():
        calls["kept"] += 1

    failing = keeper.watch(lost, interval=0.03, what="lost")
    working = keeper.watch(kept, interval=0.03, what="kept")
    time.sleep(0.3)
    failing.done()
    working.done()
    assert calls["lost"] == 1 and calls["kept"] >= 3, calls


def _asleep(keeper: Keepalive) -> bool:
    """Whether the keeper's thread waits for its next renewal (a deadline set)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with keeper.changed:
            if keeper.wake_at != math.inf:
                return True
        time.sleep(0.005)
    return False


def test_a_shorter_lease_watched_while_the_thread_sleeps_for_a_longer_one_is_renewed_in_time():
    keeper = Keepalive()
    long = keeper.watch(lambda: None, interval=60, what="long")
    assert _asleep(keeper)
    renewed = threading.Event()
    short = keeper.watch(renewed.set, interval=0.05, what="short")
    assert renewed.wait(5), "the thread was woken for the shorter lease, not left asleep"
    short.done()
    long.done()


def test_a_watch_whose_renewal_the_sleeping_thread_reaches_anyway_does_not_wake_it():
    """Every provider call registers its lease: waking the thread for each would hand the
    GIL back and forth at every step, although the thread's own deadline comes first."""
    keeper = Keepalive()
    first = keeper.watch(lambda: None, interval=60, what="first")
    assert _asleep(keeper)
    woken: list[int] = []
    notify_all = keeper.changed.notify_all

    def counted() -> None:
        woken.append(1)
        notify_all()

    keeper.changed.notify_all = counted
    for number in range(20):
        keeper.watch(lambda: None, interval=60, what=f"call {number}").done()
    assert woken == []
    first.done()


def test_an_idle_thread_sleeps_at_least_a_second_whatever_interval_it_saw():
    """Leases of a very short TTL must not leave the idle thread waking many times a
    second for the rest of the process."""
    keeper = Keepalive()
    renewed = threading.Event()
    entry = keeper.watch(renewed.set, interval=0.01, what="short")
    assert renewed.wait(5)
    entry.done()
    # Once it has looked again with nothing to renew, its next wake is a second away.
    longest = 0.0
    deadline = time.monotonic() + 5
    while longest <= 0.5 and time.monotonic() < deadline:
        with keeper.changed:
            if not keeper.watches and keeper.wake_at != math.inf:
                longest = max(longest, keeper.wake_at - time.monotonic())
        time.sleep(0.005)
    assert longest > 0.5, longest
