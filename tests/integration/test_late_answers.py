"""Late results kept as evidence (issue 9, item 3), and the handoff page that shows them
with the provider's findings and "Ask the provider now"."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse

from govflow.engine.models import InstanceStatus, Token, TokenState
from govflow.engine.registry import registry
from govflow.engine.services.run import instance_lease_key
from govflow.engine.services.runtime import instance_run
from govflow.handoffs.services.desk import handoff_approve, handoff_request
from recovery import api
from recovery.models import IntegrityIncident, Observation
from recovery.testing import record
from tests.dbclock import wait_until_expired
from tests.engine_helpers import (
    alpha_write,
    chain_ok,
    evidence,
    op_states,
    subject,
    token_of,
    user_with,
)
from tests.flows import action, linear, start
from tests.providers.alpha import actions as alpha

pytestmark = pytest.mark.django_db

OPERATOR = ("engine.view_instance", "engine.operate_instance", "recovery.request_decision")


@pytest.fixture
def short_lease(settings):
    settings.GOVFLOW_LEASE_TTL = 1.0


def answered_late(meanwhile):
    """Run a → b where step a's provider answers only after ``meanwhile(instance_id)``
    ran (another worker took the instance over in between). Returns the instance."""

    def slow(context):
        result = alpha.write.execute(context)
        wait_until_expired(instance_lease_key(context.instance_id))
        meanwhile(context.instance_id)
        return result

    with registry.override(alpha_write(execute=slow)):
        instance = start(linear(action("a"), action("b")))
        report = instance_run(instance_id=instance.pk, worker="worker-1")
    assert report.stale, "the first worker learns that its answer came too late"
    instance.refresh_from_db()
    return instance


def took_over(instance_id: int) -> None:
    """Another worker finds step a left executing after dispatch: outcome unknown."""
    instance_run(instance_id=instance_id, worker="worker-2")


def test_an_answer_after_the_step_turned_outcome_unknown_is_kept_not_applied(short_lease):
    instance = answered_late(took_over)
    token = token_of(instance, "a")
    assert token.state == TokenState.OUTCOME_UNKNOWN, "the late answer moved nothing"
    assert op_states(instance) == ["outcome_unknown"]
    (late,) = api.observations_of(subject(instance), kind="late")
    assert (late.outcome, late.applied) == ("succeeded", False)
    assert late.values == {"stored": "v1", "key": token.idempotency_key}
    assert late.operation.key == token.operation_key
    # The chained fact names the ledger state the answer arrived in.
    fact = api.checkpoints_of(subject(instance)).filter(kind="operation.observation").last()
    assert '"kind":"late"' in fact.fact and '"ledger_state":"outcome_unknown"' in fact.fact
    assert not IntegrityIncident.objects.exists() and chain_ok(instance)


def test_an_answer_under_a_stale_fence_is_kept_on_its_dispatched_operation(short_lease):
    instance = answered_late(lambda instance_id: None)  # lease lapsed, nobody took over
    assert op_states(instance) == ["dispatched"]
    (late,) = api.observations_of(subject(instance), kind="late")
    assert (late.outcome, late.source) == ("succeeded", "execute")
    fact = api.checkpoints_of(subject(instance)).filter(kind="operation.observation").get()
    assert '"ledger_state":"dispatched"' in fact.fact and chain_ok(instance)


def test_a_late_answer_contradicting_a_decision_opens_an_integrity_incident(
    short_lease, requester, approver
):
    def decided_absent(instance_id: int) -> None:
        took_over(instance_id)
        token = Token.objects.get(instance_id=instance_id, node_id="a")
        decision = handoff_request(
            instance_id=instance_id,
            token_id=token.pk,
            kind="effect_absent",
            rationale="Nothing in the registry when we looked.",
            actor=requester,
            evidence=[evidence()],
            checks={"store": "looked"},
        )
        handoff_approve(decision_id=decision.pk, actor=approver, result_fp=decision.result_fp)

    instance = answered_late(decided_absent)
    assert op_states(instance) == ["effect_absent"]
    (late,) = api.observations_of(subject(instance), kind="late")
    assert late.outcome == "succeeded"
    incident = IntegrityIncident.objects.get(subject_id=str(instance.pk), status="open")
    assert "contradicts" in incident.reason and "effect_absent" in incident.reason
    assert incident.position == late.chain_seq


def test_a_late_failure_after_effect_confirmed_is_a_contradiction_too(subject, fence):
    op = record(subject, fence)
    api.operation_observe(key=op.key, state="outcome_unknown", fence=fence)
    api.operation_observe(key=op.key, state="effect_confirmed", fence=fence, by="provider")
    api.observation_record(key=op.key, kind="late", source="execute", outcome="succeeded")
    assert not IntegrityIncident.objects.exists(), "an agreeing late answer is just evidence"
    api.observation_record(
        key=op.key, kind="late", source="execute", outcome="failed", reason="declined"
    )
    incident = IntegrityIncident.objects.get(subject_id=subject.id)
    assert "effect_confirmed" in incident.reason
    assert Observation.objects.filter(operation__key=op.key).count() == 2
    assert api.chain_verify(subject).ok, "observations are chained, never replayed as moves"


def test_an_observation_keeps_no_value_a_database_cannot_store(subject, fence):
    op = record(subject, fence)
    with pytest.raises(api.RecoveryValidationError):
        api.observation_record(
            key=op.key, kind="late", source="execute", outcome="succeeded", values={"x": "a\0"}
        )
    assert not Observation.objects.exists()


def test_the_handoff_page_shows_findings_late_answers_and_asks_the_provider_now(
    short_lease, django_user_model
):
    instance = answered_late(took_over)
    token = token_of(instance, "a")
    operator = user_with(django_user_model, "olga", *OPERATOR)
    client = Client()
    client.force_login(operator)
    page = client.get(reverse("admin:engine_instance_change", args=[instance.pk]))
    html = page.content.decode()
    assert "What the provider said" in html and "Late answers" in html
    assert "Ask the provider now" in html
    # The request form is pre-filled from the provider's conclusive finding.
    assert re.search(r'value="effect_confirmed"[^>]*checked', html)
    assert "Pre-filled from the provider's finding above" in html.replace("&#x27;", "'")
    assert "returned stored=v1" in html
    target = reverse("admin:engine_instance_reconcile", args=[instance.pk, token.pk])
    # A GET on the POST-only action goes back to the instance page, never a bare 405.
    back = client.get(target)
    assert back.status_code == 302
    assert back.url == reverse("admin:engine_instance_change", args=[instance.pk])
    with registry.override(alpha.write):
        response = client.post(target, follow=True)
    messages = [str(m) for m in response.context["messages"]]
    assert any("says the effect happened" in m and "pre-filled" in m for m in messages)
    newest = api.provider_findings(token.operation_key)[0]
    assert newest.asked_by == operator
    viewer = user_with(django_user_model, "vera", "engine.view_instance")
    other = Client()
    other.force_login(viewer)
    assert other.post(target).status_code == 403
    assert (
        "Ask the provider now"
        not in other.get(
            reverse("admin:engine_instance_change", args=[instance.pk])
        ).content.decode()
    )
    instance.refresh_from_db()
    assert instance.status == InstanceStatus.BLOCKED
