"""The demo's building permit after its registration's answer was lost: an operator
confirms the registration with its application number, another approves, and the permit
is issued."""

from __future__ import annotations

import dataclasses
import io

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command

from govflow.demo import actions, store
from govflow.demo.sample import sample_variables
from govflow.engine.models import TokenState, WaitKind
from govflow.engine.provider import registry
from govflow.engine.services.instances import instance_start
from govflow.engine.services.triggers import trigger_deliver
from govflow.handoffs.services.desk import approval_decide, handoff_approve, handoff_request
from recovery import api
from tests.integration.test_demo import (  # noqa: F401  (fixtures)
    demo_store,
    drive,
    fire_timers,
    permits_officer,
    published,
    waiting,
)

pytestmark = pytest.mark.django_db


def _registered_then_lost(context):
    actions.register_application.execute(context)  # the registry has it now
    raise TimeoutError("the registry's answer never arrived")


LOST = dataclasses.replace(actions.register_application, execute=_registered_then_lost)


def register_uncertain(published):  # noqa: F811
    with registry.override(LOST):
        instance = drive(
            instance_start(
                definition=published["demo.building_permit"], variables=sample_variables()
            )
        )
    register = instance.tokens.get(node_id="register")
    assert register.state == TokenState.OUTCOME_UNKNOWN
    return instance, register


def confirm(instance, register, requester, result):
    return handoff_request(
        instance_id=instance.pk,
        token_id=register.pk,
        kind="effect_confirmed",
        rationale="The municipal registry shows the application under this step's key.",
        actor=requester,
        evidence=[SimpleUploadedFile("registry.txt", b"BP application found\n")],
        checks={"registry-search": "found it", "no-duplicate": "only one"},
        result=result,
    )


def test_confirming_register_with_the_application_number_lets_the_permit_complete(
    published,  # noqa: F811
    permits_officer,  # noqa: F811
    requester,
    approver,
):
    instance, register = register_uncertain(published)
    record = store.application_find(register.idempotency_key)
    number = record["application_id"]
    status = io.StringIO()
    call_command("demo_status", str(instance.pk), stdout=status)
    assert f"The municipal registry holds application {number}" in status.getvalue()

    with pytest.raises(api.DecisionError, match=r"missing application_id \(Application number\)"):
        confirm(instance, register, requester, {"registered_at": record["registered_at"]})
    with pytest.raises(api.DecisionError, match="application_id: 'APP-1' does not match"):
        confirm(
            instance,
            register,
            requester,
            {"application_id": "APP-1", "registered_at": record["registered_at"]},
        )
    decision = confirm(
        instance,
        register,
        requester,
        {"application_id": number, "registered_at": record["registered_at"]},
    )
    handoff_approve(decision_id=decision.pk, actor=approver, result_fp=decision.result_fp)

    instance = drive(instance)
    assert instance.variables["application"]["id"] == number
    waiting(instance, WaitKind.TIMER)  # the fee is paid, the neighbours notified
    assert fire_timers(instance) == 1
    instance = drive(instance)
    trigger_deliver(
        message="inspection.completed",
        correlation=number,
        delivery_id=f"inspection:{number}",
        payload={"result": "passed", "inspector": "J. de Vries", "remarks": "ok"},
    )
    instance = drive(instance)
    approval_decide(
        instance_id=instance.pk,
        token_id=waiting(instance, WaitKind.APPROVAL).pk,
        actor=permits_officer,
        approved=True,
        note="Complies.",
    )
    instance = drive(instance)
    assert instance.status == "completed", instance.reason
    assert (
        store.records_for(number)["permits"][0]["permit_number"]
        == (instance.variables["permit"]["number"])
    )
    # The registry holds one application: the confirmation did not register it again.
    assert len(store.records_for(number)["applications"]) == 1
    assert api.chain_verify(api.Subject("govflow.instance", str(instance.pk))).ok
