"""A chained step's rows ride in the ledger call's statement, the next step inserted once.

On PostgreSQL the commit that records step k's success and step k+1's dispatch sends the
engine's rows (step k's move, step k+1's insert, the instance row) as data-modifying
``WITH`` parts in front of ``recovery_observe_record`` (ADR 0047): step k+1 is inserted
already ``executing`` and never updated in that commit, the call runs only if every part
matched, and a part that matched nothing is refused as it was alone. On SQLite (and inside
``separate_rows()``) the rows are their own statements and step k+1 is inserted ``ready``
then updated. Either way the rows are the same (``test_step_call.py`` compares them).
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from govflow.engine.models import Instance, Token, TokenState
from govflow.engine.services import answers, settle
from govflow.engine.services.rows import separate_rows
from govflow.engine.services.runtime import instance_run
from recovery.models import Lease, Operation
from recovery.services import step_call
from tests.flows import action, linear, start

pytestmark = pytest.mark.django_db(transaction=True)

ONE_CALL = "recovery_observe_record("
TAIL_CALL = "recovery_tail_observe_record("


def _two_steps(settings) -> Instance:
    """An instance whose start node ran: step a is ready, b follows it."""
    instance = start(linear(action("a"), action("b")))
    settings.GOVFLOW_MAX_STEPS_PER_RUN = 1
    instance_run(instance_id=instance.pk)
    settings.GOVFLOW_MAX_STEPS_PER_RUN = 500
    return instance


def _chained_commit(queries: list[dict]) -> list[str]:
    """The statements of the commit that recorded a's success and b's dispatch (a
    statement outside BEGIN … COMMIT is a commit of its own: sent alone, ADR 0051)."""
    commits: list[list[str]] = []
    open_ = False
    for query in queries:
        sql = query["sql"]
        if sql.startswith("BEGIN"):
            commits.append([])
            open_ = True
        elif sql.startswith("COMMIT"):
            open_ = False
        elif open_:
            commits[-1].append(sql)
        else:
            commits.append([sql])
    [chained] = [c for c in commits if any("'b'" in s and "engine_token" in s for s in c)]
    return chained


def test_the_next_step_is_inserted_executing_and_never_updated(settings):
    instance = _two_steps(settings)
    with CaptureQueriesContext(connection) as captured:
        report = instance_run(instance_id=instance.pk)
    assert report.status == "completed" and report.steps == 2
    b = Token.objects.get(instance=instance, node_id="b")
    chained = _chained_commit(captured.captured_queries)
    updates_of_b = [s for s in chained if 'UPDATE "engine_token"' in s and f'"id" = {b.pk} ' in s]
    if connection.vendor == "postgresql":
        # One statement with the rows and the call, sent alone: a's dispatch verified the
        # chain and left the run's mark, so the call checks the tail (ADR 0051, 0052).
        assert len(chained) == 1, chained
        assert "new_step AS (INSERT" in chained[0] and TAIL_CALL in chained[0]
        assert "'executing'" in chained[0].split("new_step AS", 1)[1].split("instance_row")[0]
        assert updates_of_b == []
        # The engine's rows look the lease up once, in their `live` part (ADR 0073).
        rows = chained[0].split(TAIL_CALL)[0]
        assert rows.count("FROM recovery_lease") == 1 and rows.count("FROM live") == 2
    else:
        assert len(updates_of_b) == 1  # inserted ready, then dispatched


def test_separate_rows_insert_ready_then_update(settings):
    instance = _two_steps(settings)
    with separate_rows(), CaptureQueriesContext(connection) as captured:
        instance_run(instance_id=instance.pk)
    b = Token.objects.get(instance=instance, node_id="b")
    chained = _chained_commit(captured.captured_queries)
    assert not any("new_step AS" in s for s in chained)
    assert sum('UPDATE "engine_token"' in s and f'"id" = {b.pk} ' in s for s in chained) == 1


def _meanwhile(monkeypatch, change) -> list[str]:
    """Make ``change`` (in the run's own transaction) right after the observation's reads,
    before the statement with the rows and the call; returns why the answer came late."""
    if connection.vendor != "postgresql":
        pytest.skip("the rows ride in the ledger's call on PostgreSQL only")
    read = step_call._observation_prepared
    # The step reads its chain (the path these tests are about), not the run's mark: a
    # change while the tail is checked instead is test_engine_step_alone.py's.
    monkeypatch.setattr(step_call, "_tail_known", lambda *args: None)

    def read_then_change(cursor, observation):
        loaded = read(cursor, observation)
        change()
        return loaded

    monkeypatch.setattr(step_call, "_observation_prepared", read_then_change)
    late: list[str] = []
    keep = answers.late_answer_keep
    monkeypatch.setattr(settle, "late_answer_keep", lambda *a: (late.append(a[3]), keep(*a)))
    return late


def _nothing_changed(instance: Instance, a_pk: int) -> None:
    assert Token.objects.get(pk=a_pk).state == TokenState.EXECUTING
    assert not Token.objects.filter(instance=instance, node_id="b").exists()
    assert Instance.objects.get(pk=instance.pk).next_ordinal == 3  # as a's dispatch left it
    [a_op] = Operation.objects.filter(subject_id=str(instance.pk))
    assert a_op.state == "dispatched"


def test_a_stale_holders_chained_commit_changes_nothing_and_is_a_stale_fence(settings, monkeypatch):
    instance = _two_steps(settings)
    lease = f"instance:{instance.pk}"

    def taken_by_another():  # the fence the run holds is stale from here on
        Lease.objects.filter(key=lease).update(holder="other", fence=999)

    late = _meanwhile(monkeypatch, taken_by_another)
    a_pk = Token.objects.get(instance=instance, node_id="a").pk
    with CaptureQueriesContext(connection) as captured:
        report = instance_run(instance_id=instance.pk)
    assert report.stale and late == ["StaleFence"]
    if connection.vendor == "postgresql":
        sent = [q["sql"] for q in captured.captured_queries if "new_step AS" in q["sql"]]
        assert len(sent) == 1 and ONE_CALL in sent[0]  # refused inside the one statement
    _nothing_changed(instance, a_pk)


def test_a_step_moved_meanwhile_refuses_the_whole_statement(settings, monkeypatch):
    instance = _two_steps(settings)
    a_pk = Token.objects.get(instance=instance, node_id="a").pk

    def moved_by_someone():
        Token.objects.filter(pk=a_pk).update(state=TokenState.OUTCOME_UNKNOWN)

    late = _meanwhile(monkeypatch, moved_by_someone)
    report = instance_run(instance_id=instance.pk)
    assert late == ["EngineConflict"] and report.status != "completed"
    # The move behind the run's back rolled back with the refused commit.
    _nothing_changed(instance, a_pk)
