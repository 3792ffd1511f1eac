"""PostgreSQL: a session stalled inside a batch of statements is ended (ADR 0063).

A worker stopped (SIGSTOP) while it sends a shared commit's pipeline leaves its session
running the statements it has received, their rows locked, waiting for the rest: no
``Sync``, so no idle-in-transaction timeout. Here such a session is made on purpose: a
connection in pipeline mode sends an ``UPDATE`` and never the ``Sync``.
"""

from __future__ import annotations

import threading

import psycopg
import pytest
from django.db import connection, transaction

from govflow.engine.liveness import STALLED_SQL, stalled_sessions_end
from govflow.engine.services.sweep import SWEEPER, Sweeper
from recovery.api import lease_acquire, lease_current
from tests.providers.alpha.models import Note
from tests.waiting import wait_for

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.postgres,
    pytest.mark.usefixtures("on_postgres"),
]

NOTE = Note._meta.db_table


def session(name: str) -> psycopg.Connection:
    given = connection.settings_dict
    return psycopg.connect(
        dbname=given["NAME"],
        user=given["USER"],
        password=given["PASSWORD"],
        host=given["HOST"],
        port=given["PORT"],
        application_name=name,
        autocommit=True,
    )


def stalled(note: Note, name: str = "govflow worker") -> psycopg.Connection:
    """A session that has run an UPDATE of ``note`` in a pipeline and waits for the rest
    of its batch, which never comes."""
    raw = session(name)
    raw.pgconn.enter_pipeline_mode()
    raw.pgconn.send_query_params(
        f"UPDATE {NOTE} SET text = 'stalled' WHERE id = $1".encode(), [str(note.pk).encode()]
    )
    raw.pgconn.flush()
    wait_for(lambda: activity(raw) == ("active", "ClientRead", True), what="the stalled batch")
    return raw


def activity(raw: psycopg.Connection):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT state, wait_event, backend_xid IS NOT NULL FROM pg_stat_activity "
            "WHERE pid = %s",
            [raw.info.backend_pid],
        )
        return cursor.fetchone()


def locked(note: Note) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id FROM {NOTE} WHERE id = %s FOR UPDATE SKIP LOCKED", [note.pk])
        return cursor.fetchone() is None


def test_a_worker_session_stalled_inside_a_batch_is_ended_and_its_rows_are_free():
    note = Note.objects.create(instance_id=1, text="as it was")
    raw = stalled(note)
    try:
        assert locked(note)
        ended = wait_for(lambda: stalled_sessions_end(after=0.2), what="the session ended")
        assert ended == 1
        wait_for(lambda: activity(raw) is None, what="its server process gone")
        # Its statement rolled back with it: the row is free and as it was.
        assert not locked(note)
        note.refresh_from_db()
        assert note.text == "as it was"
        with transaction.atomic():
            Note.objects.select_for_update(nowait=True).get(pk=note.pk)
    finally:
        raw.close()


def test_the_sweeper_ends_it_once_a_lease_could_have_expired(settings):
    settings.GOVFLOW_LEASE_TTL = 0.5
    note = Note.objects.create(instance_id=1, text="as it was")
    raw = stalled(note)
    try:
        sweeper = Sweeper(holder="test-host:1:sweeper")

        def swept() -> bool:
            sweeper.run(duration=0)  # one pass
            return sweeper.stats["stalled"] == 1

        wait_for(swept, what="a sweep pass that ends the stalled session")
        assert not locked(note)
    finally:
        raw.close()


def test_a_standby_sweeper_ends_it_while_another_sweeper_holds_the_lease(settings):
    """The cluster that stopped inside a batch may be the one whose sweeper holds the
    lease: the standby of every other cluster ends the stalled session once a lease TTL
    has passed, without waiting for the sweeper's own (longer) lease to run out."""
    settings.GOVFLOW_LEASE_TTL = 0.5
    settings.GOVFLOW_SWEEP_LEASE_TTL = 60
    held = lease_acquire(key=SWEEPER, holder="stopped-cluster", ttl=60)
    note = Note.objects.create(instance_id=1, text="as it was")
    raw = stalled(note)
    stop = threading.Event()
    sweeper = Sweeper(stop=stop, holder="standby-cluster")
    standby = threading.Thread(target=sweeper.run, kwargs={"standby": True})
    standby.start()
    try:
        wait_for(lambda: activity(raw) is None, what="the stalled session ended by the standby")
        assert not locked(note)
        assert sweeper.stats["stalled"] == 1
        # It did not take the sweeper's lease: that one is still the stopped cluster's.
        assert lease_current(SWEEPER).fence == held
        assert sweeper.stats["passes"] == 0
    finally:
        stop.set()
        standby.join(timeout=10)
        raw.close()
    assert not standby.is_alive()


def test_only_govflow_sessions_stalled_inside_a_batch_for_long_enough_are_ended():
    note = Note.objects.create(instance_id=1, text="as it was")
    other_note = Note.objects.create(instance_id=2, text="as it was")
    idle_note = Note.objects.create(instance_id=3, text="as it was")
    someone_else = stalled(note, name="another application")
    recent = stalled(other_note)
    idle = session("govflow worker")  # idle in a transaction: the server's timeout's case
    idle.autocommit = False
    idle.execute(f"UPDATE {NOTE} SET text = 'idle' WHERE id = %s", [idle_note.pk])
    try:
        assert stalled_sessions_end(after=3600) == 0  # none stalled that long
        assert activity(recent) == ("active", "ClientRead", True)
        wait_for(lambda: activity(idle)[0] == "idle in transaction", what="the idle one")
        ended = stalled_sessions_end(after=0)
        assert ended == 1  # the recent GovFlow one only
        # Ending is a signal: its locks are released when its server process has gone.
        wait_for(lambda: activity(recent) is None, what="its server process gone")
        assert activity(someone_else) == ("active", "ClientRead", True)
        assert activity(idle)[0] == "idle in transaction"
        assert locked(note) and locked(idle_note) and not locked(other_note)
    finally:
        for raw in (someone_else, recent, idle):
            raw.close()


def test_a_session_of_a_role_this_one_may_not_signal_is_left_alone_without_an_error():
    note = Note.objects.create(instance_id=1, text="as it was")
    raw = stalled(note)  # the tests' role
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT rolcreaterole OR rolsuper FROM pg_roles WHERE rolname = current_user"
        )
        if not cursor.fetchone()[0]:
            raw.close()
            pytest.skip("the tests' role may not create the second role this test needs")
        cursor.execute("DROP ROLE IF EXISTS govflow_test_plain")
        cursor.execute("CREATE ROLE govflow_test_plain LOGIN PASSWORD 'plain' NOSUPERUSER")
        # It sees every session's state, as a monitoring role does (without it, another
        # role's sessions show no state, and nothing would be asked of it at all).
        cursor.execute("GRANT pg_read_all_stats TO govflow_test_plain")
    given = connection.settings_dict
    try:
        with psycopg.connect(
            dbname=given["NAME"],
            user="govflow_test_plain",
            password="plain",
            host=given["HOST"],
            port=given["PORT"],
            autocommit=True,
        ) as plain:
            # Without the role guard, pg_terminate_backend would raise here: a plain role
            # may not signal another role's session.
            rows = plain.execute(STALLED_SQL, ["govflow %", 0]).fetchall()
        assert rows == []
        assert activity(raw) == ("active", "ClientRead", True)
    finally:
        raw.close()
        with connection.cursor() as cursor:
            cursor.execute("DROP ROLE IF EXISTS govflow_test_plain")
