"""A slow receiver holds up only its own subscription; an attempt has one total timeout.

Conditions are waited for (polled), never fixed sleeps.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest

from govflow.events.models import Delivery, DeliveryState
from govflow.events.publisher import Publisher
from govflow.events.sending import post
from tests.events.receiver import Receiver
from tests.flows import action, drive, linear, start

pytestmark = pytest.mark.django_db


def stop_when(condition, stop: threading.Event, timeout: float = 60.0) -> threading.Thread:
    """A watcher that sets ``stop`` once ``condition()`` holds (or ``timeout`` passed)."""

    def watch():
        deadline = time.monotonic() + timeout
        while not condition() and time.monotonic() < deadline:
            time.sleep(0.02)
        stop.set()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    return watcher


def test_a_slow_receiver_does_not_hold_up_a_fast_one(settings, subscribe):
    settings.GOVFLOW_WEBHOOK_TIMEOUT = 15  # the slow one is held, not timed out
    with Receiver([200]) as slow, Receiver([200]) as fast:
        slow.hold = True
        subscribe(slow.url)
        subscribe(fast.url)
        instances = [drive(start(linear(action("a")))) for _ in range(3)]
        stop = threading.Event()
        stop_when(lambda: len(fast.received) >= 6, stop)
        Publisher(holder="publisher-1", stop=stop).run(standby=False)
        # Every event reached the fast receiver while the slow one still holds its first.
        assert len(fast.received) == 6
        assert slow.held.is_set() and len(slow.received) == 1
        for instance in instances:
            seqs = [r.json["seq"] for r in fast.received if r.json["instance"] == instance.pk]
            assert seqs == [1, 2], "out of order for one instance"
        slow.hold = False
        slow.release.set()
        for _ in range(200):
            if {r.event_id for r in slow.received} >= {r.event_id for r in fast.received}:
                break
            Publisher(holder="publisher-1").run(standby=False, passes=1)
    # At least once: the held attempt was never recorded, so it came again (same id).
    assert {r.event_id for r in slow.received} == {r.event_id for r in fast.received}
    for instance in instances:
        firsts = {}
        for r in slow.received:
            if r.json["instance"] == instance.pk:
                firsts.setdefault(r.json["seq"], len(firsts))
        assert list(firsts) == [1, 2], "out of order for one instance"
    assert set(Delivery.objects.values_list("state", flat=True)) == {DeliveryState.DELIVERED}


def test_at_most_the_configured_number_of_subscriptions_are_delivered_to_at_once(
    settings, subscribe
):
    settings.GOVFLOW_WEBHOOK_CONCURRENCY = 1
    settings.GOVFLOW_WEBHOOK_TIMEOUT = 15
    with Receiver([200]) as slow, Receiver([200]) as fast:
        slow.hold = True
        subscribe(slow.url)
        subscribe(fast.url)
        start(linear(action("a")))
        stop = threading.Event()
        publisher = Publisher(holder="publisher-1", stop=stop)
        seen: dict[str, tuple[int, int]] = {}

        def ten_passes_while_held() -> bool:
            if slow.held.is_set() and "held" not in seen:
                seen["held"] = (len(fast.received), publisher.stats["passes"])
            return "held" in seen and publisher.stats["passes"] >= seen["held"][1] + 10

        stop_when(ten_passes_while_held, stop)
        publisher.run(standby=False)
        assert "held" in seen, "the slow receiver was never reached"
        # One worker, busy with the slow receiver: ten passes later the fast one has
        # received nothing more (at most the event it got before the slow one was reached).
        assert len(fast.received) == seen["held"][0] <= 1
        slow.hold = False
        slow.release.set()


class Trickle:
    """A server that answers one byte at a time, each well within a socket timeout."""

    def __init__(self, every: float) -> None:
        self.every = every
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen()
        self.done = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}/hook"

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            conn.recv(65536)
            for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n":
                if self.done.is_set():
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return
                self.done.wait(self.every)

    def close(self) -> None:
        self.done.set()
        self.listener.close()


def test_the_timeout_bounds_the_whole_attempt_not_each_read():
    trickle = Trickle(every=0.1)  # 38 bytes: about 4 s in all, 0.1 s per read
    try:
        began = time.monotonic()
        result = post(trickle.url, b"{}", {"Content-Type": "application/json"}, timeout=0.5)
        took = time.monotonic() - began
    finally:
        trickle.close()
    assert (result.ok, result.outcome) == (False, "timed out after 0.5 s")
    assert took < 2.0, f"the attempt took {took:.1f} s; its timeout is 0.5 s in all"
