"""Integrity fails closed: the ledger decides, nothing moves during an incident (I12).

Each test plays an attacker with write access to the database, or a careless tool, and
shows that the engine stops for people instead of dispatching, guessing or hiding it.
"""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from govflow.engine.errors import IntegrityStop
from govflow.engine.models import Instance, InstanceStatus, KeptAnswer, Token, TokenState
from govflow.engine.provider import Succeeded
from govflow.engine.registry import registry
from govflow.engine.services.instances import step_retry
from govflow.engine.services.sweep import sweep_loop
from govflow.engine.services.triggers import trigger_deliver
from govflow.handoffs.services.desk import approval_decide, handoff_approve, handoff_request
from govflow.handoffs.services.integrity import integrity_incident_resolve_approve
from recovery import api
from recovery.models import Decision, IntegrityIncident, Operation
from recovery.testing import live_fence, new_subject, record
from tests.engine_helpers import (
    alpha_write,
    as_if_the_engine_wrote_it,
    evidence,
    graph,
    node,
    op_states,
    subject,
    token_of,
    user_with,
)
from tests.flows import action, drive, linear, start
from tests.providers.alpha import actions as alpha
from tests.providers.alpha import effects

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator(django_user_model):
    return user_with(
        django_user_model, "operator", "engine.operate_instance", "engine.view_instance"
    )


def uncertain() -> Instance:
    """An instance a → b stopped on step a, whose outcome is unknown."""
    effects.SCRIPT["alpha.write"] = ["raise_after"]
    instance = drive(start(linear(action("a"), action("b"))))
    assert token_of(instance, "a").state == TokenState.OUTCOME_UNKNOWN
    assert effects.call_count("alpha.write") == 1
    return instance


def edit_step(instance: Instance, node_id: str, **values) -> None:
    """What an attacker (or a careless script) does: one UPDATE of the step's row."""
    assert Token.objects.filter(instance=instance, node_id=node_id).update(**values) == 1


def open_incident(instance: Instance) -> IntegrityIncident:
    s = subject(instance)
    return IntegrityIncident.objects.get(subject_type=s.type, subject_id=s.id, status="open")


def assert_stopped_for_integrity(instance: Instance, calls: int) -> IntegrityIncident:
    instance.refresh_from_db()
    incident = open_incident(instance)
    assert instance.status == InstanceStatus.BLOCKED
    assert instance.reason.startswith(f"Integrity incident #{incident.pk} is open")
    assert effects.call_count("alpha.write") == calls, "nothing may be dispatched"
    return incident


# -- 1. The ledger decides, on every path ------------------------------------------------


def test_a_step_edited_out_of_outcome_unknown_is_not_run_again():
    instance = uncertain()
    edit_step(instance, "a", state=TokenState.READY)
    drive(instance)
    incident = assert_stopped_for_integrity(instance, calls=1)
    assert "changed outside the engine" in incident.reason
    assert op_states(instance) == ["outcome_unknown"]
    # recovery_verify sees it too: the projection is under the chain.
    result = api.chain_verify(subject(instance))
    assert not result.ok and "projection of" in result.reason


def test_retry_of_a_step_edited_to_failed_is_refused(operator):
    instance = uncertain()
    edit_step(instance, "a", state=TokenState.FAILED)
    with pytest.raises(IntegrityStop, match="Integrity incident #"):
        step_retry(instance_id=instance.pk, token_id=token_of(instance, "a").pk, actor=operator)
    assert token_of(instance, "a").state == TokenState.FAILED
    assert open_incident(instance)
    assert effects.call_count("alpha.write") == 1


def test_the_ledger_refuses_a_retry_even_when_the_edit_was_recorded_as_the_projection(operator):
    # Even if the engine itself had recorded the wrong step state, the ledger's own state
    # of the effect decides.
    instance = uncertain()
    edit_step(instance, "a", state=TokenState.FAILED)
    as_if_the_engine_wrote_it(instance)
    with pytest.raises(IntegrityStop, match="is outcome_unknown"):
        step_retry(instance_id=instance.pk, token_id=token_of(instance, "a").pk, actor=operator)
    assert open_incident(instance)
    assert effects.call_count("alpha.write") == 1


def test_the_ledger_refuses_the_dispatch_even_when_the_edit_was_recorded_as_the_projection():
    instance = uncertain()
    edit_step(instance, "a", state=TokenState.READY, attempt=1)
    as_if_the_engine_wrote_it(instance)
    drive(instance)
    incident = assert_stopped_for_integrity(instance, calls=1)
    assert "outcome_unknown" in incident.reason
    assert op_states(instance) == ["outcome_unknown"]
    assert Operation.objects.count() == 1, "nothing was recorded either"


def test_a_decision_on_an_edited_instance_is_refused(requester, approver):
    instance = uncertain()
    decision = handoff_request(
        instance_id=instance.pk,
        token_id=token_of(instance, "a").pk,
        kind="effect_absent",
        rationale="The store has nothing under the key.",
        actor=requester,
        evidence=[evidence()],
        checks={"store": "Looked the idempotency key up in the alpha store."},
    )
    Instance.objects.filter(pk=instance.pk).update(variables={"value": "forged"})
    with pytest.raises(IntegrityStop, match="Integrity incident #"):
        handoff_approve(decision_id=decision.pk, actor=approver, result_fp=decision.result_fp)
    assert Decision.objects.get(pk=decision.pk).state == "requested"
    assert op_states(instance) == ["outcome_unknown"]
    assert effects.call_count("alpha.write") == 1


def test_the_sweep_does_not_bring_an_edited_step_back(settings):
    instance = uncertain()
    edit_step(instance, "a", state=TokenState.READY)
    Instance.objects.filter(pk=instance.pk).update(runnable_at=None, status="running")
    sweep_loop(duration=0, chain=False)
    drive(instance)
    assert_stopped_for_integrity(instance, calls=1)


def trigger_flow():
    return linear(
        node("w", "trigger", message="payment", correlation="case.id", output={"paid": "amount"}),
        action("a"),
    )


def test_a_message_for_an_instance_with_edited_variables_moves_nothing():
    instance = drive(start(trigger_flow(), {"value": "v1", "case": {"id": "C-1"}}))
    assert instance.status == InstanceStatus.WAITING
    Instance.objects.filter(pk=instance.pk).update(
        variables={"value": "forged", "case": {"id": "C-1"}}
    )
    trigger_deliver(
        message="payment", correlation="C-1", delivery_id="bank-1", payload={"amount": 1}
    )
    drive(instance)
    assert_stopped_for_integrity(instance, calls=0)
    assert token_of(instance, "w").state != TokenState.COMPLETED


def test_the_admin_retry_of_an_edited_step_says_why_and_changes_nothing(operator):
    instance = uncertain()
    edit_step(instance, "a", state=TokenState.FAILED)
    client = Client()
    client.force_login(operator)
    token = token_of(instance, "a")
    response = client.post(
        reverse("admin:engine_instance_retry", args=[instance.pk, token.pk]), follow=True
    )
    assert response.status_code == 200
    assert any("Integrity incident #" in str(m) for m in response.context["messages"])
    assert token_of(instance, "a").state == TokenState.FAILED
    assert effects.call_count("alpha.write") == 1


# -- 2. No new effects while an incident is open ------------------------------------------


def approval_flow():
    return graph(
        [
            node("s", "start"),
            node("ok", "approval", permission="engine.operate_instance"),
            action("a"),
            node("e", "end"),
        ],
        [("s", "ok"), ("ok", "a"), ("a", "e")],
    )


def open_incident_on(instance: Instance, reason: str = "a checkpoint was rewritten"):
    return api.incident_open(verification=api.Verification(subject(instance), False, 1, 1, reason))


def test_approving_the_next_gate_during_an_incident_dispatches_nothing(operator):
    instance = drive(start(approval_flow()))
    assert instance.status == InstanceStatus.WAITING
    incident = open_incident_on(instance)
    with pytest.raises(IntegrityStop, match=f"Integrity incident #{incident.pk}"):
        approval_decide(
            instance_id=instance.pk,
            token_id=token_of(instance, "ok").pk,
            actor=operator,
            approved=True,
        )
    drive(instance)
    assert effects.call_count("alpha.write") == 0
    assert not Operation.objects.exists()


def test_an_instance_waiting_for_a_person_shows_its_real_state_once_resolved(
    resolver, second_resolver
):
    instance = drive(start(approval_flow()))
    incident = open_incident_on(instance)
    drive(instance)
    assert_stopped_for_integrity(instance, calls=0)
    api.incident_resolve_request(
        incident_id=incident.pk, requested_by=resolver, rationale="A false alarm: restored."
    )
    assert integrity_incident_resolve_approve(
        incident_id=incident.pk, actor=second_resolver
    ).resolved
    instance = drive(instance)
    assert (instance.status, instance.reason) == (InstanceStatus.WAITING, "")
    assert token_of(instance, "ok").state == TokenState.WAITING


def test_a_ready_step_is_not_dispatched_during_an_incident(settings):
    settings.GOVFLOW_MAX_STEPS_PER_RUN = 1
    instance = drive(start(linear(action("a"))), rounds=1)  # the start node only
    assert token_of(instance, "a").state == TokenState.READY
    incident = open_incident_on(instance)
    settings.GOVFLOW_MAX_STEPS_PER_RUN = 500
    drive(instance)
    assert assert_stopped_for_integrity(instance, calls=0) == incident
    assert not Operation.objects.exists()


def test_the_ledger_itself_refuses_to_record_during_an_incident():
    s = new_subject()
    fence = live_fence(s)
    record(s, fence)
    api.incident_open(verification=api.Verification(s, False, 1, 1, "tampered"))
    with pytest.raises(api.IntegrityIncidentOpen, match="no new effect is dispatched"):
        record(s, fence)
    assert Operation.objects.count() == 1


def test_a_restored_ledger_stops_every_new_effect_whatever_its_subject():
    s = new_subject()
    fence = live_fence(s)
    record(s, fence)
    ledger = api.Subject("recovery.ledger", "watermark")
    api.incident_report(subject=ledger, reason="the database is behind its anchors")
    with pytest.raises(api.IntegrityIncidentOpen, match="on the whole ledger"):
        record(s, fence)
    instance = drive(start(linear(action("a"))))
    assert instance.status == InstanceStatus.BLOCKED
    assert effects.call_count("alpha.write") == 0
    assert Operation.objects.count() == 1


def test_the_ledger_refuses_a_new_operation_while_the_effect_is_unsettled():
    s = new_subject()
    fence = live_fence(s)
    first = record(s, fence)
    op = Operation.objects.get(key=first.key)
    again = dict(
        subject=s,
        step_id="step-1",
        action="test.notify",
        recovery_mode="non_atomic",
        definition_fp=op.definition_fp,
        input_fp=op.input_fp,
        preview_fp=op.preview_fp,
        access_fp=op.access_fp,
        idempotency_fp=op.idempotency_fp,
        fence=fence,
    )
    for state in ("dispatched", "outcome_unknown"):
        if state != "dispatched":
            api.operation_observe(key=first.key, state=state, fence=fence)
        with pytest.raises(api.LedgerDisagrees, match=f"it is {state}") as caught:
            api.operation_record(nonce="retry-1", ordinal=1, **again)
        assert caught.value.operation == first.key
    assert not isinstance(caught.value, api.ConflictError), "integrity is not a conflict"
    # A decision that the effect is absent allows the deliberate retry: same effect.
    api.operation_observe(key=first.key, state="effect_absent", fence=fence)
    retried = api.operation_record(nonce="retry-1", ordinal=1, **again)
    assert retried.key != first.key


# -- 3. A success refused by an incident is kept, never guessed -----------------------------


def test_a_success_refused_by_an_open_incident_is_kept_and_recorded_after_resolution(
    resolver, second_resolver
):
    def execute(context):
        result = alpha.write.execute(context)
        # Meanwhile someone's verification found a broken link on this instance.
        instance = Instance.objects.get(pk=context.instance_id)
        open_incident_on(instance, "found by a concurrent verification")
        return result

    with registry.override(alpha_write(execute=execute)):
        instance = drive(start(linear(action("a"), action("b"))))
    assert_stopped_for_integrity(instance, calls=1)
    assert "answer was received meanwhile and is kept" in instance.reason
    assert token_of(instance, "a").state == TokenState.EXECUTING
    assert op_states(instance) == ["dispatched"]
    kept = KeptAnswer.objects.get()
    assert kept.outcome == "succeeded" and kept.output["stored"] == "v1"
    # Later runs do not turn the real answer into outcome_unknown.
    drive(instance)
    assert op_states(instance) == ["dispatched"]
    assert token_of(instance, "a").state == TokenState.EXECUTING
    # Resolved (the chain verifies, two people): the kept answer is recorded and the
    # instance moves on.
    incident = open_incident(instance)
    api.incident_resolve_request(
        incident_id=incident.pk, requested_by=resolver, rationale="Nothing was changed."
    )
    outcome = integrity_incident_resolve_approve(incident_id=incident.pk, actor=second_resolver)
    assert outcome.resolved, outcome.message
    instance = drive(instance)
    assert instance.status == InstanceStatus.COMPLETED, instance.reason
    assert op_states(instance) == ["succeeded", "succeeded"]
    assert instance.variables["a"]["stored"] == "v1"
    assert effects.call_count("alpha.write") == 2, "a was called once, then b"
    assert KeptAnswer.objects.get().applied_at is not None
    assert api.chain_verify(subject(instance)).ok


def test_a_refused_success_never_leaves_the_run_looking_stale(caplog):
    def execute(context):
        open_incident_on(Instance.objects.get(pk=context.instance_id))
        return Succeeded({"done": True})

    with registry.override(alpha_write(execute=execute)):
        instance = drive(start(linear(action("a"))))
    assert instance.status == InstanceStatus.BLOCKED
    assert "nothing was changed, the current holder carries on" not in caplog.text


# -- 4. The projection under the chain ------------------------------------------------------


def test_edited_variables_are_an_incident_and_the_next_step_does_not_run(settings):
    settings.GOVFLOW_MAX_STEPS_PER_RUN = 2
    instance = drive(start(linear(action("a"), action("b"))), rounds=1)  # start, a
    assert token_of(instance, "b").state in {TokenState.READY, TokenState.EXECUTING}
    calls = effects.call_count("alpha.write")
    Instance.objects.filter(pk=instance.pk).update(variables={"value": "forged"})
    settings.GOVFLOW_MAX_STEPS_PER_RUN = 500
    drive(instance)
    assert_stopped_for_integrity(instance, calls=calls)
    assert "forged" not in str(effects.effects())


def test_recovery_verify_reports_an_edited_step_of_a_completed_instance():
    instance = drive(start(linear(action("a"))))
    assert instance.status == InstanceStatus.COMPLETED
    assert api.chain_verify(subject(instance)).ok
    out = StringIO()
    call_command("recovery_verify", stdout=out)
    edit_step(instance, "a", state=TokenState.READY)
    with pytest.raises(SystemExit):
        call_command("recovery_verify", stdout=(out := StringIO()))
    assert "projection of govflow.instance" in out.getvalue()
    assert open_incident(instance)
