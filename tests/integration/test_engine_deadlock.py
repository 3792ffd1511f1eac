"""Decisions that cannot deadlock, on the operator's pages (issue 9, item 4).

The requester withdraws and never sees Approve/Reject on their own request; a second
person approves or rejects with a comment; a user without a permission reads which one;
cancelling with an unknown outcome is allowed and keeps the case open; engine incidents
are resolved with a recorded investigation on the instance's chain.
"""

from __future__ import annotations

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from govflow.engine.errors import EngineConflict, InvalidRequest, NotPermitted
from govflow.engine.models import Incident, InstanceStatus, TokenState
from govflow.engine.provider import Failed
from govflow.handoffs.services.desk import handoff_approve, handoff_request
from govflow.handoffs.services.incidents import engine_incident_resolve
from recovery import api
from recovery.models import Checkpoint, Decision, EvidenceFile
from tests.engine_helpers import chain_ok, evidence, op_states, token_of, user_with
from tests.flows import action, drive, linear, start
from tests.integration.test_engine_admin import (
    OPERATOR_PERMS,
    blocked,
    decision_form,
    logged_in,
    make_user,
    messages_of,
    url,
)
from tests.providers.alpha import effects

pytestmark = pytest.mark.django_db

CHECKS = {"store": "Looked the idempotency key up in the alpha store."}


@pytest.fixture
def olga(django_user_model):
    return make_user(django_user_model, "olga", *OPERATOR_PERMS)


@pytest.fixture
def otto(django_user_model):
    """A second operator who may approve: the other pair of eyes."""
    return make_user(django_user_model, "otto", *OPERATOR_PERMS)


def requested(instance, client) -> Decision:
    token = instance.tokens.get(node_id="write")
    response = client.post(url("instance_handoff", instance.pk, token.pk), decision_form(token))
    assert response.status_code == 302, response.content[:2000]
    return Decision.objects.get(state="requested")


def page(client, instance) -> str:
    return client.get(url("instance_change", instance.pk)).content.decode()


def test_the_requester_sees_withdraw_not_approve_and_withdraws(olga, otto):
    instance = blocked()
    ops = logged_in(olga)
    decision = requested(instance, ops)
    mine = page(ops, instance)
    assert f"Approve decision {decision.pk}" not in mine
    assert f"Reject decision {decision.pk}" not in mine
    assert f"Withdraw decision {decision.pk}" in mine
    assert "You requested this decision: a second person" in mine
    assert f"Approve decision {decision.pk}" in page(logged_in(otto), instance)

    response = ops.post(url("instance_decision_withdraw", instance.pk, decision.pk), follow=True)
    assert (
        f"Decision {decision.pk} is withdrawn; the step still waits for a decision, and you "
        "can request a new one."
    ) in messages_of(response)
    decision.refresh_from_db()
    assert decision.state == "withdrawn"
    assert token_of(instance, "write").state == TokenState.OUTCOME_UNKNOWN
    after = page(logged_in(otto), instance)
    assert f"Approve decision {decision.pk}" not in after
    assert "Request decision" in after  # the step takes a new request
    # Approving the withdrawn request is refused and changes nothing.
    response = logged_in(otto).post(
        url("instance_decision_approve", instance.pk, decision.pk), follow=True
    )
    assert any("it is withdrawn by its requester" in m for m in messages_of(response))
    assert op_states(instance) == ["outcome_unknown"] and chain_ok(instance)


def test_someone_else_cannot_withdraw_a_request(olga, otto):
    instance = blocked()
    decision = requested(instance, logged_in(olga))
    response = logged_in(otto).post(
        url("instance_decision_withdraw", instance.pk, decision.pk), follow=True
    )
    assert any("Only its requester (olga) can withdraw" in m for m in messages_of(response))
    decision.refresh_from_db()
    assert decision.state == "requested"


def test_self_approval_through_the_desk_service_is_refused(olga):
    instance = blocked()
    decision = requested(instance, logged_in(olga))
    with pytest.raises(api.DecisionError, match="requested a decision cannot approve it"):
        handoff_approve(decision_id=decision.pk, actor=olga, result_fp=decision.result_fp)
    decision.refresh_from_db()
    assert decision.state == "requested"
    assert token_of(instance, "write").state == TokenState.OUTCOME_UNKNOWN


def test_a_rejection_without_a_comment_is_refused_on_its_form(olga, otto):
    instance = blocked()
    decision = requested(instance, logged_in(olga))
    response = logged_in(otto).post(
        url("instance_decision_reject", instance.pk, decision.pk), {"note": ""}
    )
    assert response.status_code == 200
    assert "This field is required." in response.content.decode()
    decision.refresh_from_db()
    assert decision.state == "requested"
    response = logged_in(otto).post(
        url("instance_decision_reject", instance.pk, decision.pk),
        {"note": "The extract is for another key."},
        follow=True,
    )
    decision.refresh_from_db()
    assert (decision.state, decision.decision_note) == (
        "rejected",
        "The extract is for another key.",
    )


def test_a_user_without_a_permission_reads_which_one(olga, django_user_model):
    instance = blocked()
    decision = requested(instance, logged_in(olga))
    vera = make_user(django_user_model, "vera", "engine.view_instance", "recovery.view_decision")
    shown = page(logged_in(vera), instance)
    assert f"Approve decision {decision.pk}" not in shown
    assert (
        "approving or rejecting needs the permission &#x27;recovery.approve_decision&#x27;, "
        "which you do not have"
    ) in shown
    assert "Cancelling needs the permission &#x27;engine.operate_instance&#x27;" in shown
    Decision.objects.filter(pk=decision.pk).update(state="withdrawn")
    shown = page(logged_in(vera), instance)
    assert (
        "Requesting a decision needs the permission &#x27;engine.operate_instance&#x27;, "
        "&#x27;recovery.request_decision&#x27;, which you do not have"
    ) in shown


# -- cancelling with an unknown outcome ------------------------------------------------


def test_cancelling_with_an_unknown_outcome_keeps_its_case_open_and_says_so(olga, otto):
    instance = blocked()
    ops = logged_in(olga)
    response = ops.post(
        url("instance_cancel", instance.pk), {"reason": "The applicant withdrew."}, follow=True
    )
    assert (
        f"Instance {instance.pk} is cancelled. The outcome of step 'write' stays unknown: "
        "cancelling undoes nothing outside, so its case stays open until someone records "
        "what happened (effect confirmed or effect absent, with evidence)."
    ) in messages_of(response)
    instance.refresh_from_db()
    assert instance.status == InstanceStatus.CANCELLED
    token = token_of(instance, "write")
    assert token.state == TokenState.OUTCOME_UNKNOWN
    assert op_states(instance) == ["outcome_unknown"]
    shown = response.content.decode()
    assert "This instance has ended, but these cases stay open" in shown
    assert "Step 'write' (#2): outcome unknown" in shown
    assert 'value="cancel"' not in shown  # only what happened can be recorded now
    with pytest.raises(EngineConflict, match="already cancelled"):
        handoff_request(
            instance_id=instance.pk,
            token_id=token.pk,
            kind="cancel",
            rationale="Nothing to do.",
            actor=olga,
        )

    # Someone records what happened; a second person approves. Nothing is routed on.
    decision = requested(instance, ops)
    response = logged_in(otto).post(
        url("instance_decision_approve", instance.pk, decision.pk),
        {"result_fp": decision.result_fp},
        follow=True,
    )
    instance.refresh_from_db()
    assert instance.status == InstanceStatus.CANCELLED
    assert token_of(instance, "write").state == TokenState.COMPLETED
    assert op_states(instance) == ["effect_confirmed"]
    assert instance.tokens.count() == 2  # start and write: nothing was routed after write
    assert "these cases stay open" not in response.content.decode()
    assert chain_ok(instance)


# -- engine incidents ------------------------------------------------------------------


def failed_instance():
    effects.SCRIPT["alpha.write"] = [Failed("registry refused", permanent=True)]
    instance = drive(start(linear(action("write"))))
    incident = Incident.objects.get(instance=instance)
    assert incident.kind == "step_failed" and incident.resolved_at is None
    return instance, incident


def test_an_engine_incident_is_resolved_with_a_recorded_investigation_on_the_chain(
    django_user_model,
):
    operator = user_with(django_user_model, "operator", "engine.operate_instance")
    instance, incident = failed_instance()
    resolved = engine_incident_resolve(
        incident_id=incident.pk,
        actor=operator,
        rationale="  The registry was down for maintenance; the step was retried.  ",
        evidence=[evidence("maintenance-notice.txt", "Registry maintenance 02:00-03:00.")],
    )
    assert resolved.resolved_at is not None and resolved.resolved_by == operator
    assert resolved.resolution == "The registry was down for maintenance; the step was retried."
    attached = EvidenceFile.objects.get(pk__in=resolved.resolution_evidence)
    assert attached.attached_to == f"govflow.instance:{instance.pk}"
    assert attached.decision is None and attached.name == "maintenance-notice.txt"
    fact = json.loads(
        Checkpoint.objects.get(subject_id=str(instance.pk), kind="engine.incident_resolved").fact
    )
    assert fact == {
        "incident": incident.pk,
        "kind": "step_failed",
        "resolved_by": operator.pk,
        "rationale_fp": api.fingerprint_value(api.FingerprintKind.INPUT, resolved.resolution),
        "evidence": [attached.fingerprint],
    }
    assert chain_ok(instance)
    with pytest.raises(EngineConflict, match=rf"incident {incident.pk} is already resolved by"):
        engine_incident_resolve(incident_id=incident.pk, actor=operator, rationale="Again.")
    assert Checkpoint.objects.filter(kind="engine.incident_resolved").count() == 1


def test_an_engine_incident_needs_a_rationale_and_the_permission(django_user_model):
    _, incident = failed_instance()
    operator = user_with(django_user_model, "operator", "engine.operate_instance")
    viewer = user_with(django_user_model, "viewer", "engine.view_instance")
    with pytest.raises(InvalidRequest, match="Say what you investigated"):
        engine_incident_resolve(incident_id=incident.pk, actor=operator, rationale="  ")
    with pytest.raises(NotPermitted, match=r"'engine\.operate_instance' is required"):
        engine_incident_resolve(incident_id=incident.pk, actor=viewer, rationale="Looked.")
    incident.refresh_from_db()
    assert incident.resolved_at is None
    assert not Checkpoint.objects.filter(kind="engine.incident_resolved").exists()


def test_an_engine_incident_is_resolved_from_the_instance_page(olga):
    instance, incident = failed_instance()
    ops = logged_in(olga)
    assert f"Resolve engine incident {incident.pk}" in page(ops, instance)
    response = ops.post(
        url("instance_incident_resolve", instance.pk, incident.pk),
        {
            "rationale": "Checked with the registry: it refused the parcel number.",
            "evidence": [SimpleUploadedFile("registry-answer.txt", b"refused: parcel\n")],
        },
        follow=True,
    )
    assert (
        f"Engine incident {incident.pk} is resolved; your investigation is recorded."
        in messages_of(response)
    )
    shown = response.content.decode()
    assert "Resolved by olga: Checked with the registry" in shown
    assert "registry-answer.txt</a>" in shown
    assert f"Resolve engine incident {incident.pk}" not in shown
