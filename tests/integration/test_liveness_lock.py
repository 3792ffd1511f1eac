"""Liveness across hosts: a worker's advisory lock tells a sweeper on any host it is gone.

A ``+pg`` lease holder holds a session-level advisory lock (``liveness.lock_key``) on a
connection of its own. While that session lives, the sweeper leaves the holder's leases
to their expiry; once the session is gone (the process died, and its socket with it), the
sweeper takes the lock, so it expires the leases at once (ADR 0022).
"""

from __future__ import annotations

import os
import time

import pytest
from django.db import connection, connections

from govflow.engine import liveness
from govflow.engine.liveness import (
    holder_is_dead,
    holder_lock_free,
    host_id,
    lock_key,
    worker_name,
)
from govflow.engine.models import InstanceStatus
from govflow.engine.services import sweep
from govflow.engine.services.run import instance_lease_key
from govflow.engine.services.sweep import instances_requeue
from recovery import api
from recovery.models import Lease
from tests.engine_helpers import marked_runnable, unmark_all
from tests.flows import action, drive, linear, start
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

OTHER_HOST = "host-elsewhere"


def sweeper_fence() -> api.Fence:
    return api.lease_acquire(key=sweep.SWEEPER, holder="sweeper-1", ttl=30)


def second_session():
    """A real second connection to the same database (another process's session)."""
    default = connections["default"]
    wrapper = type(default)(dict(default.settings_dict), alias="second")
    wrapper.inc_thread_sharing()
    return wrapper


def free_seen_by(session, host: str, pid: int) -> bool:
    """Whether ``session`` (another process's) can take the lock of ``host:pid``."""
    with session.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s, %s)", list(lock_key(host, pid)))
        return cursor.fetchone()[0]


@pytest.fixture
def pg():
    if connection.vendor != "postgresql":
        pytest.skip(
            "needs PostgreSQL: advisory locks are PostgreSQL's (SQLite keeps lease expiry, "
            "test_on_sqlite_no_lock_is_held_and_names_keep_their_form)"
        )


@pytest.fixture
def own_lock():
    """This process holds its liveness lock for the test, and gives it up after."""
    liveness.liveness_lock_enable()
    try:
        yield
    finally:
        liveness.liveness_lock_disable()


def test_a_lease_whose_holders_session_is_gone_is_expired_at_once(pg, settings):
    instance = start(linear(action("a")))
    unmark_all()
    holder = f"{OTHER_HOST}:4242:1{liveness.LOCK_MARK}"
    worker = second_session()
    with worker.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s, %s)", list(lock_key(OTHER_HOST, 4242)))
    lease = api.lease_acquire(key=instance_lease_key(instance.pk), holder=holder, ttl=3600)
    fence = sweeper_fence()
    try:
        # Alive on another host: its session holds the lock, the lease is left alone.
        assert not holder_lock_free(holder)
        assert sweep.dead_holders_expire(fence=fence) == 0
        assert Lease.objects.get(key=lease.key).expires_at is not None
        assert instances_requeue(fence=fence) == 0
    finally:
        worker.close()  # the process dies: its session, and its lock, go with it

    wait_for(lambda: holder_lock_free(holder), timeout=10, what="the lock to be free")
    began = time.monotonic()
    assert sweep.dead_holders_expire(fence=fence) == 1
    row = Lease.objects.get(key=lease.key)
    assert (row.holder, row.fence) == (lease.holder, lease.fence), "expired, not taken"
    assert marked_runnable() == [instance.pk], "marked in the commit that expired it"
    print(f"\n[lease expired {time.monotonic() - began:.3f} s after the lock was found free]")
    assert drive(instance).status == InstanceStatus.COMPLETED
    # The probe kept nothing: the key is free for the next process that gets it.
    assert holder_lock_free(holder)


def test_a_holder_without_the_mark_is_left_to_its_lease(pg):
    instance = start(linear(action("a")))
    # Nobody holds this process's lock, but the holder never said it took one (a web
    # process, a worker of an older release): a free lock proves nothing.
    holder = f"{OTHER_HOST}:4242:1"
    api.lease_acquire(key=instance_lease_key(instance.pk), holder=holder, ttl=3600)
    assert not holder_lock_free(holder) and not holder_is_dead(holder)
    assert sweep.dead_holders_expire(fence=sweeper_fence()) == 0


def test_a_cluster_process_holds_its_lock_on_its_own_connection(pg, own_lock):
    name = worker_name()
    assert name.endswith(liveness.LOCK_MARK), name
    assert not holder_lock_free(name), "this process never judges itself"
    observer = second_session()
    try:
        # Another host's sweeper cannot take it while this process lives, even after
        # the ORM connection the worker runs its steps on is closed between tasks.
        connection.close()
        assert not free_seen_by(observer, host_id(), os.getpid())
        liveness.liveness_lock_release()
        wait_for(
            lambda: free_seen_by(observer, host_id(), os.getpid()),
            timeout=10,
            what="the lock to be free",
        )
        assert worker_name().endswith(liveness.LOCK_MARK), "taken again when next named"
        assert not free_seen_by(observer, host_id(), os.getpid())
    finally:
        observer.close()


def test_on_sqlite_no_lock_is_held_and_names_keep_their_form():
    if connection.vendor != "sqlite":
        pytest.skip("SQLite behaviour: PostgreSQL holds the lock (the tests above)")
    liveness.liveness_lock_enable()
    try:
        name = worker_name()
        assert not name.endswith(liveness.LOCK_MARK), name
        assert not holder_lock_free(f"{OTHER_HOST}:4242:1{liveness.LOCK_MARK}")
    finally:
        liveness.liveness_lock_disable()


def test_the_lock_key_is_two_ints_in_govflows_class():
    classid, objid = lock_key("host-a", 123)
    assert classid == int.from_bytes(b"GFLV", "big") < 2**31
    assert -(2**31) <= objid < 2**31
    assert lock_key("host-a", 123) == (classid, objid)
    assert lock_key("host-b", 123) != (classid, objid)


def test_a_lost_lock_connection_is_replaced_at_the_next_check(pg, own_lock):
    assert worker_name().endswith(liveness.LOCK_MARK)
    observer = second_session()
    try:
        with observer.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_locks "
                "WHERE locktype = 'advisory' AND classid = %s AND objid = %s",
                [liveness.LOCK_CLASS, lock_key(host_id(), os.getpid())[1] & 0xFFFFFFFF],
            )
            assert cursor.fetchone()[0], "the lock's session was ended"
        wait_for(
            lambda: free_seen_by(observer, host_id(), os.getpid()),
            timeout=10,
            what="the lock to be free",
        )
        liveness._LOCK.checked = 0.0  # the next check is due
        assert worker_name().endswith(liveness.LOCK_MARK)
        assert not free_seen_by(observer, host_id(), os.getpid())
    finally:
        observer.close()
