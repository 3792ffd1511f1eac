"""The reconciliation ladder (issue 9, item 2): an uncertain step is put to its provider
before a person, by the engine's own timers, and what it said is kept as evidence."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json

import pytest
from django.test import Client
from django.urls import reverse

from govflow.demo import store
from govflow.engine.models import Instance, InstanceStatus, TokenState, WaitKind
from govflow.engine.provider import Failed, VerificationCheck
from govflow.engine.registry import RegistryError, registry, validate_action
from govflow.engine.services import reconcile
from govflow.engine.services.instances import instance_cancel
from govflow.engine.services.runtime import instance_run
from govflow.engine.services.sweep import _requeue_candidates
from govflow.handoffs.admin.detail import finding_initial, finding_result
from govflow.handoffs.services.desk import handoff_approve, handoff_ask_provider, handoff_request
from recovery import api
from recovery.models import Checkpoint, Decision, Observation
from tests.dbclock import db_now
from tests.engine_helpers import (
    alpha_write,
    chain_ok,
    evidence,
    make_due,
    op_states,
    token_of,
    user_with,
)
from tests.flows import action, drive, linear, start
from tests.integration.test_demo import demo_store, published  # noqa: F401  (fixtures)
from tests.integration.test_demo_confirmed import register_uncertain
from tests.providers.alpha import actions as alpha
from tests.providers.alpha import effects

pytestmark = pytest.mark.django_db


def asking(**changes):
    """``alpha.write`` whose reconcile calls are counted; returns (action, calls)."""
    calls: list[str] = []
    base = changes.pop("reconcile", alpha.write.reconcile)

    def counted(context):
        calls.append(context.phase)
        return base(context)

    return alpha_write(reconcile=counted, **changes), calls


def uncertain(write, script: str = "raise_after") -> Instance:
    """An instance a → b whose step a raised after (or before) its effect."""
    effects.SCRIPT["alpha.write"] = [script]
    with registry.override(write):
        return drive(start(linear(action("a"), action("b"))))


def observed_facts(instance, kind: str) -> list[dict]:
    rows = Checkpoint.objects.filter(
        subject_type="govflow.instance", subject_id=str(instance.pk), kind=kind
    ).order_by("seq")
    return [json.loads(row.fact) for row in rows]


def test_the_provider_s_word_settles_the_step_when_its_action_says_so():
    write, calls = asking(reconcile_settles=True)
    instance = uncertain(write)
    assert instance.status == InstanceStatus.COMPLETED, instance.reason
    assert calls == ["reconcile"], "asked once, before any operator"
    assert op_states(instance) == ["effect_confirmed", "succeeded"]
    token = token_of(instance, "a")
    assert token.state == TokenState.COMPLETED and "provider's reconcile" in token.reason
    # The output went through the node's output mapping like a normal success.
    assert instance.variables["a"] == {"stored": "v1"}
    (finding,) = api.provider_findings(token.operation_key)
    assert (finding.outcome, finding.applied, finding.values) == (
        "succeeded",
        True,
        {"stored": "v1"},
    )
    # The ledger records the provider as the authority, and the finding is chained.
    confirmed = [f for f in observed_facts(instance, "operation.observed") if f.get("by")]
    assert [(f["state"], f["by"]) for f in confirmed] == [("effect_confirmed", "provider")]
    (fact,) = observed_facts(instance, "operation.observation")
    assert (fact["by"], fact["applied"], fact["outcome"]) == ("provider", True, "succeeded")
    assert not Decision.objects.exists(), "nobody had to guess or decide"
    assert len(effects.effects()) == 2 and effects.call_count("alpha.write") == 2
    assert chain_ok(instance)


def test_by_default_a_conclusive_finding_waits_for_a_decision_it_pre_fills(requester, approver):
    write, calls = asking()
    instance = uncertain(write)
    token = token_of(instance, "a")
    assert token.state == TokenState.OUTCOME_UNKNOWN and token.wait_kind == ""
    assert instance.status == InstanceStatus.BLOCKED
    assert "found that the effect happened" in instance.reason
    assert op_states(instance) == ["outcome_unknown"], "a finding never moves the ledger"
    findings = api.provider_findings(token.operation_key)
    assert [(f.outcome, f.applied, f.asked_by) for f in findings] == [("succeeded", False, None)]
    initial = finding_initial(findings)
    assert initial["kind"] == "effect_confirmed" and "stored=v1" in initial["rationale"]
    with registry.override(write):
        assert drive(instance).status == InstanceStatus.BLOCKED
        assert calls == ["reconcile"], "a conclusive finding is not asked for again"
        decision = handoff_request(
            instance_id=instance.pk,
            token_id=token.pk,
            kind=initial["kind"],
            rationale=initial["rationale"],
            actor=requester,
            evidence=[evidence()],
            checks={"store": "the finding above"},
        )
        handoff_approve(decision_id=decision.pk, actor=approver, result_fp=decision.result_fp)
        instance = drive(instance)
    assert instance.status == InstanceStatus.COMPLETED, instance.reason
    assert op_states(instance) == ["effect_confirmed", "succeeded"]
    assert chain_ok(instance)


def test_unknown_is_asked_again_with_backoff_up_to_the_budget_then_left_to_the_operator():
    write, calls = asking(reconcile_budget=3, reconcile_backoff=100.0)
    instance = uncertain(write, "raise_before")  # nothing in the store: the provider can't say
    token = token_of(instance, "a")
    assert calls == ["reconcile"]
    assert token.wait_kind == WaitKind.RECONCILE
    first = (token.not_before - db_now()).total_seconds()
    assert 90 < first <= 100, "the second ask waits reconcile_backoff"
    with registry.override(write):
        assert drive(instance).status == InstanceStatus.BLOCKED
        assert calls == ["reconcile"], "not asked again before it is due"
        Instance.objects.filter(pk=instance.pk).update(runnable_at=None)
        assert instance.pk not in _requeue_candidates(100)
        make_due(token)
        assert instance.pk in _requeue_candidates(100), "the sweep queues a due ask"
        drive(instance)
        assert calls == ["reconcile"] * 2
        second = (token_of(instance, "a").not_before - db_now()).total_seconds()
        assert 190 < second <= 200, "each later ask waits twice as long"
        make_due(token)
        instance = drive(instance)
        assert calls == ["reconcile"] * 3
        make_due(token)
        instance = drive(instance)
    assert calls == ["reconcile"] * 3, "the budget is honoured"
    token = token_of(instance, "a")
    assert token.state == TokenState.OUTCOME_UNKNOWN and token.wait_kind == ""
    assert "asked 3 time(s) and could not say" in instance.reason
    assert op_states(instance) == ["outcome_unknown"]
    assert [f.outcome for f in api.provider_findings(token.operation_key)] == ["unknown"] * 3
    assert not Decision.objects.exists() and chain_ok(instance)


def test_a_changed_input_fails_closed_and_asks_nothing(monkeypatch, django_user_model):
    write, calls = asking()
    effects.SCRIPT["alpha.write"] = ["raise_after"]
    monkeypatch.setattr(reconcile, "build_input", lambda mapping, variables: {"value": "other"})
    with registry.override(write):
        instance = drive(start(linear(action("a"))))
        token = token_of(instance, "a")
        assert calls == [] and not Observation.objects.exists()
        assert token.wait_kind == "" and "changed since it was dispatched" in token.reason
        assert op_states(instance) == ["outcome_unknown"]
        operator = user_with(django_user_model, "olga", "engine.operate_instance")
        with pytest.raises(api.InputFingerprintMismatch):
            handoff_ask_provider(instance_id=instance.pk, token_id=token.pk, actor=operator)
    assert calls == [] and not Observation.objects.exists()
    # Below the engine too: an answer for another input is refused, nothing recorded.
    with pytest.raises(api.InputFingerprintMismatch):
        api.observation_record(
            key=token.operation_key,
            kind="reconcile",
            source="reconcile",
            outcome="succeeded",
            input={"value": "other"},
        )
    assert not Observation.objects.exists() and chain_ok(instance)


def test_automatic_checks_are_asked_too_and_their_findings_kept_and_shown(django_user_model):
    check = VerificationCheck(
        "store",
        "Look the idempotency key up in the alpha store.",
        automatic=lambda c: (
            "in the store" if effects.effect_exists(c.idempotency_key) else "absent"
        ),
    )
    write = alpha_write(reconcile=None, checks=(check,))
    instance = uncertain(write)
    token = token_of(instance, "a")
    (finding,) = api.provider_findings(token.operation_key)
    assert (finding.kind, finding.source, finding.values) == (
        "check",
        "store",
        {"finding": "in the store"},
    )
    assert token.state == TokenState.OUTCOME_UNKNOWN and token.wait_kind == ""
    assert "automatic checks' findings are shown" in instance.reason
    assert [f["source"] for f in observed_facts(instance, "operation.observation")] == ["store"]
    client = Client()
    client.force_login(user_with(django_user_model, "vera", "engine.view_instance"))
    with registry.override(write):
        page = client.get(reverse("admin:engine_instance_change", args=[instance.pk]))
    html = page.content.decode()
    assert "check store" in html and "in the store" in html
    assert "Ask the provider now" not in html, "only operators may ask"


def test_an_operator_asks_the_provider_now_without_using_up_the_budget(django_user_model):
    write, calls = asking(reconcile_budget=1)
    instance = uncertain(write, "raise_before")
    token = token_of(instance, "a")
    assert calls == ["reconcile"] and token.wait_kind == ""
    operator = user_with(django_user_model, "olga", "engine.operate_instance")
    viewer = user_with(django_user_model, "vera", "engine.view_instance")
    with registry.override(write):
        with pytest.raises(api.RecoveryValidationError):
            handoff_ask_provider(instance_id=instance.pk, token_id=token.pk, actor=viewer)
        # Meanwhile the effect turned up at the provider (it was only slow).
        effects.apply_effect(token.idempotency_key, "alpha.write", {"value": "value"})
        asked = handoff_ask_provider(instance_id=instance.pk, token_id=token.pk, actor=operator)
    assert (asked.outcome, asked.settled) == ("succeeded", False)
    newest = api.provider_findings(token.operation_key)[0]
    assert (newest.outcome, newest.asked_by) == ("succeeded", operator)
    assert calls == ["reconcile"] * 2
    instance.refresh_from_db()
    assert "found that the effect happened" in instance.reason


def test_reconcile_policy_is_validated_at_registration():
    with pytest.raises(RegistryError, match="reconcile_settles=True needs a reconcile hook"):
        validate_action(dataclasses.replace(alpha.write, reconcile=None, reconcile_settles=True))
    with pytest.raises(RegistryError, match="reconcile_budget"):
        validate_action(dataclasses.replace(alpha.write, reconcile_budget=-1))
    with pytest.raises(RegistryError, match="reconcile_backoff"):
        validate_action(dataclasses.replace(alpha.write, reconcile_backoff=0))


def test_a_provider_that_says_failed_settles_as_effect_absent_with_a_retry_available():
    def says_failed(context):
        return Failed("no such registration")

    write = alpha_write(reconcile=says_failed, reconcile_settles=True)
    instance = uncertain(write, "raise_before")
    token = token_of(instance, "a")
    assert token.state == TokenState.FAILED and "effect absent" in token.reason
    assert instance.reason == (
        "Effect absent (the provider's reconcile): retry the step or cancel the instance."
    )
    assert op_states(instance) == ["effect_absent"]
    assert chain_ok(instance)


def test_a_reconcile_that_raises_is_an_unknown_answer():
    def broken(context):
        raise ConnectionError("registry down")

    write = alpha_write(reconcile=broken, reconcile_budget=2, reconcile_backoff=60.0)
    instance = uncertain(write)
    token = token_of(instance, "a")
    (finding,) = api.provider_findings(token.operation_key)
    assert finding.outcome == "unknown" and "ConnectionError" in finding.reason
    assert token.wait_kind == WaitKind.RECONCILE
    assert (
        dt.timedelta(seconds=55)
        < token.not_before - finding.observed_at
        <= dt.timedelta(seconds=61)
    )
    assert instance_run(instance_id=instance.pk).status == InstanceStatus.BLOCKED


def test_asking_about_a_cancelled_instance_keeps_the_answer_and_moves_nothing(
    django_user_model,
):
    write, _ = asking(reconcile_budget=1)
    instance = uncertain(write, "raise_before")  # the provider could not say: still open
    operator = user_with(django_user_model, "olga", "engine.operate_instance")
    instance_cancel(instance_id=instance.pk, actor=operator, reason="The applicant withdrew.")
    token = token_of(instance, "a")
    settled = alpha_write(reconcile=write.reconcile, reconcile_settles=True)
    with registry.override(settled):
        effects.apply_effect(token.idempotency_key, "alpha.write", {"value": "v1"})
        asked = handoff_ask_provider(instance_id=instance.pk, token_id=token.pk, actor=operator)
    assert (asked.outcome, asked.settled) == ("succeeded", False)
    instance.refresh_from_db()
    assert instance.status == InstanceStatus.CANCELLED, "a cancelled instance goes nowhere"
    assert token_of(instance, "a").state == TokenState.OUTCOME_UNKNOWN
    assert op_states(instance) == ["outcome_unknown"], "its case stays with a person"
    assert api.provider_findings(token.operation_key)[0].outcome == "succeeded"


def test_the_demo_register_s_finding_pre_fills_the_decision_s_result(
    published,  # noqa: F811
    django_user_model,
):
    instance, register = register_uncertain(published)
    number = store.application_find(register.idempotency_key)["application_id"]
    (finding,) = [f for f in api.provider_findings(register.operation_key) if f.kind == "reconcile"]
    assert finding.values["application_id"] == number, "the provider's word, kept"
    assert finding_result([finding])["application_id"] == number
    operator = user_with(
        django_user_model,
        "olga",
        "engine.view_instance",
        "engine.operate_instance",
        "recovery.request_decision",
    )
    client = Client()
    client.force_login(operator)
    html = client.get(reverse("admin:engine_instance_change", args=[instance.pk])).content
    assert f'value="{number}"'.encode() in html, "the result field starts from the finding"
