"""A dropped database connection while a provider's answer is recorded (issue 12).

The seam is ``settle``'s commit: the provider has answered ``Succeeded`` and the worker
holds the answer, then the connection dies before the recording commit. The commit is
made again on a fresh connection while the fence is current: no ``outcome_unknown``, no
second provider call. Only a lost lease makes it unknown, and then the answer is kept.
"""

from __future__ import annotations

import pytest
from django.db import OperationalError, connection

from govflow.engine.models import InstanceStatus, TokenState
from govflow.engine.services import reconnect, settle
from govflow.engine.services.runtime import instance_run
from recovery import api
from recovery.models import Observation, ObservationKind
from tests.dbclock import terminate_backend
from tests.engine_helpers import token_of
from tests.flows import action, drive, linear, start
from tests.providers.alpha import effects

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch):
    monkeypatch.setattr(reconnect, "RETRY_PAUSE", 0.01)


def broken_once(monkeypatch, disrupt):
    """Run ``disrupt`` before the first recording commit (after the provider answered)."""
    original = settle._settle_commit
    calls = []

    def seam(run, token, node, action_, key, result):
        calls.append(type(result).__name__)
        if len(calls) == 1:
            disrupt(run)
        return original(run, token, node, action_, key, result)

    monkeypatch.setattr(settle, "_settle_commit", seam)
    return calls


def raise_dropped(run) -> None:
    raise OperationalError("server closed the connection unexpectedly")


def test_a_dropped_connection_is_recorded_again_and_the_step_completes(monkeypatch):
    instance = start(linear(action("a"), action("b")))
    calls = broken_once(monkeypatch, raise_dropped)
    instance = drive(instance)
    assert instance.status == InstanceStatus.COMPLETED
    assert calls[:2] == ["Succeeded", "Succeeded"], "recorded again after the drop"
    assert token_of(instance, "a").state == TokenState.COMPLETED
    assert effects.call_count() == 2, "one provider call per step, none repeated"
    assert not Observation.objects.exists(), "no late answer: it was recorded in time"


def test_a_terminated_backend_is_recorded_again_on_a_fresh_connection(monkeypatch):
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL: pg_terminate_backend ends a server session")
    instance = start(linear(action("a"), action("b")))
    calls = broken_once(monkeypatch, lambda run: terminate_backend())
    instance = drive(instance)
    assert instance.status == InstanceStatus.COMPLETED, instance.reason
    assert len(calls) >= 2
    assert token_of(instance, "a").state == TokenState.COMPLETED
    assert effects.call_count() == 2
    ops = api.operation_get(key=token_of(instance, "a").operation_key)
    assert ops.state == api.OperationState.SUCCEEDED


def late_answer(operation_key: str) -> Observation:
    return Observation.objects.get(operation__key=operation_key, kind=ObservationKind.LATE)


def test_an_exhausted_retry_leaves_the_step_unknown_with_the_answer_kept(monkeypatch):
    instance = start(linear(action("a")))

    def always_dropped(run, token, node, action_, key, result):
        raise OperationalError("the database is unreachable")

    monkeypatch.setattr(settle, "_settle_commit", always_dropped)
    with pytest.raises(OperationalError):
        instance_run(instance_id=instance.pk, worker="worker-1")
    a = token_of(instance, "a")
    kept = late_answer(a.operation_key)
    assert kept.outcome == "succeeded" and kept.values["stored"] == "v1"
    monkeypatch.undo()
    # The next holder finds the step dispatched and unsettled: outcome_unknown, with the
    # provider's answer on its operation as evidence; the provider is not called again.
    instance = drive(instance)
    assert token_of(instance, "a").state != TokenState.EXECUTING
    assert effects.call_count() == 1


@pytest.mark.parametrize("drop", ["error", "terminate"])
def test_a_lease_lost_meanwhile_leaves_outcome_unknown_with_the_answer_kept(drop, monkeypatch):
    if drop == "terminate" and connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL: pg_terminate_backend ends a server session")
    instance = start(linear(action("a")))

    def taken_over_then_dropped(run) -> None:
        # Another worker takes the instance over (its lease expired meanwhile) and finds
        # step a dispatched with no recorded answer: outcome_unknown.
        api.lease_expire(fence=run.fence)
        instance_run(instance_id=run.instance.pk, worker="worker-2")
        if drop == "terminate":
            terminate_backend()
        else:
            raise_dropped(run)

    broken_once(monkeypatch, taken_over_then_dropped)
    report = instance_run(instance_id=instance.pk, worker="worker-1")
    assert report.stale, "the first worker's recording was refused"
    instance.refresh_from_db()
    assert instance.status == InstanceStatus.BLOCKED
    a = token_of(instance, "a")
    assert a.state == TokenState.OUTCOME_UNKNOWN
    kept = late_answer(a.operation_key)
    assert kept.outcome == "succeeded" and kept.values["stored"] == "v1"
    assert not kept.applied
    assert effects.call_count() == 1, "the provider was not called again"
