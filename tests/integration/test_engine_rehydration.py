"""Rehydration (I10): after a worker stops, the database alone says how each step resumes."""

from __future__ import annotations

import pytest
from django.db.models.functions import Now

from govflow.engine.models import Instance, InstanceStatus, Timer, Token, TokenState
from govflow.engine.registry import registry
from govflow.engine.services import runtime
from govflow.engine.services.instances import instance_cancel
from govflow.engine.services.run import instance_lease_key
from govflow.engine.services.runtime import instance_run
from govflow.engine.services.sweep import sweep_loop
from recovery import api
from tests.dbclock import wait_until_expired
from tests.engine_helpers import (
    alpha_write,
    as_if_the_engine_wrote_it,
    chain_ok,
    counted,
    incidents,
    node,
    op_states,
    operations,
    token_of,
    user_with,
)
from tests.flows import action, drive, linear, start
from tests.providers.alpha import actions as alpha
from tests.providers.alpha import effects

pytestmark = pytest.mark.django_db


class WorkerKilled(BaseException):
    """Stands in for kill -9: nothing after it runs, not even an ``except Exception``."""


def run(instance, **kwargs):
    report = instance_run(instance_id=instance.pk, **kwargs)
    instance.refresh_from_db()
    return report


def stopped_before(instance, settings, node_id: str = "a") -> Token:
    """Run up to ``node_id`` and leave it executing as a worker that died would."""
    settings.GOVFLOW_MAX_STEPS_PER_RUN = 1
    while not Token.objects.filter(instance=instance, node_id=node_id).exists():
        run(instance)
    Token.objects.filter(instance=instance, node_id=node_id).update(
        state=TokenState.EXECUTING, operation_key=""
    )
    as_if_the_engine_wrote_it(instance)
    return token_of(instance, node_id)


def test_an_executing_step_that_never_dispatched_is_ready_again_with_the_next_attempt(settings):
    instance = start(linear(action("a")))
    stopped_before(instance, settings)
    settings.GOVFLOW_MAX_STEPS_PER_RUN = 0  # rehydrate only
    run(instance)
    token = token_of(instance, "a")
    assert (token.state, token.attempt) == (TokenState.READY, 1)
    assert token.reason == "resumed after a worker stopped before dispatch"
    assert instance.status == InstanceStatus.RUNNING
    settings.GOVFLOW_MAX_STEPS_PER_RUN = 500
    instance = drive(instance)
    assert instance.status == InstanceStatus.COMPLETED, instance.reason
    [op] = operations(instance)
    assert (op.state, op.ordinal) == ("succeeded", 1)
    assert len(effects.effects()) == 1


DEAD_TTL = 2.0
"""The lease TTL of a run whose worker is killed: the tests wait for its expiry (a
condition, not a time), and a busy machine must still make the run's first commit and
the look that finds the lease held within it (0.5 s was once too short in CI)."""


def killed_after_dispatch(monkeypatch, **changes):
    """An instance whose worker died right after the provider did its effect."""

    def execute(context):
        alpha.write.execute(context)
        raise WorkerKilled

    write, calls = counted(alpha_write(execute=execute, **changes))
    instance = start(linear(action("a"), action("b")))
    # A killed worker does not release its lease either.
    monkeypatch.setattr(runtime, "release_sealed", lambda fence, going_on: False)
    with registry.override(write), pytest.raises(WorkerKilled):
        run(instance)
    monkeypatch.undo()
    return instance, write, calls


def test_an_executing_step_that_dispatched_becomes_outcome_unknown_without_a_call(
    monkeypatch, settings
):
    settings.GOVFLOW_LEASE_TTL = DEAD_TTL
    instance, write, calls = killed_after_dispatch(monkeypatch)
    assert token_of(instance, "a").state == TokenState.EXECUTING
    assert op_states(instance) == ["dispatched"]
    with registry.override(write):
        assert run(instance).skipped == "lease held by another worker"
        wait_until_expired(instance_lease_key(instance.pk))
        settings.GOVFLOW_LEASE_TTL = 30
        run(instance)
        run(instance)
    token = token_of(instance, "a")
    assert token.state == TokenState.OUTCOME_UNKNOWN
    assert instance.status == InstanceStatus.BLOCKED
    assert instance.reason.startswith("The worker stopped after dispatching this action")
    assert op_states(instance) == ["outcome_unknown"]
    assert len(calls) == 1 and len(effects.effects()) == 1
    assert "b" not in dict(instance.tokens.values_list("node_id", "state"))
    assert chain_ok(instance)


def test_an_executing_step_whose_operation_already_ended_blocks_for_an_operator(settings):
    instance = start(linear(action("a"), action("b")))
    settings.GOVFLOW_MAX_STEPS_PER_RUN = 2
    run(instance)  # start, then a
    [op] = operations(instance)
    Token.objects.filter(instance=instance, node_id="a").update(state=TokenState.EXECUTING)
    as_if_the_engine_wrote_it(instance)
    settings.GOVFLOW_MAX_STEPS_PER_RUN = 500
    run(instance)
    assert instance.status == InstanceStatus.BLOCKED
    assert instance.reason == (
        f"Step 'a' was left executing while its operation {op.key} is "
        "succeeded. An operator must look at it before anything moves "
        "on."
    )
    assert [kind for kind, _ in incidents(instance)] == ["inconsistent"]


def test_the_sweep_fires_timers_that_fell_due_while_everything_was_down(settings):
    instance = drive(start(linear(node("t", "timer", duration="PT5M"), action("a"))))
    Timer.objects.update(due_at=Now())  # five minutes of downtime later
    Instance.objects.filter(pk=instance.pk).update(runnable_at=None)
    stats = sweep_loop(duration=0, chain=False)
    assert stats["timers"] == 1, stats
    instance.refresh_from_db()
    assert instance.runnable_at is not None, "marked runnable with the timer's firing"
    assert drive(instance).status == InstanceStatus.COMPLETED


def test_the_sweep_requeues_an_instance_left_by_a_dead_worker(monkeypatch, settings):
    settings.GOVFLOW_LEASE_TTL = DEAD_TTL
    instance, _, _ = killed_after_dispatch(monkeypatch)
    Instance.objects.filter(pk=instance.pk).update(runnable_at=None)  # nothing marked it
    revision = api.subject_revision(api.Subject("govflow.instance", str(instance.pk)))
    assert sweep_loop(duration=0, chain=False)["requeued"] == 0, "its lease is still live"
    wait_until_expired(instance_lease_key(instance.pk))
    assert sweep_loop(duration=0, chain=False)["requeued"] == 1
    # The sweep only queues work: it writes nothing to the instance's chain.
    assert api.subject_revision(api.Subject("govflow.instance", str(instance.pk))) == revision


def test_cancelling_after_a_dead_worker_records_the_outcome_as_unknown(
    monkeypatch, settings, django_user_model
):
    settings.GOVFLOW_LEASE_TTL = DEAD_TTL
    operator = user_with(django_user_model, "operator", "engine.operate_instance")
    instance, _, calls = killed_after_dispatch(monkeypatch)
    wait_until_expired(instance_lease_key(instance.pk))
    # The plain cancel settles the dead worker's step first; that step's outcome is
    # unknown, so it stays open (issue 9: the cancel is no longer refused for it).
    instance_cancel(instance_id=instance.pk, actor=operator, reason="Applicant withdrew.")
    instance.refresh_from_db()
    assert instance.status == InstanceStatus.CANCELLED
    assert "The outcome of step 'a' is still unknown" in instance.reason
    assert token_of(instance, "a").state == TokenState.OUTCOME_UNKNOWN
    # Not left "dispatched" forever: the ledger says nobody knows whether it happened.
    assert op_states(instance) == ["outcome_unknown"]
    assert len(calls) == 1 and chain_ok(instance)
