"""Decisions on uncertain steps: evidence, a second person, and only then the engine moves."""

from __future__ import annotations

import pytest

from govflow.engine.errors import EngineConflict, NotPermitted
from govflow.engine.models import InstanceStatus, TokenState
from govflow.engine.provider import Pending
from govflow.engine.registry import registry
from govflow.engine.services.instances import instance_cancel, step_retry
from govflow.engine.services.run import instance_lease_key
from govflow.engine.services.runtime import instance_run
from govflow.handoffs.services.desk import handoff_approve, handoff_request
from govflow.handoffs.services.incidents import open_cases_of
from recovery import api
from recovery.models import Decision
from tests.engine_helpers import (
    chain_ok,
    counted,
    evidence,
    make_due,
    op_states,
    operations,
    split_into,
    token_of,
    token_states,
    user_with,
)
from tests.flows import action, drive, linear, start
from tests.providers.alpha import effects

pytestmark = pytest.mark.django_db

CHECKS = {"store": "Looked the idempotency key up in the alpha store."}


@pytest.fixture
def operator(django_user_model):
    return user_with(django_user_model, "operator", "engine.operate_instance")


def uncertain(script: str = "raise_after"):
    """An instance a → b blocked on an ``outcome_unknown`` step a."""
    effects.SCRIPT["alpha.write"] = [script]
    instance = drive(start(linear(action("a"), action("b"))))
    assert token_of(instance, "a").state == TokenState.OUTCOME_UNKNOWN
    return instance


def decide(instance, kind: str, requester, approver, **kwargs) -> Decision:
    kwargs.setdefault("checks", CHECKS)
    kwargs.setdefault("evidence", [evidence()] if kind != "cancel" else [])
    decision = handoff_request(
        instance_id=instance.pk,
        token_id=token_of(instance, "a").pk,
        kind=kind,
        rationale="The store shows what happened.",
        actor=requester,
        **kwargs,
    )
    assert decision.state == "requested"
    return handoff_approve(decision_id=decision.pk, actor=approver, result_fp=decision.result_fp)


def test_effect_confirmed_completes_the_step_without_calling_the_provider(requester, approver):
    instance = uncertain("raise_after")
    assert effects.call_count("alpha.write") == 1
    approved = decide(instance, "effect_confirmed", requester, approver)
    assert approved.state == "approved" and approved.decided_by == approver
    instance = drive(instance)
    assert instance.status == InstanceStatus.COMPLETED, instance.reason
    assert token_of(instance, "a").reason == f"effect confirmed by decision {approved.pk}"
    assert op_states(instance) == ["effect_confirmed", "succeeded"]
    # Only step b called the provider; a was never called again.
    assert effects.call_count("alpha.write") == 2 and len(effects.effects()) == 2
    assert chain_ok(instance)


def test_effect_absent_fails_the_step_and_a_deliberate_retry_completes_it_once(
    requester, approver, operator
):
    instance = uncertain("raise_before")
    decide(instance, "effect_absent", requester, approver)
    instance.refresh_from_db()
    assert instance.status == InstanceStatus.BLOCKED
    assert instance.reason == "Effect absent: retry the step or cancel the instance."
    assert token_of(instance, "a").state == TokenState.FAILED
    assert op_states(instance) == ["effect_absent"]
    assert instance_run(instance_id=instance.pk).steps == 0, "absent is not a retry by itself"
    step_retry(instance_id=instance.pk, token_id=token_of(instance, "a").pk, actor=operator)
    instance = drive(instance)
    assert instance.status == InstanceStatus.COMPLETED, instance.reason
    absent, retried, _ = operations(instance)
    assert (absent.state, retried.state) == ("effect_absent", "succeeded")
    assert retried.key != absent.key and retried.idempotency_fp == absent.idempotency_fp
    # Step a's effect exists exactly once (after the retry), as does step b's.
    keys = {token_of(instance, n).idempotency_key for n in ("a", "b")}
    assert {(key, calls) for key, _, calls in effects.effects()} == {(k, 1) for k in keys}
    assert chain_ok(instance)


def test_retry_after_effect_absent_executes_again_rather_than_polling(
    requester, approver, operator
):
    effects.SCRIPT["alpha.write"] = [Pending(poll_after=60)]
    effects.SCRIPT["alpha.write:poll"] = ["raise_after"]
    write, calls = counted(poll=_raising_poll)
    with registry.override(write):
        instance = start(linear(action("a")))
        instance_run(instance_id=instance.pk)
        make_due(token_of(instance, "a"))
        instance = drive(instance)
        assert token_of(instance, "a").state == TokenState.OUTCOME_UNKNOWN
        decide(instance, "effect_absent", requester, approver)
        step_retry(instance_id=instance.pk, token_id=token_of(instance, "a").pk, actor=operator)
        instance = drive(instance)
    assert instance.status == InstanceStatus.COMPLETED, instance.reason
    assert [phase for phase, _, _ in calls] == ["execute", "poll", "execute"]
    assert op_states(instance) == ["pending", "effect_absent", "succeeded"]


def _raising_poll(context):
    raise TimeoutError("the provider's status page timed out")


def test_cancel_decision_cancels_the_instance_without_touching_the_provider(requester, approver):
    instance = uncertain()
    decide(instance, "cancel", requester, approver)
    instance = drive(instance)
    assert instance.status == InstanceStatus.CANCELLED
    assert instance.reason.startswith("Cancelled by decision ")
    assert token_states(instance) == {"start": "completed", "a": "cancelled"}
    # A cancel abandons the work; the ledger still says nobody knows what happened.
    assert op_states(instance) == ["outcome_unknown"]
    assert effects.call_count() == 1
    assert chain_ok(instance)


def test_the_requester_cannot_approve_their_own_decision(approver):
    instance = uncertain()
    # Even someone who may approve decisions cannot approve their own.
    decision = handoff_request(
        instance_id=instance.pk,
        token_id=token_of(instance, "a").pk,
        kind="effect_confirmed",
        rationale="I checked.",
        actor=approver,
        evidence=[evidence()],
        checks=CHECKS,
    )
    with pytest.raises(api.DecisionError, match="cannot approve it"):
        handoff_approve(decision_id=decision.pk, actor=approver, result_fp=decision.result_fp)
    instance.refresh_from_db()
    assert instance.status == InstanceStatus.BLOCKED
    assert token_of(instance, "a").state == TokenState.OUTCOME_UNKNOWN
    assert Decision.objects.get().state == "requested"


def test_a_decision_needs_the_providers_checks_answered_and_evidence(requester):
    instance = uncertain()
    token = token_of(instance, "a")
    with pytest.raises(api.DecisionError, match="verification checks first: store"):
        handoff_request(
            instance_id=instance.pk,
            token_id=token.pk,
            kind="effect_absent",
            rationale="Not there.",
            actor=requester,
            evidence=[evidence()],
        )
    with pytest.raises(api.DecisionError, match="needs at least one evidence file"):
        handoff_request(
            instance_id=instance.pk,
            token_id=token.pk,
            kind="effect_absent",
            rationale="Not there.",
            actor=requester,
            checks=CHECKS,
        )
    assert not Decision.objects.exists()


def test_only_an_uncertain_step_takes_a_decision(requester):
    instance = drive(start(linear(action("a"))))
    with pytest.raises(EngineConflict, match="Only a step whose outcome is unknown"):
        handoff_request(
            instance_id=instance.pk,
            token_id=token_of(instance, "a").pk,
            kind="effect_confirmed",
            rationale="x",
            actor=requester,
            evidence=[evidence()],
            checks=CHECKS,
        )


def test_approval_waits_while_a_worker_holds_the_instance(requester, approver):
    instance = uncertain()
    decision = handoff_request(
        instance_id=instance.pk,
        token_id=token_of(instance, "a").pk,
        kind="effect_confirmed",
        rationale="Seen in the store.",
        actor=requester,
        evidence=[evidence()],
        checks=CHECKS,
    )
    busy = api.lease_acquire(key=instance_lease_key(instance.pk), holder="busy-worker", ttl=30)
    with pytest.raises(EngineConflict, match="A worker is advancing this instance"):
        handoff_approve(decision_id=decision.pk, actor=approver, result_fp=decision.result_fp)
    assert Decision.objects.get().state == "requested"
    api.lease_release(fence=busy)
    handoff_approve(decision_id=decision.pk, actor=approver, result_fp=decision.result_fp)
    assert drive(instance).status == InstanceStatus.COMPLETED


def test_retry_and_cancel_need_the_operate_permission(django_user_model, requester, approver):
    clerk = user_with(django_user_model, "clerk")
    instance = uncertain("raise_before")
    decide(instance, "effect_absent", requester, approver)
    with pytest.raises(NotPermitted, match=r"engine\.operate_instance"):
        step_retry(instance_id=instance.pk, token_id=token_of(instance, "a").pk, actor=clerk)
    with pytest.raises(NotPermitted, match=r"engine\.operate_instance"):
        instance_cancel(instance_id=instance.pk, actor=clerk, reason="no longer needed")
    assert token_of(instance, "a").state == TokenState.FAILED


def test_a_plain_cancel_with_an_unknown_outcome_leaves_its_case_open_and_says_so(operator):
    # Issue 9 changed this: the cancel used to be refused, which could deadlock an
    # instance nobody could decide. It is allowed now and undoes nothing outside.
    instance = uncertain()
    cancelled = instance_cancel(
        instance_id=instance.pk, actor=operator, reason="The applicant withdrew."
    )
    assert cancelled.status == InstanceStatus.CANCELLED
    assert cancelled.reason == (
        "Cancelled by operator: The applicant withdrew. The outcome of step 'a' is still "
        "unknown; its case stays open until someone records what happened."
    )
    assert token_of(instance, "a").state == TokenState.OUTCOME_UNKNOWN
    assert op_states(instance) == ["outcome_unknown"]
    assert (
        open_cases_of(cancelled)
        .summary()
        .startswith("The outcome of step 'a' stays unknown: cancelling undoes nothing outside")
    )


def test_operator_cancel_cancels_every_active_step(operator):
    instance = drive(
        start(linear({"id": "wait", "type": "approval", "permission": "engine.operate_instance"}))
    )
    assert instance.status == InstanceStatus.WAITING
    cancelled = instance_cancel(
        instance_id=instance.pk, actor=operator, reason="The applicant withdrew."
    )
    assert cancelled.status == InstanceStatus.CANCELLED
    assert cancelled.reason == "Cancelled by operator: The applicant withdrew."
    assert token_of(instance, "wait").state == TokenState.CANCELLED
    with pytest.raises(EngineConflict, match="already cancelled"):
        instance_cancel(instance_id=instance.pk, actor=operator, reason="again")


def test_a_cancelled_instance_stays_cancelled(requester, approver, operator):
    instance = uncertain("raise_before")
    decide(instance, "effect_absent", requester, approver)
    instance_cancel(instance_id=instance.pk, actor=operator, reason="The applicant withdrew.")
    with pytest.raises(EngineConflict, match="is cancelled; its steps are not retried"):
        step_retry(instance_id=instance.pk, token_id=token_of(instance, "a").pk, actor=operator)
    instance = drive(instance)
    assert instance.status == InstanceStatus.CANCELLED
    assert token_of(instance, "a").state == TokenState.FAILED
    assert effects.effects() == []


def two_branches() -> dict:
    """start, a parallel split into actions a and b, both to the end."""
    return split_into("a", "b")


def test_an_absent_effect_decided_after_the_other_branch_ended_keeps_the_instance_blocked(
    requester, approver
):
    """Branch b has already ended when branch a's effect is recorded absent: nothing is
    active any more, yet a awaits a deliberate retry, so the operator's change and the
    next run leave the instance blocked, never completed."""
    doc = two_branches()
    effects.SCRIPT["alpha.write"] = ["raise_after", None]
    instance = drive(start(doc))
    assert token_of(instance, "a").state == TokenState.OUTCOME_UNKNOWN
    assert token_of(instance, "b").state == TokenState.COMPLETED
    decide(instance, "effect_absent", requester, approver)
    instance = drive(instance)
    assert token_of(instance, "a").state == TokenState.FAILED
    assert instance.status == InstanceStatus.BLOCKED, "completed with an effect absent"


def test_an_absent_effect_in_one_branch_keeps_the_instance_from_completing(requester, approver):
    """Branch a's effect is recorded absent (awaiting a deliberate retry) while branch b,
    polling its provider, reaches the end later: the instance stays blocked."""
    doc = two_branches()
    effects.SCRIPT["alpha.write"] = ["raise_after", Pending(poll_after=60)]
    instance = drive(start(doc))
    assert token_of(instance, "a").state == TokenState.OUTCOME_UNKNOWN
    decide(instance, "effect_absent", requester, approver)
    make_due(token_of(instance, "b"))
    instance = drive(instance)
    assert token_of(instance, "b").state == TokenState.COMPLETED
    assert token_of(instance, "a").state == TokenState.FAILED
    assert instance.status == InstanceStatus.BLOCKED, "completed with an effect absent"
    assert instance.reason.startswith("Effect absent")
