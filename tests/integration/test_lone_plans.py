"""The ledger's server-side statements are planned once per session (ADR 0049).

Sent as prepared statements, the two statements of a standalone lifecycle (ADR 0040) were
planned anew at every execution whenever the server's cost estimates favoured custom
plans, and that planning was half the server's CPU per lifecycle. They are now the bodies
of two functions that keep their generic plan. This test makes the server's worst choice
for the session (``plan_cache_mode = force_custom_plan``: plan every prepared statement
anew) and counts with ``pg_stat_statements`` how often each was planned; the same for the
statements inside ``recovery_observe_record`` and ``recovery_tail_observe_record``, a
chained step's ledger call (ADR 0031, 0051).

"Once" allows a rebuild or two: PostgreSQL drops a cached plan when the statistics of a
table it reads change (autovacuum's ``ANALYZE`` of ``recovery_checkpoint`` after the tests
before this one), which no test controls. What is refused is planning at every execution,
which is what the server's worst choice gave before the functions: as many plans as calls.
PostgreSQL only;
the server ``make test`` starts preloads ``pg_stat_statements`` (``scripts/pg-server``).
"""

from __future__ import annotations

import pytest
from django.db import DatabaseError, connection, transaction

from govflow.engine.models import InstanceStatus
from govflow.engine.services.runtime import instance_run
from recovery import api
from recovery.testing import fingerprints
from tests.flows import action, linear, start

pytestmark = pytest.mark.django_db(transaction=True)

LIFECYCLES = 24
INSTANCES = 6  # of 5 steps: 4 chained steps each
REBUILDS = 2  # a cached plan dropped by a change of statistics, at most this often


@pytest.fixture
def counted():
    """The session's statements counted by ``pg_stat_statements``, planning included,
    nested ones too; every prepared statement planned anew unless told otherwise."""
    if connection.vendor != "postgresql":
        pytest.skip("plans are PostgreSQL's; SQLite has no standalone one-call path")
    with connection.cursor() as cursor:
        try:
            with transaction.atomic():
                cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                cursor.execute("SELECT count(*) FROM pg_stat_statements")
        except DatabaseError as exc:
            pytest.skip(f"pg_stat_statements is not preloaded on this server: {exc}")
        cursor.execute("SET pg_stat_statements.track = 'all'")
        cursor.execute("SET pg_stat_statements.track_planning = on")
        cursor.execute("SET plan_cache_mode = force_custom_plan")
        cursor.execute("SELECT pg_stat_statements_reset()")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET plan_cache_mode")
            cursor.execute("RESET pg_stat_statements.track_planning")
            cursor.execute("RESET pg_stat_statements.track")


def lifecycle(subject, fence, n: int) -> None:
    fps = fingerprints({"n": n})
    op = api.operation_record(
        subject=subject, step_id=f"step-{n}", action="test.notify", recovery_mode="non_atomic",
        nonce=f"{subject.id}:{n}", ordinal=0, fence=fence, **fps,
    )  # fmt: skip
    api.operation_observe(key=op.key, state="succeeded", fence=fence, result={"n": n})


def test_a_standalone_lifecycles_writes_are_planned_once_per_session(counted, subject, fence):
    for n in range(LIFECYCLES):
        lifecycle(subject, fence, n)
    assert api.chain_verify(subject).ok
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT query, calls, plans FROM pg_stat_statements "
            "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
            "AND query LIKE 'WITH ok AS%%' ORDER BY query"
        )
        writes = cursor.fetchall()
    # The dispatch write and the success, each called once per lifecycle, each planned
    # once (or rebuilt after a change of statistics) although the session asks for a new
    # plan at every execution.
    assert [calls for _, calls, _ in writes] == [LIFECYCLES, LIFECYCLES], writes
    assert all(1 <= plans <= 1 + REBUILDS for _, _, plans in writes), writes


def test_a_chained_steps_ledger_call_is_planned_once_per_session(counted):
    for _ in range(INSTANCES):
        instance = start(linear(*(action(f"s{i}") for i in range(1, 6))))
        report = instance_run(instance_id=instance.pk)
        assert report.status == InstanceStatus.COMPLETED, report
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT query, calls, plans FROM pg_stat_statements "
            "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
            "AND NOT toplevel AND query LIKE '%%p\\_%%' AND calls > 0 ORDER BY query"
        )
        inside = cursor.fetchall()
    # The statements of recovery_tail_observe_record, and of recovery_observe_record if a
    # step calls it (they name their p_ parameters): each of the 4 chained steps of each
    # instance checks its run's tail in the call (ADR 0051, 0052), whose four statements
    # write the step (ADR 0068); so each runs at least 3 times per instance. (Simple
    # expressions are evaluated without the executor and count no calls.) Each is
    # planned once (or rebuilt after a change of statistics); planned at every call, they
    # would show as many plans as calls.
    # The ending's success is one statement of recovery_tail_observe, once per instance
    # (ADR 0076): it checks the whole chain instead of reading it.
    ending = [row for row in inside if "FROM cp" in row[0]]
    chained = [row for row in inside if row not in ending]
    assert [calls for _, calls, _ in ending] == [INSTANCES], inside
    assert chained and all(calls >= 3 * INSTANCES for _, calls, _ in chained), inside
    assert all(plans <= 1 + REBUILDS for _, _, plans in inside), inside
