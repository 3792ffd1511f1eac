"""PostgreSQL: lone statements of several threads committed together (ADR 0062).

Each thread sends its statement as a caller's whole commit (``sent_alone``) through
``recovery.shared_commits``; a statement that arrives while another thread's commit is
under way waits in line and goes in the next shared commit. The first statement here is
held at a row lock the test owns, so that the others are in line, deterministically,
when it is let go.
"""

from __future__ import annotations

import threading
import time

import pytest
from django.db import DatabaseError, OperationalError, connection, connections, transaction

from recovery.api import sent_alone
from recovery.shared_commits import (
    SharedCommits,
    lone_statement,
    shared_commits_disable,
    shared_commits_enable,
)
from tests.providers.alpha.models import Note
from tests.waiting import wait_for

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.postgres,
    pytest.mark.usefixtures("on_postgres"),
]

NOTE = Note._meta.db_table
INSERT = f"INSERT INTO {NOTE} (instance_id, text) VALUES (%s, %s) RETURNING id, txid_current()"
REFUSED = "SELECT recovery_all_written(%s), %s"
"""Refused the way a chained step sent alone is refused (SQLSTATE GF001)."""


@pytest.fixture
def shared():
    made = shared_commits_enable(company=lambda: 1, wait=0.0)
    yield made
    shared_commits_disable()


def send(sql: str, params: list, answers: dict, name: str) -> None:
    """One thread's lone statement, as the ledger sends a chained step: inside a commit
    of its own that sends nothing else (``sent_alone``)."""
    try:
        with transaction.atomic(), sent_alone(), connection.cursor() as cursor:
            answers[name] = ("row", lone_statement(cursor, sql, params))
    except DatabaseError as exc:
        answers[name] = ("error", exc)
    finally:
        connections.close_all()


def blocked_first(answers: dict) -> tuple[threading.Thread, callable]:
    """A note the test keeps locked, and a thread whose lone statement waits for it: the
    first commit under way. Returns the thread and what lets it go."""
    held = Note.objects.create(instance_id=0, text="held")
    lock = connections.create_connection("default")
    lock.set_autocommit(False)
    with lock.cursor() as cursor:
        cursor.execute(f"SELECT id FROM {NOTE} WHERE id = %s FOR UPDATE", [held.pk])
    sql = f"UPDATE {NOTE} SET text = %s WHERE id = %s RETURNING id, txid_current()"
    first = threading.Thread(target=send, args=(sql, ["first", held.pk], answers, "first"))
    first.start()
    wait_for(lambda: _waiting_on_a_lock(held.pk), what="the first statement to wait on the lock")

    def release() -> None:
        lock.commit()
        lock.close()

    return first, release


def _waiting_on_a_lock(_pk) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0] == 1


def in_line(shared: SharedCommits, count: int, statements: list[tuple[str, list]], answers):
    threads = []
    for n, (sql, params) in enumerate(statements):
        thread = threading.Thread(target=send, args=(sql, params, answers, f"t{n}"))
        thread.start()
        threads.append(thread)
    wait_for(lambda: len(shared._line) == count, what=f"{count} statements in line")
    return threads


def test_statements_waiting_behind_a_commit_share_the_next_one(shared):
    answers: dict = {}
    first, release = blocked_first(answers)
    threads = in_line(shared, 4, [(INSERT, [n, f"note {n}"]) for n in range(4)], answers)
    release()
    for thread in [first, *threads]:
        thread.join(timeout=30)

    assert answers["first"][0] == "row"
    rows = {name: answers[name][1] for name in ("t0", "t1", "t2", "t3")}
    assert all(kind == "row" for kind, _ in (answers[f"t{n}"] for n in range(4))), answers
    # One transaction for the four that waited, another for the first.
    assert len({txid for _, txid in rows.values()}) == 1
    assert rows["t0"][1] != answers["first"][1][1]
    assert (shared.commits, shared.statements) == (2, 5)
    # Each thread got its own statement's row, and every note is stored once.
    for n in range(4):
        assert Note.objects.get(pk=rows[f"t{n}"][0]).text == f"note {n}"
    assert Note.objects.filter(text__startswith="note ").count() == 4


def test_a_refused_statement_is_answered_as_alone_and_the_others_are_written_once(shared):
    answers: dict = {}
    first, release = blocked_first(answers)
    statements = [
        (INSERT, [1, "note 1"]),
        (REFUSED, ["tail", "refused"]),
        (INSERT, [3, "note 3"]),
    ]
    threads = in_line(shared, 3, statements, answers)
    release()
    for thread in [first, *threads]:
        thread.join(timeout=30)

    kind, exc = answers["t1"]
    assert kind == "error"
    assert exc.__cause__.sqlstate == "GF001"
    assert exc.__cause__.diag.message_detail == "tail"
    assert answers["t0"][0] == answers["t2"][0] == "row", (answers["t0"], answers["t2"])
    # The shared commit rolled back whole; each sent its own again, alone.
    assert answers["t0"][1][1] != answers["t2"][1][1]
    assert sorted(Note.objects.filter(text__startswith="note ").values_list("text", flat=True)) == [
        "note 1",
        "note 3",
    ]


def test_a_connection_broken_in_a_shared_commit_is_a_broken_connection_to_every_thread(shared):
    answers: dict = {}
    first, release = blocked_first(answers)
    statements = [
        (INSERT, [1, "note 1"]),
        ("SELECT pg_terminate_backend(pg_backend_pid()), %s", ["ended"]),
        (INSERT, [3, "note 3"]),
    ]
    threads = in_line(shared, 3, statements, answers)
    release()
    for thread in [first, *threads]:
        thread.join(timeout=30)

    for name in ("t0", "t1", "t2"):
        kind, exc = answers[name]
        assert kind == "error" and isinstance(exc, OperationalError), answers[name]
    # Nothing of it was committed: the server ended the session inside the transaction.
    assert not Note.objects.filter(text__startswith="note ").exists()
    # The line goes on: the next statement is sent at once.
    send(INSERT, [4, "note 4"], answers, "after")
    assert answers["after"][0] == "row"


def test_the_first_statement_waits_for_its_company_and_no_longer():
    shared = shared_commits_enable(company=lambda: 3, wait=30.0)
    try:
        answers: dict = {}
        threads = [
            threading.Thread(target=send, args=(INSERT, [n, f"note {n}"], answers, f"t{n}"))
            for n in range(3)
        ]
        started = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        # The arrival that completed the company woke the first one: it did not sleep
        # out its 30 s bound.
        assert time.monotonic() - started < 20
        assert (shared.commits, shared.statements) == (1, 3)
        assert len({answers[f"t{n}"][1][1] for n in range(3)}) == 1

        # Company that does not come: the wait ends at its bound.
        shared.wait = 0.05
        started = time.monotonic()
        send(INSERT, [9, "note 9"], answers, "alone")
        assert answers["alone"][0] == "row"
        assert time.monotonic() - started >= 0.05
        assert (shared.commits, shared.statements) == (2, 4)
    finally:
        shared_commits_disable()
