"""A step's cost grows neither with the instances waiting to run nor with the finished
ones, whatever the tables' statistics say (PostgreSQL).

Every statement of a run names its rows by a key: the instance, its steps, its
operations, its chain. PostgreSQL must find them by that key. On tables whose
statistics were taken while they were nearly empty (a new deployment, a table emptied
and analysed, a test database) the planner estimates every table at a row or none, and
any plan then looks as cheap as any other: it took the steps' ``(state, not_before)``
index to find one instance's steps, joined the chain by scanning every subject's, and
checked a dispatch's idempotency against every operation — a cost per step that grew
with the backlog and with the history (ADR 0065).

Counted here as the server counts a statement's work: the table and index blocks it
touched, per step, with a small backlog and history and with large ones, in each state
the statistics can be in. Blocks, not index entries or rows: the planner may rightly
scan a table of a few pages instead of probing an index, and that costs a few blocks
whatever it counts in rows. Each measurement's plans are made at the measured size (a
new session), as a worker's are after autovacuum's analyse of a grown table.
"""

from __future__ import annotations

import itertools

import pytest
from django.db import connection

from govflow.engine.models import Instance
from govflow.engine.services.instances import instance_start
from govflow.engine.services.runtime import instance_run
from govflow.engine.states import InstanceStatus
from tests.engine_helpers import publish
from tests.flows import action, linear

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = 10
GROWTH = 1.5  # blocks per step may grow by this factor while the tables grow ten- to twentyfold
TABLES = (
    "engine_definition",
    "engine_instance",
    "engine_token",
    "engine_incident",
    "recovery_operation",
    "recovery_checkpoint",
    "recovery_incident",
    "recovery_lease",
)
_values = itertools.count()


@pytest.fixture(autouse=True)
def _postgresql():
    if connection.vendor != "postgresql":
        pytest.skip("the server's plans and index statistics are PostgreSQL's")


@pytest.fixture(autouse=True)
def _no_autovacuum(_postgresql):
    """The tables' statistics stay in the state each case sets, and the blocks counted are
    the runs' own: an autovacuum pass meanwhile (a busy machine makes one likelier) would
    analyse the tables mid-measurement and add its own blocks to the count."""
    with connection.cursor() as cursor:
        for table in TABLES:
            cursor.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = off)")
    yield
    with connection.cursor() as cursor:
        for table in TABLES:
            cursor.execute(f"ALTER TABLE {table} RESET (autovacuum_enabled)")


def blocks_touched() -> int:
    """Table and index blocks the server read or found in its buffers for the engine's
    and the ledger's tables so far."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
    with connection.cursor() as cursor:  # a new transaction: the flush has happened
        cursor.execute(
            "SELECT coalesce(sum(coalesce(heap_blks_hit, 0) + coalesce(heap_blks_read, 0)"
            " + coalesce(idx_blks_hit, 0) + coalesce(idx_blks_read, 0)), 0) "
            "FROM pg_statio_user_tables "
            "WHERE relname LIKE 'engine\\_%%' OR relname LIKE 'recovery\\_%%'"
        )
        return int(cursor.fetchone()[0])


def statistics(tables: tuple[str, ...], *, reltuples: int, relpages: int) -> None:
    """Give ``tables`` the size statistics a table has when it was never analysed
    (``reltuples`` -1: the planner estimates from its size) or when it was analysed
    empty (0 rows on a page: the planner estimates no rows whatever its size). Needs the
    test server's superuser, as ``make test``'s own server has it; plans are made anew by
    a new session."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
        if not cursor.fetchone()[0]:
            pytest.skip("setting a table's statistics needs a superuser (make test has one)")
        oids = ", ".join(f"'{table}'::regclass" for table in tables)
        cursor.execute(
            f"UPDATE pg_class SET reltuples = %s, relpages = %s WHERE oid IN ({oids})",
            [reltuples, relpages],
        )
        cursor.execute(f"DELETE FROM pg_statistic WHERE starelid IN ({oids})")
    connection.close()


def started(definition) -> int:
    """An instance whose steps can run (each with its own input)."""
    return instance_start(definition=definition, variables={"value": f"v{next(_values)}"}).pk


def finished(definition, count: int) -> None:
    """``count`` instances run to their end: history in every table."""
    for _ in range(count):
        instance_run(instance_id=started(definition))


def analysed() -> None:
    """Statistics taken at the tables' present size, as autovacuum takes them."""
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {', '.join(TABLES)}")
    connection.close()


STATES = {
    "never analysed": lambda: statistics(TABLES, reltuples=-1, relpages=0),
    "analysed empty": lambda: statistics(TABLES, reltuples=0, relpages=1),
    "analysed at size": analysed,
}


def blocks_per_step(definition, backlog: int, state: str) -> float:
    waiting = [started(definition) for _ in range(backlog)]
    runs = [started(definition) for _ in range(RUNS)]
    STATES[state]()  # and a new session: plans made at this size
    instance_run(instance_id=runs[0])  # this session's statements prepared
    before = blocks_touched()
    steps = sum(instance_run(instance_id=instance_id).steps for instance_id in runs[1:])
    touched = blocks_touched() - before
    assert Instance.objects.filter(pk__in=runs, status=InstanceStatus.COMPLETED).count() == RUNS
    assert Instance.objects.filter(pk__in=waiting, status=InstanceStatus.RUNNING).count() == backlog
    return touched / steps


@pytest.fixture
def definition():
    return publish(linear(*(action(f"s{i}") for i in range(1, 6))))


@pytest.mark.parametrize("state", list(STATES))
def test_a_steps_cost_grows_neither_with_the_backlog_nor_with_the_history(definition, state):
    finished(definition, 20)
    few = blocks_per_step(definition, 20, state)
    finished(definition, 200)
    many = blocks_per_step(definition, 400, state)
    assert many <= few * GROWTH, (state, few, many)
