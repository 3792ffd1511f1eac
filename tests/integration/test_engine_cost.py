r"""What one step costs the database: a regression guard on statements and commits.

A non-atomic step, once steps follow each other, is one commit that records step k's
outcome and step k+1's dispatch boundary (``dispatch_next``, ADR 0006). Its statements:

    -- on PostgreSQL (ADR 0031, 0044, 0047, 0051) --
    SELECT   the subject's checkpoints and operations, the operation among them (one
             statement; I7: the chain is verified in Python before a success) -- only
             when the run has not verified the chain yet: a run's chained steps check
             inside their call that the rows past the run's mark are the ones it wrote
             (ADR 0051), and its first dispatch leaves that mark (ADR 0052)
    WITH     token k -> completed (fenced), token k+1 inserted already executing, the
             instance (fenced): data-modifying WITH parts, each refused as alone;
             SELECT recovery_[tail_]observe_record(...) only if they all matched: the
             tail or the chain head checked, operation k -> succeeded (fenced
             compare-and-swap), its checkpoint, operation k+1 dispatched (fenced, no open
             incident, no unsettled operation of the effect), its checkpoint: one
             statement
    -- on SQLite (or inside separate_rows() and recovery.api.multi_statement()) --
    UPDATE   token k -> completed (fenced)
    INSERT   token k+1
    UPDATE   instance (fenced)
    UPDATE   token k+1 -> executing (fenced)
    SELECT   the operation and its subject's operations
    SELECT   the subject's checkpoints
    UPDATE   operation k -> succeeded (fenced)
    INSERT   checkpoint operation.observed
    SELECT   chain head
    INSERT   operation k+1 (fenced)
    INSERT   checkpoint operation.recorded

that is 1 statement and one commit per step on PostgreSQL, 11 on SQLite (where a
statement is a call inside the process, not a round trip to a server). No savepoint: the
ledger's and the fenced writes join the step's transaction (``recovery.api.joined``). The
next token is found in the run's own view of its tokens, not by a query. A run adds,
around its steps: acquiring the lease and loading the instance and its active tokens (3
statements, in the run's first commit: ADR 0042, an unclaimed run's too since its
amendment); the first step's dispatch when nothing before it in this run made it ready
(token; the chain, read and verified where only its head was needed, so the run's mark
covers it (ADR 0052); operation and checkpoint: on PostgreSQL the token's move rides in
the statement of the operation and its checkpoint, ADR 0053); releasing the lease,
in the commit that ended the instance (1 statement, and 1 to make sure no other branch is
stuck), or else in a commit of its own that also checks for work released meanwhile (2
statements). The last step inserts no next token and records its outcome alone. A claimed
run (ADR 0026) hands the pusher's lease over where an unclaimed one acquires it, in the
same first commit, and the commit that ends the instance also clears its runnable mark
(ADR 0039).
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from govflow.engine.models import Instance, InstanceStatus, TokenState
from govflow.engine.queue import instances_claim
from govflow.engine.services.definitions import definition_publish
from govflow.engine.services.instances import instance_start
from govflow.engine.services.load import load_run
from govflow.engine.services.rows import separate_rows
from govflow.engine.services.run import instance_lease_key
from govflow.engine.services.runtime import instance_run
from govflow.engine.services.writes import _stuck_reason
from recovery import api
from tests.flows import action, linear, start

pytestmark = pytest.mark.django_db(transaction=True)


def kind(sql: str) -> str:
    head = sql.split(None, 1)[0].upper()
    if head in {"BEGIN", "COMMIT"}:
        return head
    if head in {"SAVEPOINT", "RELEASE"}:
        return "SAVEPOINT"
    if 'UPDATE "engine_token"' in sql and '"idempotency_key" =' in sql:
        return "DISPATCH"  # token -> executing: where a non-atomic step begins
    if 'INSERT INTO "engine_token"' in sql and "'executing'" in sql:
        return "DISPATCH"  # the next step inserted already executing (ADR 0047)
    return "STATEMENT"


def totals_of(queries: list[dict]) -> dict[str, int]:
    counts = {"BEGIN": 0, "COMMIT": 0, "SAVEPOINT": 0, "STATEMENT": 0}
    for query in queries:
        k = kind(query["sql"])
        counts["STATEMENT" if k == "DISPATCH" else k] += 1
    return counts


def five_steps(settings) -> list[list[str]]:
    """The commits of a run of five non-atomic steps (the start node run before)."""
    instance = start(linear(*(action(f"s{i}") for i in range(1, 6))))
    settings.GOVFLOW_MAX_STEPS_PER_RUN = 1
    instance_run(instance_id=instance.pk)  # the start node, so the run below is 5 actions
    settings.GOVFLOW_MAX_STEPS_PER_RUN = 500
    with CaptureQueriesContext(connection) as captured:
        report = instance_run(instance_id=instance.pk)
    assert report.steps == 5 and report.status == InstanceStatus.COMPLETED
    totals = totals_of(captured.captured_queries)
    assert totals["SAVEPOINT"] == 0 and totals["BEGIN"] == totals["COMMIT"] == 6, totals
    commits = transactions_of(captured.captured_queries)
    print(f"\n5 non-atomic steps on {connection.vendor}: {totals}")
    for number, statements in enumerate(commits, 1):
        print(f"  commit {number}: {len(statements)} statements")
    return commits


def test_a_non_atomic_step_is_one_commit_of_two_statements_on_postgresql(settings):
    commits = five_steps(settings)
    one_call = connection.vendor == "postgresql"
    # 5 before ADR 0044: step k's move, the next step's row and the instance row are one;
    # 3 before ADR 0047: that statement and the ledger's call are one.
    # 1 since ADR 0051: a run's later chained steps check the tail inside the call; since
    # ADR 0052 its first does too, the first dispatch having verified the chain.
    per_step = [1, 1, 1, 1] if one_call else [11] * 4
    # The lease and the load with step 1's dispatch; steps 1-4 each with the next dispatch;
    # step 5's outcome and the release, and the instance's instance.completed event (its
    # sequence number and its row: ADR 0032). No look for a stuck branch: the load found
    # none and the run made none (``Run.stuck_at_load``). The steps that succeed and move
    # on emit no event. On SQLite: step 5's move, the instance row, the observation's
    # reads, update and checkpoint, the release, the event's number and row.
    # On PostgreSQL one statement (ADR 0076): step 5's move, the instance row and the
    # event's number and row in front of the success's call, which compares the whole
    # chain with the run's instead of reading it (ADR 0038) and releases the lease.
    ending = 1 if one_call else 9
    # Step 1's dispatch alone: on PostgreSQL the chain's read, then the step's move with
    # the operation and its checkpoint in one statement (ADR 0052, 0053); on SQLite the
    # step, the head, the operation, the checkpoint.
    first = 2 if one_call else 4
    assert [len(c) for c in commits] == [3 + first, *per_step, ending]
    assert not any("engine_incident" in sql for sql in commits[-1]), commits[-1]
    if one_call:  # the ending's one statement: rows, event, success, release
        [ending_sql] = commits[-1]
        assert 'UPDATE "engine_instance"' in ending_sql, ending_sql
        assert 'INSERT INTO "events_event"' in ending_sql, ending_sql
        assert "recovery_tail_observe(" in ending_sql and "true::boolean)" in ending_sql, ending_sql
    for commit in commits[1:5]:
        assert sum(kind(sql) == "DISPATCH" for sql in commit) == 1
        assert sum("observe_record(" in sql for sql in commit) == int(one_call)
        tail = sum("recovery_tail_observe_record(" in sql for sql in commit)
        assert tail == int(one_call)
        # On PostgreSQL the next step's row is written once, already executing: no
        # statement of the commit updates it after its insert (ADR 0047).
        moved = [sql for sql in commit if "SET \"state\" = 'executing'" in sql]
        assert len(moved) == int(not one_call), moved


def test_the_separate_statements_on_postgresql_cost_eleven(settings):
    with api.multi_statement(), separate_rows():
        commits = five_steps(settings)
    event = 1 if connection.vendor == "postgresql" else 2  # the event's number and row
    assert [len(c) for c in commits] == [3 + 4, 11, 11, 11, 11, 7 + event]
    assert not any("observe_record(" in sql for c in commits for sql in c)


def test_the_start_node_commit_carries_the_first_dispatch():
    instance = start(linear(action("s1"), action("s2")))
    with CaptureQueriesContext(connection) as captured:
        report = instance_run(instance_id=instance.pk)
    assert report.steps == 3 and report.status == InstanceStatus.COMPLETED
    transactions = transactions_of(captured.captured_queries)
    # lease + load + start node + dispatch s1; s1's outcome + dispatch s2; s2's outcome
    # and the release.
    assert len(transactions) == 3, transactions
    assert "recovery_lease" in transactions[0][0], transactions[0]
    assert sum(kind(sql) == "DISPATCH" for sql in transactions[0]) == 1


def test_an_atomic_step_commits_once(settings):
    instance = start(linear(action("n1", name="alpha.note"), action("n2", name="alpha.note")))
    settings.GOVFLOW_MAX_STEPS_PER_RUN = 1
    instance_run(instance_id=instance.pk)
    settings.GOVFLOW_MAX_STEPS_PER_RUN = 500
    with CaptureQueriesContext(connection) as captured:
        report = instance_run(instance_id=instance.pk)
    assert report.steps == 2 and report.status == InstanceStatus.COMPLETED
    transactions = transactions_of(captured.captured_queries)
    # The lease and load with step 1; step 2 and the release.
    assert len(transactions) == 2, transactions
    first = transactions[0][3:]  # after the lease and the load's 3 statements
    assert "recovery_lease" in transactions[0][0], transactions[0]
    print(f"\nan atomic step on {connection.vendor}: {len(first)} statements in one commit")
    # record operation (head, insert, checkpoint); the Note; observe (operation and
    # subject, checkpoints, update, checkpoint); token; next token; instance. On
    # PostgreSQL the insert and its checkpoint are one statement, and so are the
    # observation's two reads (ADR 0035), its update and its checkpoint (ADR 0050), and
    # the token, the next token and the instance (ADR 0044; it was 9).
    assert len(first) == (6 if connection.vendor == "postgresql" else 11), first


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


def test_a_claimed_run_needs_no_commit_after_the_one_that_ended_it():
    """The claim's mark is cleared by the commit that ended the instance (ADR 0039), and
    the handover rides in the run's first commit (ADR 0042): a claimed run of a whole
    instance costs no more commits than an unclaimed one, and leaves nothing for the
    next claim."""
    instance = start(linear(*(action(f"s{i}") for i in range(1, 6))))
    [claim] = instances_claim(holder="pusher-1", limit=1, ttl=30)
    with CaptureQueriesContext(connection) as captured:
        report = instance_run(instance_id=instance.pk, worker="worker-1", claim=claim)
    assert report.steps == 6 and report.status == InstanceStatus.COMPLETED
    commits = transactions_of(captured.captured_queries)
    # The handover and load with the start node and step 1's dispatch; steps 1-4 each
    # with the next dispatch; step 5's outcome, the mark cleared and the lease released.
    assert len(commits) == 6, [len(c) for c in commits]
    assert "recovery_lease" in commits[0][0] and "fence = fence + 1" in commits[0][0]
    assert sum(kind(sql) == "DISPATCH" for sql in commits[0]) == 1
    if connection.vendor == "postgresql":
        # The start node's move rides in the statement of the new step and the instance
        # row (ADR 0044), as a step's success does: no statement of its own.
        alone = [
            s for s in commits[0] if s.startswith('UPDATE "engine_token"') and "'completed'" in s
        ]
        assert not alone, alone
        assert any(
            s.startswith("WITH live AS") and "move_0 AS" in s and "new_step" in s
            for s in commits[0]
        )
    assert any("runnable_at" in sql for sql in commits[-1])
    assert not Instance.objects.filter(pk=instance.pk, runnable_at__isnull=False).exists()
    assert instances_claim(holder="pusher-1", limit=1, ttl=30) == []


def test_an_instance_start_is_one_transaction_and_reads_nothing_back():
    """The start is one transaction (ADR 0042: a read after its commit would be one of its
    own at the server), and the instance it returns is the row it wrote: the database
    clock is read once and written as a value, so nothing is read back."""
    definition = definition_publish(document=linear(action("s1")))
    with CaptureQueriesContext(connection) as captured:
        instance = instance_start(definition=definition, variables={"value": "v1"})
    queries = captured.captured_queries
    if connection.vendor == "postgresql":
        # The new id and the clock, read before the commit; the commit is one statement
        # (ADR 0058; its round trips: test_engine_round_trips.py).
        read, *queries = queries
        assert read["sql"].startswith("SELECT nextval("), read
    transactions = transactions_of(queries)  # no statement outside one
    assert len(transactions) == 1, transactions
    if connection.vendor == "postgresql":
        assert len(transactions[0]) == 1, transactions
    stored = Instance.objects.get(pk=instance.pk)
    fields = [f.attname for f in Instance._meta.concrete_fields]
    assert {f: getattr(instance, f) for f in fields} == {f: getattr(stored, f) for f in fields}
    assert instance.runnable_at == instance.created_at == stored.tokens.get().created_at
    assert not any('FROM "engine_instance"' in sql for sql in transactions[0]), transactions
    # Marked runnable in its own insert (one mark), and its chain starts after nothing:
    # no UPDATE of the mark, no read of a head a new instance cannot have.
    assert instance.wakeups == 1
    sent = transactions[0]
    assert not any(sql.lstrip().startswith("UPDATE engine_instance") for sql in sent), sent
    assert not any("SELECT seq, link FROM" in sql for sql in sent), sent
    assert api.chain_verify(subject=api.Subject("instance", str(instance.pk))).ok


def test_a_new_subjects_projection_is_refused_where_a_chain_already_is():
    """``projection_record(new=True)`` starts a chain without reading its head: if one is
    there after all (a reused id), it is a conflict, never a chain continued."""
    subject = api.Subject("instance", "reused-1")
    api.projection_record(subject=subject, projection_fp="a" * 64, new=True)
    with pytest.raises(api.ChainConflict):
        api.projection_record(subject=subject, projection_fp="b" * 64, new=True)


def test_the_look_for_a_stuck_branch_is_made_unless_the_load_and_the_run_saw_none():
    """An ending asks whether a branch no longer active still needs an operator (a failed
    step, an open route incident). The run's load answers it for the stored rows; a step
    the run itself fails, or a route incident it opens, makes the ending ask again."""
    instance = start(linear(action("s1")))
    key = instance_lease_key(instance.pk)
    fence = api.lease_acquire(key=key, holder="t", ttl=30)
    run = load_run(instance.pk, fence)
    assert run.stuck_at_load is False
    with CaptureQueriesContext(connection) as captured:
        assert _stuck_reason(run) == ""
    assert not captured.captured_queries  # the load's answer, no statement
    [token] = run.active.values()
    with run.commit():
        run.update_token(token, TokenState.READY, state=TokenState.FAILED, reason="broken")
    assert run.stuck_since_load
    assert _stuck_reason(run).endswith("needs an operator: broken")
    # Loaded again (by this run after a refused commit, or by the next run): the load
    # itself finds the failed step.
    api.lease_release(fence=fence)
    again = load_run(instance.pk, api.lease_acquire(key=key, holder="t", ttl=30))
    assert again.stuck_at_load is True and not again.stuck_since_load
    assert _stuck_reason(again).endswith("needs an operator: broken")
