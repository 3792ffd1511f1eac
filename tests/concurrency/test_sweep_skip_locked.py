"""PostgreSQL: the sweep passes over a timer another transaction holds, and fires it later.

A thread (its own connection) locks one due timer's row, as an operator's transaction
would; the sweep's batch must neither wait for that lock nor fire the locked timer.
"""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connections, transaction

from govflow.engine.models import Timer
from govflow.engine.services.sweep import SWEEPER
from govflow.engine.services.timers import timers_fire
from recovery import api
from tests.integration.test_engine_sweep import queued_instances, waiting_on_timers

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.postgres,
    pytest.mark.usefixtures("on_postgres"),
]


def test_a_locked_timer_is_skipped_not_waited_for():
    waiting_on_timers(3)
    held = Timer.objects.order_by("pk").first()
    locked, release = threading.Event(), threading.Event()
    errors = []

    def hold_lock():
        try:
            with transaction.atomic():
                list(Timer.objects.select_for_update().filter(pk=held.pk))
                locked.set()
                release.wait(30)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
            locked.set()
        finally:
            connections.close_all()

    thread = threading.Thread(target=hold_lock, daemon=True)
    thread.start()
    try:
        assert locked.wait(30) and not errors, errors
        fence = api.lease_acquire(key=SWEEPER, holder="sweeper-1", ttl=30)
        began = time.monotonic()
        assert timers_fire(fence=fence) == 2
        assert time.monotonic() - began < 5, "the sweep waited for the lock"
        assert Timer.objects.get(pk=held.pk).state == "scheduled"
        assert held.instance_id not in queued_instances()
    finally:
        release.set()
        thread.join(30)
    assert timers_fire(fence=fence) == 1, "fired on the next pass"
    assert Timer.objects.get(pk=held.pk).state == "fired"
