"""Effect confirmed with the step's result: typed by the action's output schema, checked by
the service, chained, approved as shown, and applied through the node's output mapping."""

from __future__ import annotations

import dataclasses
import io
import json

import pytest
from django.core.management import call_command

from govflow.engine.errors import InvalidRequest
from govflow.engine.models import InstanceStatus, TokenState
from govflow.engine.provider import Succeeded
from govflow.engine.registry import registry
from govflow.engine.services.instances import instance_cancel
from govflow.handoffs.services.desk import handoff_approve, handoff_request
from recovery import api
from recovery.models import Checkpoint, Decision, IntegrityIncident
from tests.engine_helpers import chain_ok, evidence, operations, subject, token_of
from tests.flows import action, drive, linear, start
from tests.providers.alpha import actions as alpha
from tests.providers.alpha import effects

pytestmark = pytest.mark.django_db

CHECKS = {"store": "Found the record in the alpha store."}
OUTPUT = {
    "type": "object",
    "properties": {
        "stored": {"type": "string", "minLength": 1, "title": "Stored value"},
        "key": {"type": "string", "title": "Idempotency key"},
        "copies": {"type": "integer", "minimum": 1, "title": "Copies"},
    },
    "required": ["key", "stored"],
}
TYPED = dataclasses.replace(alpha.write, output_schema=OUTPUT)


@pytest.fixture(autouse=True)
def typed_write():
    with registry.override(TYPED):
        yield


def uncertain(**node):
    """a (maps its output) → b (reads it), blocked on an ``outcome_unknown`` step a."""
    effects.SCRIPT["alpha.write"] = ["raise_after"]
    a = action("a", output={"written.value": "stored", "written.key": "key"}, **node)
    b = action("b", value="written.value")
    instance = drive(start(linear(a, b)))
    assert token_of(instance, "a").state == TokenState.OUTCOME_UNKNOWN
    return instance


def request(instance, requester, kind="effect_confirmed", **kwargs):
    kwargs.setdefault("evidence", [evidence()] if kind != "cancel" else [])
    return handoff_request(
        instance_id=instance.pk,
        token_id=token_of(instance, "a").pk,
        kind=kind,
        rationale="The alpha store holds the record.",
        actor=requester,
        checks=CHECKS,
        **kwargs,
    )


def chain_length(instance) -> int:
    s = subject(instance)
    return Checkpoint.objects.filter(subject_type=s.type, subject_id=s.id).count()


def test_a_confirmed_result_becomes_the_steps_output_and_the_instance_completes(
    requester, approver
):
    instance = uncertain()
    decision = request(instance, requester, result={"stored": "v1", "key": "k-1", "copies": 2})
    assert decision.result == {"stored": "v1", "key": "k-1", "copies": 2}
    assert decision.result_fp == api.fingerprint_value(
        api.FingerprintKind.RESULT, {"copies": 2, "key": "k-1", "stored": "v1"}
    )
    approved = handoff_approve(
        decision_id=decision.pk, actor=approver, result_fp=decision.result_fp
    )
    assert approved.state == "approved"

    instance.refresh_from_db()
    # Applied in the approval's commit, through the node's output mapping.
    assert instance.variables["written"] == {"value": "v1", "key": "k-1"}
    instance = drive(instance)
    assert instance.status == InstanceStatus.COMPLETED, instance.reason
    confirmed, b = operations(instance)
    assert (confirmed.state, b.state) == ("effect_confirmed", "succeeded")
    # The ledger's result of the confirmed operation is the approved result's fingerprint,
    # as a provider success with this output would have recorded it.
    assert confirmed.result_fp == decision.result_fp
    # Step b ran with the confirmed value, and the provider was never asked again for a.
    assert effects.call_count("alpha.write") == 2
    assert b.input_fp == api.fingerprint_value(api.FingerprintKind.INPUT, {"value": "v1"})
    assert chain_ok(instance)


def test_the_result_fingerprint_is_part_of_the_requests_chained_fact(requester):
    instance = uncertain()
    decision = request(instance, requester, result={"stored": "v1", "key": "k"})
    s = subject(instance)
    fact = (
        Checkpoint.objects.filter(subject_type=s.type, subject_id=s.id, kind="decision.requested")
        .values_list("fact", flat=True)
        .get()
    )
    assert json.loads(fact)["result_fp"] == decision.result_fp


@pytest.mark.parametrize(
    ("result", "says"),
    [
        (None, "missing key (Idempotency key), stored (Stored value)"),
        ({"stored": "v1"}, "missing key (Idempotency key)"),
        ({"stored": "v1", "key": "k", "copies": "two"}, "copies: 'two' is not of type 'integer'"),
        ({"stored": "v1", "key": "k", "copies": 0}, "copies: 0 is less than the minimum of 1"),
        ({"stored": "", "key": "k"}, "stored: '' should be non-empty"),
    ],
)
def test_a_confirmed_decision_without_a_valid_result_is_refused_naming_the_fields(
    requester, result, says
):
    instance = uncertain()
    before = chain_length(instance)
    with pytest.raises(api.DecisionError) as refused:
        request(instance, requester, result=result)
    assert says in str(refused.value)
    assert "nothing was recorded" in str(refused.value)
    assert Decision.objects.count() == 0 and chain_length(instance) == before


@pytest.mark.parametrize("kind", ["effect_absent", "cancel"])
def test_effect_absent_and_cancel_carry_no_result(requester, kind):
    instance = uncertain()
    with pytest.raises(api.DecisionError, match="carries no result"):
        request(instance, requester, kind=kind, result={"stored": "v1", "key": "k"})
    assert Decision.objects.count() == 0


@pytest.mark.parametrize(
    ("result", "says"),
    [
        ({"stored": "x" * 70_000, "key": "k"}, "bytes of JSON"),
        ({"stored": "v\x00", "key": "k"}, "U+0000"),
        ({"stored": "v", "key": "k", "copies": 2**60}, "outside ±(2**53 - 1)"),
        ({"stored": "v", "key": "k", "extra": 1e300}, "too large to keep exactly"),
        ({"stored": "v", "key": "k", "extra": float("nan")}, "not a finite number"),
    ],
)
def test_a_result_the_input_guard_refuses_is_not_recorded(requester, settings, result, says):
    settings.GOVFLOW_PAYLOAD_MAX_BYTES = 64 * 1024
    instance = uncertain()
    with pytest.raises(api.DecisionError, match="cannot be recorded as written") as refused:
        request(instance, requester, result=result)
    assert says in str(refused.value)
    assert Decision.objects.count() == 0


def test_a_deeply_nested_result_is_refused(requester):
    deep: dict = {}
    node = deep
    for _ in range(200):
        node["x"] = {}
        node = node["x"]
    instance = uncertain()
    with pytest.raises(api.DecisionError, match="nested deeper"):
        request(instance, requester, result={"stored": "v", "key": "k", "extra": deep})


def test_approving_checks_the_result_the_approver_was_shown(requester, approver):
    instance = uncertain()
    decision = request(instance, requester, result={"stored": "v1", "key": "k"})
    shown = api.fingerprint_value(api.FingerprintKind.RESULT, {"stored": "v2", "key": "k"})
    with pytest.raises(api.DecisionConflict, match="does not carry the result you were shown"):
        handoff_approve(decision_id=decision.pk, actor=approver, result_fp=shown)
    decision.refresh_from_db()
    assert decision.state == "requested"
    assert token_of(instance, "a").state == TokenState.OUTCOME_UNKNOWN


def test_a_result_edited_in_the_database_breaks_the_chain_and_is_never_applied(requester, approver):
    instance = uncertain()
    decision = request(instance, requester, result={"stored": "v1", "key": "k"})
    Decision.objects.filter(pk=decision.pk).update(result={"stored": "forged", "key": "k"})
    verification = api.chain_verify(subject(instance))
    assert not verification.ok
    assert f"decision {decision.pk}'s result differs" in verification.reason

    # Rewriting the fingerprint to match the forged value does not help: the chain has it.
    forged_fp = api.fingerprint_value(api.FingerprintKind.RESULT, {"stored": "forged", "key": "k"})
    Decision.objects.filter(pk=decision.pk).update(result_fp=forged_fp)
    assert not api.chain_verify(subject(instance)).ok
    # The approver is shown the forged values and approves what they see: the chain refuses.
    with pytest.raises(api.ChainBroken):
        handoff_approve(decision_id=decision.pk, actor=approver, result_fp=forged_fp)
    instance.refresh_from_db()
    assert "written" not in instance.variables
    assert token_of(instance, "a").state == TokenState.OUTCOME_UNKNOWN
    assert IntegrityIncident.objects.filter(status="open").exists()


def test_recovery_verify_reports_an_edited_result(requester):
    instance = uncertain()
    decision = request(instance, requester, result={"stored": "v1", "key": "k"})
    out = io.StringIO()
    call_command("recovery_verify", stdout=out, stderr=out)
    Decision.objects.filter(pk=decision.pk).update(result={"stored": "v9", "key": "k"})
    out = io.StringIO()
    with pytest.raises(SystemExit):
        call_command("recovery_verify", stdout=out, stderr=out)
    assert f"decision {decision.pk}'s result differs" in out.getvalue()


def test_a_node_without_an_output_mapping_keeps_the_result_under_its_id(requester, approver):
    effects.SCRIPT["alpha.write"] = ["raise_after"]
    instance = drive(start(linear(action("a"))))
    decision = request(instance, requester, result={"stored": "v1", "key": "k", "copies": 3})
    handoff_approve(decision_id=decision.pk, actor=approver, result_fp=decision.result_fp)
    instance = drive(instance)
    assert instance.status == InstanceStatus.COMPLETED
    assert instance.variables["a"] == {"stored": "v1", "key": "k", "copies": 3}


def test_without_an_output_schema_the_mapped_fields_are_required_strings(requester, approver):
    with registry.override(alpha.write):  # no output schema
        instance = uncertain()
        with pytest.raises(api.DecisionError, match=r"missing key, stored"):
            request(instance, requester, result={})
        with pytest.raises(api.DecisionError, match="key: 3 is not of type 'string'"):
            request(instance, requester, result={"stored": "v1", "key": 3})
        decision = request(instance, requester, result={"stored": "v1", "key": "3"})
        handoff_approve(decision_id=decision.pk, actor=approver, result_fp=decision.result_fp)
    instance.refresh_from_db()
    assert instance.variables["written"] == {"value": "v1", "key": "3"}


def test_an_approval_refuses_a_result_the_changed_output_schema_rejects(requester, approver):
    instance = uncertain()
    decision = request(instance, requester, result={"stored": "v1", "key": "k"})
    stricter = {**OUTPUT, "required": ["copies", "key", "stored"]}
    changed = dataclasses.replace(TYPED, output_schema=stricter)
    says = r"missing copies.*the provider changed the action's output schema"
    with registry.override(changed), pytest.raises(InvalidRequest, match=says):
        handoff_approve(decision_id=decision.pk, actor=approver, result_fp=decision.result_fp)
    decision.refresh_from_db()
    assert decision.state == "requested"


def test_a_confirmed_decision_without_a_result_cannot_complete_a_step_that_needs_one(
    requester, approver
):
    # As decisions requested before they carried results were: straight to the core.
    instance = uncertain()
    decision = api.decision_request(
        operation_key=token_of(instance, "a").operation_key,
        kind="effect_confirmed",
        rationale="The alpha store holds the record.",
        requested_by=requester,
        evidence=[evidence()],
    )
    assert (decision.result, decision.result_fp) == (None, "")
    with pytest.raises(InvalidRequest, match=r"missing key .*it carries no result"):
        handoff_approve(decision_id=decision.pk, actor=approver, result_fp=decision.result_fp)
    decision.refresh_from_db()
    assert decision.state == "requested"
    assert token_of(instance, "a").state == TokenState.OUTCOME_UNKNOWN


def test_a_result_confirmed_after_the_instance_was_cancelled_is_recorded_not_applied(
    requester, approver
):
    instance = uncertain()
    instance_cancel(instance_id=instance.pk, actor=requester, reason="Withdrawn by applicant.")
    decision = request(instance, requester, result={"stored": "v1", "key": "k"})
    handoff_approve(decision_id=decision.pk, actor=approver, result_fp=decision.result_fp)
    instance.refresh_from_db()
    assert instance.status == InstanceStatus.CANCELLED
    assert token_of(instance, "a").state == TokenState.COMPLETED
    assert "written" not in instance.variables
    assert operations(instance)[0].result_fp == decision.result_fp
    assert chain_ok(instance)


# -- a provider's success is checked against the output schema too -----------------------


def test_a_success_whose_output_fails_the_schema_is_an_unknown_outcome():
    effects.SCRIPT["alpha.write"] = [Succeeded({"stored": "v1"})]  # no key
    instance = drive(start(linear(action("a", output={"written.value": "stored"}))))
    a = token_of(instance, "a")
    assert a.state == TokenState.OUTCOME_UNKNOWN
    assert "does not match the action's output schema (missing key (Idempotency key))" in a.reason
    assert instance.status == InstanceStatus.BLOCKED
    assert "written" not in instance.variables


def test_a_success_matching_the_schema_runs_on():
    effects.SCRIPT["alpha.write"] = [Succeeded({"stored": "v1", "key": "k"})]
    instance = drive(start(linear(action("a", output={"written.value": "stored"}))))
    assert instance.status == InstanceStatus.COMPLETED
    assert instance.variables["written"] == {"value": "v1"}


def test_an_atomic_success_whose_output_fails_the_schema_rolls_back_and_retries():
    from tests.providers.alpha.models import Note

    noted = dataclasses.replace(
        alpha.note,
        output_schema={"type": "object", "required": ["noted_id"]},
        retry_budget=0,
    )
    with registry.override(noted):
        instance = drive(start(linear(action("a", name=noted.name))))
    assert instance.status == InstanceStatus.FAILED
    assert "does not match the action's output schema (missing noted_id)" in instance.reason
    assert "rolled back" in instance.reason
    assert Note.objects.count() == 0


def test_a_stored_result_keeps_its_fingerprint_as_the_database_gives_it_back(requester):
    instance = uncertain()
    result = {"stored": "ü ✓", "key": "k", "extra": {"n": 0.1, "big": 9007199254740991.0}}
    decision = request(instance, requester, result=result)
    decision.refresh_from_db()
    assert api.fingerprint_value(api.FingerprintKind.RESULT, decision.result) == (
        decision.result_fp
    )
    assert api.chain_verify(subject(instance)).ok


def test_an_approval_that_names_no_shown_result_is_refused(requester, approver):
    """A decision carrying result values is approved only against the values' fingerprint:
    a caller (or a crafted form post) that leaves it out approves nothing."""
    instance = uncertain()
    decision = request(instance, requester, result={"stored": "v1", "key": "k"})
    with pytest.raises(api.DecisionConflict, match="must name the fingerprint"):
        handoff_approve(decision_id=decision.pk, actor=approver)
    decision.refresh_from_db()
    assert decision.state == "requested"
    assert token_of(instance, "a").state == TokenState.OUTCOME_UNKNOWN
