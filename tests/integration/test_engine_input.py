"""Bad input is rejected before anything is recorded: no instance, no ledger row, no call."""

from __future__ import annotations

import pytest

from govflow.engine.errors import InvalidRequest
from govflow.engine.models import Incident, Instance, InstanceStatus, TokenState
from govflow.engine.registry import registry
from govflow.engine.services.instances import instance_start
from govflow.engine.services.runtime import instance_run
from recovery.models import Operation
from tests.engine_helpers import (
    alpha_write,
    incidents,
    publish,
    token_of,
    user_with,
)
from tests.flows import action, drive, linear, start
from tests.providers.alpha import effects

pytestmark = pytest.mark.django_db

SCHEMA = {
    "type": "object",
    "required": ["applicant"],
    "properties": {
        "applicant": {
            "type": "object",
            "required": ["name"],
            "properties": {"name": {"type": "string"}},
        },
        "fee": {"type": "number", "minimum": 0},
    },
}


@pytest.fixture
def definition():
    return publish(linear(action("a"), variables_schema=SCHEMA))


def refused(definition, variables) -> str:
    with pytest.raises(InvalidRequest) as caught:
        instance_start(definition=definition, variables=variables)
    assert Instance.objects.count() == 0, "a refused start must record nothing"
    return str(caught.value)


@pytest.mark.parametrize("variables", [["applicant"], "applicant=Ada", 42])
def test_start_with_variables_that_are_not_an_object_is_refused(definition, variables):
    assert refused(definition, variables) == (
        "Variables must be a JSON object mapping names to values."
    )


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_start_with_a_non_finite_number_is_refused_naming_the_path(definition, bad):
    message = refused(definition, {"applicant": {"name": "Ada"}, "fee": bad})
    assert message.startswith("Variables are malformed:") and "fee" in message
    assert "not a finite number" in message


def test_start_with_a_non_json_value_is_refused(definition):
    assert "not a JSON value" in refused(definition, {"applicant": {"name": {1, 2}}})


def test_start_with_variables_violating_the_definition_schema_names_each_field(definition):
    message = refused(definition, {"applicant": {"name": 7}, "fee": -1})
    assert message.startswith(f"Variables do not match {definition}:")
    assert "applicant.name: 7 is not of type 'string'" in message
    assert "fee: -1 is less than the minimum of 0" in message


def test_start_without_a_required_variable_is_refused(definition):
    assert "'applicant' is a required property" in refused(definition, {"fee": 3})


def test_start_with_a_bad_tenant_is_refused(definition):
    with pytest.raises(InvalidRequest, match="tenant must be a non-empty string"):
        instance_start(definition=definition, variables={"applicant": {"name": "Ada"}}, tenant=" ")
    assert Instance.objects.count() == 0


def test_start_needs_the_start_permission(definition, django_user_model):
    clerk = user_with(django_user_model, "clerk")
    with pytest.raises(InvalidRequest, match=r"engine\.start_instance"):
        instance_start(definition=definition, variables={"applicant": {"name": "Ada"}}, actor=clerk)
    assert Instance.objects.count() == 0


def assert_blocked_before_dispatch(instance, kind: str, *fragments: str) -> None:
    assert instance.status == InstanceStatus.BLOCKED
    for fragment in fragments:
        assert fragment in instance.reason
    assert token_of(instance, "a").state == TokenState.READY
    assert not Operation.objects.exists(), "nothing may be recorded before dispatch"
    assert effects.call_count() == 0, "the provider must not be called"
    assert [k for k, _ in incidents(instance)] == [kind]


def test_action_input_violating_the_action_schema_blocks_before_dispatch():
    instance = drive(start(linear(action("a", value="count")), variables={"count": 5}))
    assert_blocked_before_dispatch(
        instance,
        "input",
        "The input of step 'a' violates the schema of alpha.write",
        "value: 5 is not of type 'string'",
        "Nothing was dispatched",
    )


def test_a_rejected_step_is_tried_once_per_run_and_opens_one_incident():
    instance = start(linear(action("a", value="count")), variables={"count": 5})
    first = instance_run(instance_id=instance.pk)
    assert first.status == InstanceStatus.BLOCKED
    assert first.steps == 2  # the start node, then the one rejection: no busy loop
    for _ in range(3):  # the sweep re-enqueues blocked instances that have ready work
        instance_run(instance_id=instance.pk)
    assert Incident.objects.filter(instance=instance).count() == 1
    assert not Operation.objects.exists()


def test_missing_variable_in_an_input_mapping_blocks_naming_the_variable():
    instance = drive(
        start(linear(action("a", value="applicant.name")), variables={"applicant": {}})
    )
    assert_blocked_before_dispatch(
        instance, "input", "Step 'a' needs the variable 'applicant.name', which is not set;"
    )
    assert "cancel this instance and start the case again" in instance.reason


def test_a_literal_input_needs_no_variable():
    instance = drive(
        start(
            linear(
                {
                    "id": "a",
                    "type": "action",
                    "action": "alpha.write",
                    "input": {"value": {"value": "fixed"}},
                }
            ),
            variables={},
        )
    )
    assert instance.status == InstanceStatus.COMPLETED, instance.reason
    assert instance.variables["a"]["stored"] == "fixed"


def test_a_preview_that_raises_blocks_before_dispatch_and_is_retried_later():
    calls = []

    def flaky_preview(data):
        calls.append(data)
        if len(calls) == 1:
            raise KeyError("office")
        return {"will": "write"}

    with registry.override(alpha_write(preview=flaky_preview)):
        instance = start(linear(action("a")))
        instance_run(instance_id=instance.pk)
        instance.refresh_from_db()
        assert_blocked_before_dispatch(
            instance,
            "preview",
            "The preview of alpha.write for step 'a' raised KeyError",
            "nothing was dispatched",
        )
        instance = drive(instance)  # what the sweep's re-enqueue does
    assert instance.status == InstanceStatus.COMPLETED, instance.reason
    assert instance.reason == ""
    assert len(effects.effects("alpha.write")) == 1


def test_a_step_of_a_deactivated_starter_is_not_dispatched(django_user_model):
    starter = user_with(django_user_model, "starter", "engine.start_instance")
    instance = start(linear(action("a")), actor=starter)
    assert instance.access["started_by"] == starter.pk
    django_user_model.objects.filter(pk=starter.pk).update(is_active=False)
    instance = drive(instance)
    assert_blocked_before_dispatch(
        instance,
        "access_revoked",
        f"The user who started this instance (id {starter.pk}) is no longer active",
    )
