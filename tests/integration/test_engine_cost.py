"""What one step costs the database: a regression guard on statements and commits.

Measured on PostgreSQL and SQLite (the same statements on both). A non-atomic step is:

    SELECT   next runnable token
    -- commit 1, the dispatch boundary --
    UPDATE   token → executing (fenced)
    SELECT   chain head
    INSERT   ledger operation (fenced)
    INSERT   checkpoint operation.recorded
    -- provider call, outside any transaction --
    -- commit 2, the observation and the projection --
    SELECT   the operation and its subject's operations
    SELECT   the subject's checkpoints (the chain is verified before a success, I7)
    UPDATE   operation → succeeded (fenced)
    INSERT   checkpoint operation.observed
    UPDATE   token → completed (fenced)
    INSERT   next token
    UPDATE   instance variables/status (fenced)

that is 12 statements and 2 commits, and no savepoint: the ledger's and the fenced writes
join the step's transaction (``recovery.api.joined``). A run adds 4 statements and
2 commits around its steps: acquire the lease, load the instance and its active tokens,
release the lease. The last step inserts no next token.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from govflow.engine.models import InstanceStatus
from govflow.engine.services.runtime import instance_run
from tests.flows import action, linear, start

pytestmark = pytest.mark.django_db(transaction=True)


def kind(sql: str) -> str:
    head = sql.split(None, 1)[0].upper()
    if head in {"BEGIN", "COMMIT"}:
        return head
    if head in {"SAVEPOINT", "RELEASE"}:
        return "SAVEPOINT"
    if sql.startswith('SELECT "engine_token"') and "\"state\" = 'ready'" in sql:
        return "NEXT"  # next_runnable: where a step begins
    return "STATEMENT"


def steps_of(queries: list[dict]) -> list[dict[str, int]]:
    """Split a run's statements at each step's first query; count each kind per step."""
    steps: list[dict[str, int]] = []
    for query in queries:
        k = kind(query["sql"])
        if k == "NEXT":
            steps.append({"STATEMENT": 0, "COMMIT": 0, "BEGIN": 0, "SAVEPOINT": 0})
            k = "STATEMENT"
        if steps:
            steps[-1][k] += 1
    return steps


def test_a_non_atomic_step_costs_twelve_statements_and_two_commits(settings):
    instance = start(linear(*(action(f"s{i}") for i in range(1, 6))))
    settings.GOVFLOW_MAX_STEPS_PER_RUN = 1
    instance_run(instance_id=instance.pk)  # the start node, so the run below is 5 actions
    settings.GOVFLOW_MAX_STEPS_PER_RUN = 500
    with CaptureQueriesContext(connection) as captured:
        report = instance_run(instance_id=instance.pk)
    assert report.steps == 5 and report.status == InstanceStatus.COMPLETED
    queries = captured.captured_queries
    totals = {
        k: sum(kind(q["sql"]) == k for q in queries) for k in ("BEGIN", "COMMIT", "SAVEPOINT")
    }
    totals["STATEMENT"] = len(queries) - sum(totals.values())
    print(f"\n5 non-atomic steps on {connection.vendor}: {totals}")
    per_step = steps_of(queries)
    for number, counts in enumerate(per_step, 1):
        print(f"  step {number}: {counts}")
    middle = {"STATEMENT": 12, "COMMIT": 2, "BEGIN": 2, "SAVEPOINT": 0}
    assert per_step[:4] == [middle] * 4
    # The last step inserts no next token; the run then releases its lease.
    assert per_step[4] == {"STATEMENT": 11 + 1, "COMMIT": 2 + 1, "BEGIN": 2 + 1, "SAVEPOINT": 0}
    assert totals == {"BEGIN": 12, "COMMIT": 12, "SAVEPOINT": 0, "STATEMENT": 63}


def test_an_atomic_step_commits_once(settings):
    instance = start(linear(action("n1", name="alpha.note"), action("n2", name="alpha.note")))
    settings.GOVFLOW_MAX_STEPS_PER_RUN = 1
    instance_run(instance_id=instance.pk)
    settings.GOVFLOW_MAX_STEPS_PER_RUN = 500
    with CaptureQueriesContext(connection) as captured:
        report = instance_run(instance_id=instance.pk)
    assert report.steps == 2 and report.status == InstanceStatus.COMPLETED
    first = steps_of(captured.captured_queries)[0]
    print(f"\nan atomic step on {connection.vendor}: {first}")
    # next token; record operation (head, insert, checkpoint); the Note; observe (operation
    # and subject, checkpoints, update, checkpoint); token; next token; instance.
    assert first["COMMIT"] == 1
    assert first["STATEMENT"] == 12
