"""The engine's chained steps sent alone, under what can happen while a provider is called.

A run's chained step after its first one is one statement sent as the whole commit
(ADR 0051): the step's rows, the tail checked, both ledger moves. Here something happens
on the instance while step 3's provider is called — someone appends a fact to its chain,
an integrity incident is opened, another worker takes the lease over — and the step's
commit must do what it did when it was a transaction: carry on after verifying the fact,
or refuse with nothing of it written (the step's rows included) and keep the answer.
The same on SQLite (the separate statements), where nothing is sent alone.
"""

from __future__ import annotations

import pytest

from govflow.engine.models import InstanceStatus, TokenState
from recovery import api
from recovery.models import Operation
from tests.engine_helpers import token_of
from tests.flows import action, drive, linear, start
from tests.providers.alpha import effects

pytestmark = pytest.mark.django_db(transaction=True)


def during_call(monkeypatch, number: int, do) -> None:
    """Run ``do()`` while the ``number``-th provider call is made (outside the engine's
    commit, as anyone else would)."""
    real = effects.apply_effect
    calls = []

    def apply(key, action, data):
        calls.append(key)
        if len(calls) == number:
            do()
        return real(key, action, data)

    monkeypatch.setattr(effects, "apply_effect", apply)


def five_steps():
    return start(linear(*(action(f"s{i}") for i in range(1, 6))))


def subject_of(instance) -> api.Subject:
    return api.Subject("govflow.instance", str(instance.pk))


def test_someone_elses_fact_during_a_call_is_verified_and_the_run_goes_on(monkeypatch):
    instance = five_steps()
    subject = subject_of(instance)
    during_call(
        monkeypatch,
        3,
        lambda: api.fact_append(subject=subject, kind="tests.meanwhile", fact={"n": 3}),
    )
    instance = drive(instance)
    assert instance.status == InstanceStatus.COMPLETED, instance.reason
    assert api.chain_verify(subject).ok
    assert len(effects.effects()) == 5
    ops = Operation.objects.filter(subject_type=subject.type, subject_id=subject.id)
    assert set(ops.values_list("state", flat=True)) == {"succeeded"}


def test_an_incident_opened_during_a_call_refuses_the_step_and_keeps_its_answer(monkeypatch):
    instance = five_steps()
    subject = subject_of(instance)
    during_call(
        monkeypatch,
        3,
        lambda: api.incident_report(subject=subject, reason="tests: stopped by an operator"),
    )
    instance = drive(instance)
    assert instance.status == InstanceStatus.BLOCKED
    # Step 3's success was refused with nothing of its commit written: its step is still
    # executing, step 4 was never inserted, and its operation is still dispatched.
    assert token_of(instance, "s3").state == TokenState.EXECUTING
    assert not instance.tokens.filter(node_id="s4").exists()
    s3 = Operation.objects.get(subject_type=subject.type, subject_id=subject.id, step_id="s3")
    assert s3.state == "dispatched"
    assert len(effects.effects()) == 3  # the provider was called; nothing called again


def test_a_lease_taken_over_during_a_call_writes_nothing_of_the_step(monkeypatch):
    instance = five_steps()

    def take_over():
        key = f"instance:{instance.pk}"
        api.lease_release(fence=api.lease_current(key).fence)
        api.lease_acquire(key=key, holder="another-worker", ttl=600)

    during_call(monkeypatch, 3, take_over)
    instance = drive(instance, rounds=1)
    # The run could not record step 3's outcome: nothing of that commit was written.
    assert token_of(instance, "s3").state == TokenState.EXECUTING
    assert not instance.tokens.filter(node_id="s4").exists()
    subject = subject_of(instance)
    s3 = Operation.objects.get(subject_type=subject.type, subject_id=subject.id, step_id="s3")
    assert s3.state == "dispatched"
