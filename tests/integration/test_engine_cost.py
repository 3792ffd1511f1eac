"""What one step costs the database: a regression guard on statements and commits.

Measured on PostgreSQL and SQLite (the same statements on both). A non-atomic step is:

    -- the dispatch boundary --
    UPDATE   token → executing (fenced)
    SELECT   chain head
    INSERT   ledger operation (fenced)
    INSERT   checkpoint operation.recorded
    COMMIT
    -- provider call, outside any transaction --
    -- the observation and the projection --
    SELECT   the operation and its subject's operations
    SELECT   the subject's checkpoints (the chain is verified before a success, I7)
    UPDATE   operation → succeeded (fenced)
    INSERT   checkpoint operation.observed
    UPDATE   token → completed (fenced)
    INSERT   next token
    UPDATE   instance variables/status (fenced)
    -- and, in the same transaction, the next step's dispatch boundary (above) --

that is 11 statements and one commit per step once steps follow each other: the commit
that records step k's outcome also records step k+1's dispatch (``dispatch_next``). No
savepoint: the ledger's and the fenced writes join the step's transaction
(``recovery.api.joined``). The next token is found in the run's own view of its tokens,
not by a query. A run adds, around its steps: acquiring the lease and loading the
instance and its active tokens (3 statements, one commit); the first step's dispatch in
its own commit when nothing before it in this run made it ready; releasing the lease,
in the commit that ended the instance (1 statement, and 1 to make sure no other branch
is stuck), or else in a commit of its own that
also checks for work released meanwhile (2 statements). The last step inserts no next
token.
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
    if sql.startswith('UPDATE "engine_token"') and '"idempotency_key" =' in sql:
        return "DISPATCH"  # token -> executing: where a non-atomic step begins
    return "STATEMENT"


def totals_of(queries: list[dict]) -> dict[str, int]:
    counts = {"BEGIN": 0, "COMMIT": 0, "SAVEPOINT": 0, "STATEMENT": 0}
    for query in queries:
        k = kind(query["sql"])
        counts["STATEMENT" if k == "DISPATCH" else k] += 1
    return counts


def steps_of(queries: list[dict]) -> list[dict[str, int]]:
    """Split a run's statements at each dispatch; count each kind per step.

    A step runs from its dispatch update to the next one: the rest of commit 1, commit 2
    and the BEGIN of the next step's commit 1.
    """
    steps: list[dict[str, int]] = []
    for query in queries:
        k = kind(query["sql"])
        if k == "DISPATCH":
            steps.append({"STATEMENT": 0, "COMMIT": 0, "BEGIN": 0, "SAVEPOINT": 0})
            k = "STATEMENT"
        if steps:
            steps[-1][k] += 1
    return steps


def test_a_non_atomic_step_costs_eleven_statements_and_one_commit(settings):
    instance = start(linear(*(action(f"s{i}") for i in range(1, 6))))
    settings.GOVFLOW_MAX_STEPS_PER_RUN = 1
    instance_run(instance_id=instance.pk)  # the start node, so the run below is 5 actions
    settings.GOVFLOW_MAX_STEPS_PER_RUN = 500
    with CaptureQueriesContext(connection) as captured:
        report = instance_run(instance_id=instance.pk)
    assert report.steps == 5 and report.status == InstanceStatus.COMPLETED
    queries = captured.captured_queries
    totals = totals_of(queries)
    print(f"\n5 non-atomic steps on {connection.vendor}: {totals}")
    per_step = steps_of(queries)
    for number, counts in enumerate(per_step, 1):
        print(f"  step {number}: {counts}")
    middle = {"STATEMENT": 11, "COMMIT": 1, "BEGIN": 1, "SAVEPOINT": 0}
    assert per_step[:4] == [middle] * 4
    # The last step inserts no next token and dispatches none (10 statements); the
    # commit that completes the instance also makes sure no other branch is stuck and
    # releases the lease (2 statements), and writes its instance.completed event (its
    # sequence number and its row, 2 statements: ADR 0032). The steps that succeed and
    # move on above emit no event and cost what they cost before.
    assert per_step[4] == {"STATEMENT": 10 + 2 + 2, "COMMIT": 2, "BEGIN": 1, "SAVEPOINT": 0}
    # Before the first dispatch: BEGIN, lease, instance, tokens, COMMIT, and its BEGIN.
    assert totals == {"BEGIN": 7, "COMMIT": 7, "SAVEPOINT": 0, "STATEMENT": 3 + 44 + 14}


def test_the_start_node_commit_carries_the_first_dispatch():
    instance = start(linear(action("s1"), action("s2")))
    with CaptureQueriesContext(connection) as captured:
        report = instance_run(instance_id=instance.pk)
    assert report.steps == 3 and report.status == InstanceStatus.COMPLETED
    transactions = transactions_of(captured.captured_queries)
    # lease + load; start node + dispatch s1; s1's outcome + dispatch s2; s2's outcome
    # and the release.
    assert len(transactions) == 4, transactions
    assert sum(kind(sql) == "DISPATCH" for sql in transactions[1]) == 1


def test_an_atomic_step_commits_once(settings):
    instance = start(linear(action("n1", name="alpha.note"), action("n2", name="alpha.note")))
    settings.GOVFLOW_MAX_STEPS_PER_RUN = 1
    instance_run(instance_id=instance.pk)
    settings.GOVFLOW_MAX_STEPS_PER_RUN = 500
    with CaptureQueriesContext(connection) as captured:
        report = instance_run(instance_id=instance.pk)
    assert report.steps == 2 and report.status == InstanceStatus.COMPLETED
    transactions = transactions_of(captured.captured_queries)
    # The lease and load, step 1, step 2 and the release.
    assert len(transactions) == 3, transactions
    first = transactions[1]
    print(f"\nan atomic step on {connection.vendor}: {len(first)} statements in one commit")
    # record operation (head, insert, checkpoint); the Note; observe (operation and
    # subject, checkpoints, update, checkpoint); token; next token; instance.
    assert len(first) == 11, first


def transactions_of(queries: list[dict]) -> list[list[str]]:
    """The statements of each BEGIN … COMMIT, in order (no statement outside one)."""
    transactions: list[list[str]] = []
    for query in queries:
        k = kind(query["sql"])
        if k == "BEGIN":
            transactions.append([])
        elif k != "COMMIT":
            assert transactions, f"a statement outside a transaction: {query['sql']}"
            transactions[-1].append(query["sql"])
    return transactions
