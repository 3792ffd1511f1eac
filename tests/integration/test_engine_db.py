"""The engine's one clock and its per-database statements (govflow/engine/dialect.py)."""

from __future__ import annotations

import types

import pytest
from django.db import connection

from govflow.engine.db import clock, clock_read, engine_commit, engine_dialect, engine_read
from govflow.engine.models import Instance, Timer, Token, TokenState
from govflow.engine.services import timers
from govflow.engine.services.sweep import SWEEPER
from recovery import api
from tests.dbclock import db_now
from tests.integration.test_engine_sweep import waiting_on_timers

pytestmark = pytest.mark.django_db


def test_the_clock_read_once_is_the_database_clock_the_leases_use():
    before = db_now()
    read = clock_read()
    assert before <= read <= db_now()


def test_engine_statements_read_the_clock_the_ledger_reads():
    # One clock: the time when the statement runs, as every fenced write compares it.
    fence = api.lease_acquire(key=SWEEPER, holder="sweeper-1", ttl=30)
    sql, _ = timers.fire_statement(fence, 10)
    compiled = str(Token.objects.filter(not_before__lte=clock()).query)
    for text in (sql, compiled):
        assert "STATEMENT_TIMESTAMP" not in text.upper()
    assert api.dialect().now in sql
    if connection.vendor == "postgresql":
        assert "clock_timestamp()" in compiled


def test_due_timers_are_found_through_their_index_not_by_reading_every_timer():
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL: the plan of the one-statement firing")
    fence = api.lease_acquire(key=SWEEPER, holder="sweeper-1", ttl=30)
    sql, params = timers.fire_statement(fence, 10)
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(f"EXPLAIN {sql}", params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    # A clock that changes during the statement could only filter the rows read; read once,
    # it bounds the index scan, and timers due in a week are never read.
    assert "Index Cond" in plan and "due_at <=" in plan.split("Index Cond", 1)[1], plan


def test_a_sweeper_that_loses_its_lease_between_statements_changes_nothing(monkeypatch):
    """Where the firing is several statements (SQLite), each one carries the fence."""
    ids = waiting_on_timers(3)
    fence = api.lease_acquire(key=SWEEPER, holder="sweeper-1", ttl=30)
    real, written = timers.fenced_update, []

    def then_the_lease_lapses(queryset, *, fence, **values):
        count = real(queryset, fence=fence, **values)
        written.append(queryset.model)
        api.lease_expire(fence=fence)  # its holder is gone, as far as anyone can tell
        return count

    monkeypatch.setattr(timers, "fenced_update", then_the_lease_lapses)
    with pytest.raises(api.StaleFence), engine_commit():
        timers._fire_statement_by_statement(fence, 10)
    assert written == [Timer], "the tokens' write was refused by the fence"
    assert set(Timer.objects.values_list("state", flat=True)) == {"scheduled"}
    assert set(Token.objects.filter(node_id="t").values_list("state", flat=True)) == {
        TokenState.WAITING
    }
    assert Instance.objects.filter(pk__in=ids, runnable_at__isnull=True).count() == 3


def test_a_database_other_than_postgresql_or_sqlite_is_refused_with_what_to_use():
    other = types.SimpleNamespace(vendor="mysql")
    with pytest.raises(NotImplementedError, match="PostgreSQL and SQLite, not mysql"):
        engine_dialect(other)


@pytest.mark.django_db(transaction=True)
def test_reads_that_belong_together_share_a_transaction_only_where_it_costs_no_lock():
    # PostgreSQL: the sweep's clock read and the query that uses it are one server
    # transaction. SQLite: a transaction would take the write lock (BEGIN IMMEDIATE).
    with engine_read():
        grouped = connection.in_atomic_block
    assert grouped is (connection.vendor == "postgresql")
    assert not connection.in_atomic_block
