"""A dispatch made alone carries the engine's rows in the ledger's statement (ADR 0053).

The commit that releases a wait (the start node, a fired timer, a delivered message, an
approval) and dispatches the step it routes to, and a dispatch in a commit of its own,
write their step rows in front of the operation's insert and its checkpoint, in one
statement on PostgreSQL: the released step's move, the next step inserted already
``executing`` and the instance row; or the step's move to ``executing``. The operation is
inserted only if every row matched, and a row that matched nothing is raised as its write
alone would raise it, with nothing written. SQLite writes the same rows one by one.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from govflow.engine.models import Instance, Token, TokenState
from govflow.engine.queue import instances_claim
from govflow.engine.services.runtime import instance_run
from recovery.models import Lease, Operation
from recovery.services import operations
from tests.flows import action, linear, start

pytestmark = pytest.mark.django_db(transaction=True)

INSERT_OP = "INSERT INTO recovery_operation"


def _sent(queries) -> list[str]:
    return [q["sql"] for q in queries]


def test_a_released_waits_commit_inserts_the_next_step_executing_with_its_operation():
    instance = start(linear(action("s1"), action("s2")))
    [claim] = instances_claim(holder="pusher-1", limit=1, ttl=30)
    with CaptureQueriesContext(connection) as captured:
        report = instance_run(instance_id=instance.pk, worker="worker-1", claim=claim)
    assert report.status == "completed"
    s1 = Token.objects.get(instance=instance, node_id="s1")
    sent = _sent(captured.captured_queries)
    to_executing = [s for s in sent if _moves(s, s1.pk, "executing")]
    if connection.vendor == "postgresql":
        [statement] = [s for s in sent if INSERT_OP in s and "new_step AS (INSERT" in s]
        # The start node's move, s1 inserted executing, the instance row, s1's operation
        # and its checkpoint: one statement; s1's row is never updated to executing.
        assert "move_0 AS (UPDATE" in statement and "instance_row" in statement
        assert "'executing'" in statement.split("new_step AS", 1)[1].split("instance_row")[0]
        assert to_executing == []
    else:
        assert len(to_executing) == 1  # inserted ready, then moved


def test_a_dispatch_in_its_own_commit_moves_its_step_in_the_operations_statement(settings):
    instance = start(linear(action("s1")))
    settings.GOVFLOW_MAX_STEPS_PER_RUN = 1
    instance_run(instance_id=instance.pk)  # the start node: s1 is ready
    settings.GOVFLOW_MAX_STEPS_PER_RUN = 500
    with CaptureQueriesContext(connection) as captured:
        instance_run(instance_id=instance.pk)
    sent = _sent(captured.captured_queries)
    [insert] = [s for s in sent if INSERT_OP in s]
    s1 = Token.objects.get(instance=instance, node_id="s1")
    alone = [s for s in sent if s.startswith('UPDATE "engine_token"') and _moves(s, s1.pk)]
    if connection.vendor == "postgresql":
        assert insert.startswith("WITH first_write AS (UPDATE") and not alone
    else:
        assert len(alone) == 1
    assert Token.objects.get(instance=instance, node_id="s1").state == TokenState.COMPLETED


def _moves(sql: str, pk: int, state: str = "executing") -> bool:
    """Whether ``sql`` updates step ``pk`` to ``state``."""
    return f"SET \"state\" = '{state}'" in sql and f'"id" = {pk} ' in sql


def _before_the_insert(monkeypatch, change) -> list[str]:
    """Make ``change`` in the run's transaction before its first operation's statement;
    returns the errors that statement raised (the change rolls back with it)."""
    real = operations.insert_recorded
    raised: list[str] = []

    def changed_first(*args, **kwargs):
        if not raised:
            change()
        try:
            return real(*args, **kwargs)
        except Exception as exc:
            raised.append(type(exc).__name__)
            raise

    monkeypatch.setattr(operations, "insert_recorded", changed_first)
    return raised


def _nothing_written(instance: Instance, start_state: str) -> None:
    """The released wait's move, the next step's row and the operation: none written."""
    assert Token.objects.get(instance=instance, node_id="start").state == start_state
    assert not Token.objects.filter(instance=instance, node_id="s1").exists()
    assert not Operation.objects.filter(subject_id=str(instance.pk)).exists()


def test_a_lease_taken_over_before_the_statement_writes_nothing(monkeypatch):
    instance = start(linear(action("s1"), action("s2")))
    before = Token.objects.get(instance=instance, node_id="start").state

    def taken_by_another():
        Lease.objects.filter(key=f"instance:{instance.pk}").update(holder="other", fence=999)

    raised = _before_the_insert(monkeypatch, taken_by_another)
    report = instance_run(instance_id=instance.pk)
    assert report.stale and raised == ["StaleFence"]
    _nothing_written(instance, before)


def test_a_step_moved_meanwhile_refuses_the_whole_statement(monkeypatch):
    if connection.vendor != "postgresql":
        pytest.skip("on SQLite the released wait's move is its own statement, made before")
    instance = start(linear(action("s1"), action("s2")))
    start_token = Token.objects.get(instance=instance, node_id="start")

    def moved_by_someone():
        Token.objects.filter(pk=start_token.pk).update(state=TokenState.CANCELLED)

    raised = _before_the_insert(monkeypatch, moved_by_someone)
    with CaptureQueriesContext(connection) as captured:
        report = instance_run(instance_id=instance.pk)
    # Refused as the move alone would be: nothing of the statement, the operation
    # included, was written, and the commit rolled back (the change with it); the run
    # made the commit again from what is stored.
    assert raised == ["EngineConflict"]
    refused = next(q["sql"] for q in captured.captured_queries if INSERT_OP in q["sql"])
    assert "move_0 AS (UPDATE" in refused and report.steps == 0
    _nothing_written(instance, TokenState.READY)
    report = instance_run(instance_id=instance.pk)  # the next run, on what is stored
    assert report.status == "completed"
    assert Operation.objects.filter(subject_id=str(instance.pk)).count() == 2
