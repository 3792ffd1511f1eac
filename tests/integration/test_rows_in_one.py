"""A step's move, the next step's row and the instance row: one statement on PostgreSQL.

A completed step's move (``update_token(later=True)``), the insert of the next step and
the fenced update of the instance go as data-modifying ``WITH`` parts of one statement
(ADR 0044); on SQLite (and inside ``separate_rows()``) one by one. Either way the same
rows are written (the property test of ``test_step_call.py`` compares them), a stale
holder changes nothing and a move refused refuses the whole statement.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from govflow.engine.db import engine_commit
from govflow.engine.errors import EngineConflict
from govflow.engine.models import Token, TokenState
from govflow.engine.services.load import load_run
from govflow.engine.services.routing import Router
from govflow.engine.services.rows import separate_rows
from govflow.engine.services.run import Run, instance_lease_key
from recovery import api
from tests.flows import action, linear, start

pytestmark = pytest.mark.django_db(transaction=True)


def _held(instance) -> Run:
    fence = api.lease_acquire(key=instance_lease_key(instance.pk), holder="test-run", ttl=30)
    return load_run(instance.pk, fence)


def _route_the_start(run: Run, *, later: bool = False) -> None:
    """The start node completed and the first action routed: one new step, then flush."""
    [first] = run.active.values()
    with run.commit():
        run.update_token(first, TokenState.READY, later=later, state=TokenState.COMPLETED)
        run.active.pop(first.pk)
        router = Router(run)
        router.leave(first.node_id)
        run.flush(router)


def test_the_new_step_and_the_instance_are_one_statement_on_postgresql():
    instance = start(linear(action("a")))
    run = _held(instance)
    with CaptureQueriesContext(connection) as captured:
        _route_the_start(run)
    folded = [q["sql"] for q in captured.captured_queries if "new_step AS (INSERT" in q["sql"]]
    assert len(folded) == (1 if connection.vendor == "postgresql" else 0)
    [step] = [t for t in run.active.values() if t.node_id == "a"]
    stored = Token.objects.get(pk=step.pk)
    assert (stored.node_id, stored.state, stored.ordinal) == ("a", TokenState.READY, 2)
    instance.refresh_from_db()
    assert instance.next_ordinal == 3 and instance.status == "running"


def test_separate_rows_writes_them_one_by_one():
    instance = start(linear(action("a")))
    run = _held(instance)
    with separate_rows(), CaptureQueriesContext(connection) as captured:
        _route_the_start(run)
    assert not any("new_step AS (INSERT" in q["sql"] for q in captured.captured_queries)
    assert Token.objects.filter(instance=instance, node_id="a").count() == 1


def _taken_by_another(run, instance) -> None:
    """The run's lease let go and taken by another holder: the run's fence is stale."""
    api.lease_release(fence=run.fence)
    api.lease_acquire(key=instance_lease_key(instance.pk), holder="other", ttl=30)


def _stale_route():
    """An instance whose run's fence went stale after the start node was routed."""
    instance = start(linear(action("a")))
    run = _held(instance)
    [first] = run.active.values()
    _taken_by_another(run, instance)
    router = Router(run)
    router.leave(first.node_id)
    return instance, run, router


def _nothing_written(instance) -> None:
    assert not Token.objects.filter(instance=instance, node_id="a").exists()
    instance.refresh_from_db()
    assert instance.next_ordinal == 2  # as the start left it


def test_a_stale_holder_inserts_no_step_and_changes_no_instance():
    instance, run, router = _stale_route()
    with pytest.raises(api.StaleFence), run.commit():
        run.flush(router)
    _nothing_written(instance)


def test_the_rows_statement_itself_refuses_a_stale_holder():
    """Without the run's commit around it (whose seal would ask the ledger, which checks
    the fence again): the rows' own check of the lease refuses (ADR 0073)."""
    instance, run, router = _stale_route()
    with pytest.raises(api.StaleFence), engine_commit():
        run.flush(router)
    _nothing_written(instance)


def test_a_move_made_later_rides_in_the_same_statement():
    instance = start(linear(action("a")))
    run = _held(instance)
    [first] = run.active.values()
    with CaptureQueriesContext(connection) as captured:
        _route_the_start(run, later=True)
    statements = [q["sql"] for q in captured.captured_queries if "engine_token" in q["sql"]]
    assert len(statements) == (1 if connection.vendor == "postgresql" else 2), statements
    assert Token.objects.get(pk=first.pk).state == TokenState.COMPLETED
    assert Token.objects.get(instance=instance, node_id="a").state == TokenState.READY


def test_a_move_made_later_by_a_stale_holder_changes_nothing():
    instance = start(linear(action("a")))
    run = _held(instance)
    [first] = run.active.values()
    _taken_by_another(run, instance)
    with pytest.raises(api.StaleFence):
        _route_the_start(run, later=True)
    assert Token.objects.get(pk=first.pk).state == TokenState.READY
    assert not Token.objects.filter(instance=instance, node_id="a").exists()


def test_a_move_made_later_of_a_step_someone_else_moved_is_refused_whole():
    instance = start(linear(action("a")))
    run = _held(instance)
    [first] = run.active.values()
    Token.objects.filter(pk=first.pk).update(state=TokenState.CANCELLED)  # behind the run
    with pytest.raises(EngineConflict, match="no longer ready"):
        _route_the_start(run, later=True)
    assert Token.objects.get(pk=first.pk).state == TokenState.CANCELLED
    assert not Token.objects.filter(instance=instance, node_id="a").exists()
    instance.refresh_from_db()
    assert instance.next_ordinal == 2
