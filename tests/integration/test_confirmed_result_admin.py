"""Effect confirmed with its result in the recovery desk: the request form asks for the
values, the approver sees exactly those values, and approving applies them."""

from __future__ import annotations

import dataclasses
import re

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from govflow.engine.models import InstanceStatus, TokenState
from govflow.engine.registry import registry
from govflow.engine.selectors import node_of
from govflow.engine.services.instances import instance_cancel
from govflow.handoffs.admin.detail import handoff_form
from recovery.models import Decision
from tests.flows import action, drive, linear, start
from tests.integration.test_engine_admin import logged_in, make_user, messages_of, url
from tests.providers.alpha import actions as alpha
from tests.providers.alpha import effects

pytestmark = pytest.mark.django_db

OUTPUT = {
    "type": "object",
    "properties": {
        "stored": {"type": "string", "minLength": 1, "title": "Stored value"},
        "key": {"type": "string", "title": "Record key", "description": "As the store shows it."},
        "copies": {"type": "integer", "minimum": 1, "title": "Copies"},
    },
    "required": ["key", "stored"],
}


@pytest.fixture(autouse=True)
def typed_write():
    with registry.override(dataclasses.replace(alpha.write, output_schema=OUTPUT)):
        yield


@pytest.fixture
def requester(django_user_model):
    return make_user(
        django_user_model,
        "olga",
        "engine.view_instance",
        "engine.operate_instance",
        "recovery.request_decision",
    )


@pytest.fixture
def checker(django_user_model):
    return make_user(django_user_model, "carl", "engine.view_instance", "recovery.approve_decision")


def blocked():
    effects.SCRIPT["alpha.write"] = ["raise_after"]
    write = action("write", output={"written.value": "stored", "written.key": "key"})
    instance = drive(start(linear(write, action("after", value="written.value"))))
    assert instance.status == InstanceStatus.BLOCKED
    return instance, instance.tokens.get(node_id="write")


def request_form(**fields) -> dict:
    return {
        "kind": "effect_confirmed",
        "check_store": "the key is in the store",
        "rationale": "The alpha store holds the record.",
        "evidence": [SimpleUploadedFile("store-extract.txt", b"key k-1, value v1\n")],
        **fields,
    }


def test_an_operator_confirms_with_the_result_and_a_second_person_approves_those_values(
    requester, checker
):
    instance, token = blocked()
    ops = logged_in(requester)
    page = ops.get(url("instance_change", instance.pk)).content.decode()
    assert "Stored value" in page and "Record key" in page and "As the store shows it." in page
    assert 'name="result_copies"' in page and 'type="number"' in page

    target = url("instance_handoff", instance.pk, token.pk)
    response = ops.post(target, request_form(result_stored="v1", result_key="k-1"))
    assert response.status_code == 302
    decision = Decision.objects.get()
    assert decision.result == {"stored": "v1", "key": "k-1"}

    as_checker = logged_in(checker)
    page = as_checker.get(url("instance_change", instance.pk)).content.decode()
    assert re.search(
        r"<strong>Stored value</strong> \(<code>stored</code>\):\s*<span[^>]*>v1<", page
    )
    assert re.search(r"<strong>Record key</strong> \(<code>key</code>\):\s*<span[^>]*>k-1<", page)
    assert f'name="result_fp" value="{decision.result_fp}"' in page

    approve = url("instance_decision_approve", instance.pk, decision.pk)
    done = as_checker.post(approve, {"result_fp": decision.result_fp}, follow=True)
    assert any(
        f"Decision {decision.pk} (Effect confirmed) is approved: step 'write' is completed "
        "with the confirmed result" in m
        for m in messages_of(done)
    )
    instance = drive(instance)
    assert instance.status == InstanceStatus.COMPLETED, instance.reason
    assert instance.variables["written"] == {"value": "v1", "key": "k-1"}


def test_a_missing_or_mistyped_result_is_shown_on_the_form_and_nothing_is_recorded(requester):
    instance, token = blocked()
    ops = logged_in(requester)
    target = url("instance_handoff", instance.pk, token.pk)
    response = ops.post(target, request_form(result_stored="v1", result_copies="many"))
    assert response.status_code == 200
    page = response.content.decode()
    assert "Required to record effect confirmed." in page  # the key
    assert "Enter a whole number." in page
    assert Decision.objects.count() == 0


def test_a_result_given_with_effect_absent_is_refused_on_the_form(requester):
    instance, token = blocked()
    response = logged_in(requester).post(
        url("instance_handoff", instance.pk, token.pk),
        request_form(kind="effect_absent", result_stored="v1"),
    )
    assert response.status_code == 200
    assert "Only effect confirmed records a result" in response.content.decode()
    assert Decision.objects.count() == 0


def test_an_approval_of_other_values_than_the_decision_carries_is_refused(requester, checker):
    instance, token = blocked()
    logged_in(requester).post(
        url("instance_handoff", instance.pk, token.pk),
        request_form(result_stored="v1", result_key="k-1"),
    )
    decision = Decision.objects.get()
    approve = url("instance_decision_approve", instance.pk, decision.pk)
    refused = logged_in(checker).post(approve, {"result_fp": "0" * 64}, follow=True)
    assert any("does not carry the result you were shown" in m for m in messages_of(refused))
    decision.refresh_from_db()
    token.refresh_from_db()
    assert (decision.state, token.state) == ("requested", TokenState.OUTCOME_UNKNOWN)
    # A post that leaves the fingerprint out (not the page's form) approves nothing either.
    bare = logged_in(checker).post(approve, follow=True)
    assert any("must name the fingerprint" in m for m in messages_of(bare))
    decision.refresh_from_db()
    assert decision.state == "requested"


def test_the_request_form_is_pre_filled_with_an_initial_result():
    instance, token = blocked()
    node = node_of(instance, token)
    action = registry.get(node["action"])
    form = handoff_form(instance, token, node, action, initial_result={"key": "k-7"})
    assert 'name="result_key" value="k-7"' in form.as_div()


def test_approving_on_a_cancelled_instance_says_the_instance_stays_cancelled(requester, checker):
    instance, token = blocked()
    instance_cancel(instance_id=instance.pk, actor=requester, reason="Withdrawn by applicant.")
    logged_in(requester).post(
        url("instance_handoff", instance.pk, token.pk),
        request_form(result_stored="v1", result_key="k-1"),
    )
    decision = Decision.objects.get()
    approve = url("instance_decision_approve", instance.pk, decision.pk)
    done = logged_in(checker).post(approve, {"result_fp": decision.result_fp}, follow=True)
    assert any(
        "step 'write' is recorded as completed; the instance stays cancelled" in m
        for m in messages_of(done)
    )
