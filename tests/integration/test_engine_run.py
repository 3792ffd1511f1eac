"""A step hands the loop its next move as a value; the run's writes keep to the table.

``steps.run_token`` and ``steps.run_chained`` return a ``Chain`` (the step's commit also
recorded the next step's dispatch), a ``Defer`` (the next step was planned and left for a
commit of its own) or None — nothing is left on the ``Run`` for the loop to find later.
"""

from __future__ import annotations

import time

import pytest

from govflow.engine.errors import EngineError
from govflow.engine.models import InstanceStatus, Token, TokenState
from govflow.engine.services.dispatch import Chain, Defer
from govflow.engine.services.load import load_run
from govflow.engine.services.run import Run, instance_lease_key
from govflow.engine.services.steps import run_chained, run_token
from recovery import api
from recovery.models import Lease
from tests.engine_helpers import incidents, op_states, token_of
from tests.flows import action, linear, start

pytestmark = pytest.mark.django_db


def held(instance, *, steps: int = 10) -> Run:
    """The instance loaded under its lease, with a budget, as ``instance_run`` holds it."""
    fence = api.lease_acquire(key=instance_lease_key(instance.pk), holder="test-run", ttl=30)
    run = load_run(instance.pk, fence)
    run.deadline = time.monotonic() + 60
    run.steps_left = steps
    return run


def ready(run: Run, node_id: str) -> Token:
    return next(t for t in run.active.values() if t.node_id == node_id)


def test_each_step_returns_the_dispatch_it_recorded_for_the_next_one():
    instance = start(linear(action("a"), action("b")))
    run = held(instance)
    chained = run_token(run, ready(run, "start"))
    assert isinstance(chained, Chain) and chained.plan.token.node_id == "a"
    # Recorded, not yet called: the dispatch boundary is durable before the provider runs.
    assert token_of(instance, "a").state == TokenState.EXECUTING
    assert op_states(instance) == ["dispatched"]
    chained = run_chained(run, chained)
    assert isinstance(chained, Chain) and chained.plan.token.node_id == "b"
    assert run_chained(run, chained) is None
    instance.refresh_from_db()
    assert instance.status == InstanceStatus.COMPLETED
    assert op_states(instance) == ["succeeded", "succeeded"]


def test_the_commit_that_ends_the_instance_releases_its_lease():
    instance = start(linear(action("a")))
    run = held(instance)
    chained = run_token(run, ready(run, "start"))
    assert not run.released
    assert run_chained(run, chained) is None
    lease = Lease.objects.get(key=instance_lease_key(instance.pk))
    assert run.released and lease.holder is None and lease.released_at is not None
    assert lease.fence == run.fence.fence, "released, not taken over"


def test_a_next_step_that_would_be_rejected_is_deferred_with_its_refusal():
    instance = start(linear(action("a", value="not_set")))
    run = held(instance)
    deferred = run_token(run, ready(run, "start"))
    assert isinstance(deferred, Defer) and deferred.plan is None
    assert "needs the variable 'not_set'" in str(deferred.refusal)
    token = ready(run, "a")
    assert deferred.token_pk == token.pk and token_of(instance, "a").state == TokenState.READY
    assert op_states(instance) == [], "nothing is dispatched for a rejected step"
    assert run_token(run, token, deferred) is None
    instance.refresh_from_db()
    assert instance.status == InstanceStatus.BLOCKED
    assert instance.reason == str(deferred.refusal)
    assert [kind for kind, _ in incidents(instance)] == ["input"]


def test_without_budget_nothing_is_chained_and_the_loop_takes_the_next_step():
    instance = start(linear(action("a")))
    run = held(instance, steps=1)
    assert run_token(run, ready(run, "start")) is None
    assert token_of(instance, "a").state == TokenState.READY and op_states(instance) == []


def test_a_step_move_outside_the_table_is_refused_and_changes_nothing():
    instance = start(linear(action("a")))
    run = held(instance)
    token = ready(run, "start")
    with pytest.raises(EngineError, match="cannot go from ready to waiting"), run.commit():
        run.update_token(token, TokenState.READY, state=TokenState.WAITING)
    assert token_of(instance, "start").state == TokenState.READY
    assert token.state == TokenState.READY
