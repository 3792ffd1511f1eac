"""A worker stopped inside a transaction cannot keep its lease row locked past the lease.

``manage.py qcluster`` sets PostgreSQL's ``idle_in_transaction_session_timeout`` to the
lease TTL on its processes' connections (``cluster.idle_transactions_ended``, ADR 0035).
The tests stop nothing: a second connection opens a transaction, takes the ``FOR SHARE``
lock a fenced write takes on its lease row, and then sends nothing more — what a worker
SIGSTOPped between two statements of a step's commit looks like to the server.
"""

from __future__ import annotations

import time

import pytest
from django.db import DatabaseError, connection

from govflow.engine.cluster import idle_limited, idle_transactions_ended
from govflow.engine.db import application_named
from recovery import api
from tests.dbclock import wait_until_expired

pytestmark = pytest.mark.django_db(transaction=True)


def stopped_worker(key: str, *, idle_limit: float | None):
    """A connection idle in a transaction that holds the lease row's share lock."""
    worker = connection.copy()
    if idle_limit is not None:
        options = worker.settings_dict["OPTIONS"]
        worker.settings_dict["OPTIONS"] = idle_limited(options, seconds=idle_limit)
    worker.set_autocommit(False)
    with worker.cursor() as cursor:
        cursor.execute("SELECT fence FROM recovery_lease WHERE key = %s FOR SHARE", [key])
        assert cursor.fetchone() is not None
    return worker


def take_over(key: str) -> tuple[api.Fence, float]:
    """The next holder's acquisition; gives up after 10 s instead of waiting for ever."""
    started = time.monotonic()
    with connection.cursor() as cursor:
        cursor.execute("SET lock_timeout = '10s'")
    try:
        fence = api.lease_acquire(key=key, holder="next-worker", ttl=60)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")
    return fence, time.monotonic() - started


def test_a_stopped_workers_session_is_ended_and_its_lease_taken_over(on_postgres):
    key = "lease:idle-in-transaction"
    first = api.lease_acquire(key=key, holder="stopped-worker", ttl=1)
    worker = stopped_worker(key, idle_limit=1.5)
    try:
        wait_until_expired(key)
        fence, waited = take_over(key)
        assert fence.fence == first.fence + 1 and fence.holder == "next-worker"
        assert waited < 5, f"the takeover waited {waited:.1f} s for the stopped session"
        with pytest.raises(DatabaseError), worker.cursor() as cursor:
            # The worker resumes: its session is gone, its transaction rolled back.
            cursor.execute("SELECT 1")
            cursor.fetchone()
    finally:
        worker.close()


def test_without_the_limit_the_takeover_waits_for_the_stopped_worker(on_postgres):
    """Why the setting exists: the expired lease alone does not free the row."""
    key = "lease:idle-without-limit"
    api.lease_acquire(key=key, holder="stopped-worker", ttl=1)
    worker = stopped_worker(key, idle_limit=None)
    try:
        wait_until_expired(key)
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '1500ms'")
        with pytest.raises(DatabaseError, match="lock timeout"):
            api.lease_acquire(key=key, holder="next-worker", ttl=60)
    finally:
        worker.rollback()
        worker.close()
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")


def test_the_cluster_sets_the_limit_at_the_lease_ttl_on_postgresql(settings):
    settings.GOVFLOW_LEASE_TTL = 7
    saved = dict(connection.settings_dict.get("OPTIONS", {}))
    try:
        idle_transactions_ended()
        options = connection.settings_dict.get("OPTIONS", {})
        if connection.vendor != "postgresql":
            assert options == saved, "SQLite has no such setting; nothing changes"
            return
        worker = connection.copy()
        with worker.cursor() as cursor:
            cursor.execute("SHOW idle_in_transaction_session_timeout")
            assert cursor.fetchone()[0] == "7s"
        worker.close()
    finally:
        connection.settings_dict["OPTIONS"] = saved


def test_a_limit_given_in_the_options_is_kept():
    given = {"options": "-c idle_in_transaction_session_timeout=5000", "sslmode": "require"}
    assert idle_limited(given, seconds=30) == given
    assert idle_limited({"options": "-c search_path=gov"}, seconds=2.5) == {
        "options": "-c search_path=gov -c idle_in_transaction_session_timeout=2500"
    }


def test_the_cluster_names_its_connections_by_role_on_postgresql():
    """``pg_stat_activity`` and the server's log tell a worker from the pusher or the
    sweeper (ADR 0042); a name the configured options give is kept."""
    saved = connection.settings_dict
    try:
        application_named("worker")
        if connection.vendor != "postgresql":
            assert connection.settings_dict is saved, "SQLite has no such setting"
            return
        assert saved.get("OPTIONS", {}).get("application_name") is None, "only this thread's"
        with connection.cursor() as cursor:
            cursor.execute("SHOW application_name")
            assert cursor.fetchone()[0] == "govflow worker"
        connection.settings_dict = {**saved, "OPTIONS": {"application_name": "gov-desk"}}
        application_named("pusher")
        assert connection.settings_dict["OPTIONS"]["application_name"] == "gov-desk"
    finally:
        connection.close()
        connection.settings_dict = saved
