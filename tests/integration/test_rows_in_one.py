"""The next step's row and the instance row in one statement on PostgreSQL (ADR 0044).

The insert and the fenced update go as data-modifying ``WITH`` parts of one statement; on
SQLite (and inside ``separate_rows()``) as two. Either way the same rows are written (the
property test of ``test_step_call.py`` compares them), and a stale holder changes nothing.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from govflow.engine.models import Token, TokenState
from govflow.engine.services.routing import Router
from govflow.engine.services.rows import separate_rows
from govflow.engine.services.run import Run, instance_lease_key, load_run
from recovery import api
from tests.flows import action, linear, start

pytestmark = pytest.mark.django_db(transaction=True)


def _held(instance) -> Run:
    fence = api.lease_acquire(key=instance_lease_key(instance.pk), holder="test-run", ttl=30)
    return load_run(instance.pk, fence)


def _route_the_start(run: Run) -> None:
    """The start node completed and the first action routed: one new step, then flush."""
    [first] = run.active.values()
    with run.commit():
        run.update_token(first, TokenState.READY, state=TokenState.COMPLETED)
        run.active.pop(first.pk)
        router = Router(run)
        router.leave(first.node_id)
        run.flush(router)


def test_the_new_step_and_the_instance_are_one_statement_on_postgresql():
    instance = start(linear(action("a")))
    run = _held(instance)
    with CaptureQueriesContext(connection) as captured:
        _route_the_start(run)
    folded = [q["sql"] for q in captured.captured_queries if "WITH new_step AS" in q["sql"]]
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
    assert not any("WITH new_step AS" in q["sql"] for q in captured.captured_queries)
    assert Token.objects.filter(instance=instance, node_id="a").count() == 1


def test_a_stale_holder_inserts_no_step_and_changes_no_instance():
    instance = start(linear(action("a")))
    run = _held(instance)
    [first] = run.active.values()
    api.lease_release(fence=run.fence)
    api.lease_acquire(key=instance_lease_key(instance.pk), holder="other", ttl=30)
    router = Router(run)
    router.leave(first.node_id)
    with pytest.raises(api.StaleFence), run.commit():
        run.flush(router)
    assert not Token.objects.filter(instance=instance, node_id="a").exists()
    instance.refresh_from_db()
    assert instance.next_ordinal == 2  # as the start left it
