"""A step's reads do not grow with the backlog of instances waiting to run (PostgreSQL).

Each instance waiting to run has a step ``ready`` in ``engine_token``'s ``(state,
not_before)`` index. A run's fenced row writes name their row by its primary key and also
expect a state (``recovery.api.fenced_update_row``); PostgreSQL must find the row by the
key alone. On tables whose statistics were taken while they were nearly empty (a new
deployment, a test database) it took the state index for ``id = … AND state = 'ready'``
and read every waiting instance's step at each run's first commit: a cost per instance
that grew with the backlog. Counted here from the server's index statistics, per step,
with a small backlog and with a large one.
"""

from __future__ import annotations

import pytest
from django.db import connection

from govflow.engine.services.instances import instance_start
from govflow.engine.services.runtime import instance_run
from tests.engine_helpers import publish
from tests.flows import action, linear

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = 10


@pytest.fixture(autouse=True)
def _postgresql():
    if connection.vendor != "postgresql":
        pytest.skip("the server's plans and index statistics are PostgreSQL's")


def index_tuples_read() -> int:
    """Index entries the server read in the engine's and the ledger's tables so far."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
    with connection.cursor() as cursor:  # a new transaction: the flush has happened
        cursor.execute(
            "SELECT coalesce(sum(idx_tup_read), 0) FROM pg_stat_user_indexes "
            "WHERE relname LIKE 'engine\\_%%' OR relname LIKE 'recovery\\_%%'"
        )
        return int(cursor.fetchone()[0])


def never_analysed() -> None:
    """The steps' and instances' tables as a new database has them: no statistics yet
    (the planner then estimates from their size). Needs the test server's superuser, as
    ``make test``'s own server has it; plans are made anew by a new session."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
        if not cursor.fetchone()[0]:
            pytest.skip("resetting a table's statistics needs a superuser (make test has one)")
        tables = "('engine_token'::regclass, 'engine_instance'::regclass)"
        cursor.execute(f"UPDATE pg_class SET reltuples = -1, relpages = 0 WHERE oid IN {tables}")
        cursor.execute(f"DELETE FROM pg_statistic WHERE starelid IN {tables}")
    connection.close()


def read_per_step(definition, backlog: int) -> float:
    waiting = [instance_start(definition=definition).pk for _ in range(backlog)]
    runs = [instance_start(definition=definition).pk for _ in range(RUNS)]
    instance_run(instance_id=runs[0])  # this connection's statements prepared
    before = index_tuples_read()
    for instance_id in runs[1:]:
        instance_run(instance_id=instance_id)
    read = index_tuples_read() - before
    assert len(waiting) == backlog
    return read / (5 * (RUNS - 1))


def test_a_steps_index_reads_do_not_grow_with_the_instances_waiting_to_run():
    definition = publish(linear(*(action(f"s{i}") for i in range(1, 6))))
    never_analysed()
    few = read_per_step(definition, 20)
    many = read_per_step(definition, 400)
    assert many <= few + 1, (few, many)
