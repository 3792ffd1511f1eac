"""kill -9 after the demo registry registered an application, before the step settled:
after the restart the provider's reconcile finds it, so nobody has to guess (issue 9).

The first cluster's worker parks right after ``demo.register_application`` wrote to the
demo registry (a separate SQLite file, like any external system) and is SIGKILLed there,
with its sweep's re-enqueueing switched off. The restarted cluster rehydrates the step
to ``outcome_unknown`` and, before any operator, asks the provider's ``reconcile``: with
the demo's default policy the finding (the application number) is kept as the provider's
evidence and pre-fills the operator's decision, which a second person approves. The
application exists exactly once throughout. A second test makes the same crash for an
action whose provider's word settles (``alpha.write_settled``): the restarted cluster
completes the instance with no operator at all.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from govflow.engine.models import Instance, InstanceStatus, TokenState
from govflow.engine.services.definitions import definition_publish
from govflow.engine.services.instances import instance_start
from govflow.handoffs.admin.detail import finding_initial, finding_result
from govflow.handoffs.services.desk import handoff_approve, handoff_request
from recovery.api import OperationState, chain_verify, provider_findings
from recovery.models import Decision
from tests.flows import action, linear
from tests.providers.alpha import effects

from .support import (
    assert_completed_cleanly,
    dump,
    failed_tasks,
    operations_of,
    status,
    subject_of,
    token,
    wait_for,
    wait_status,
    wait_until_sweeping,
)
from .test_kill_restart import PARKED, retrying_conflicts, user

pytestmark = pytest.mark.django_db(transaction=True)

REGISTER = {
    "id": "register",
    "type": "action",
    "action": "demo.register_application",
    "input": {
        "applicant_name": "applicant.name",
        "applicant_email": "applicant.email",
        "parcel_id": "parcel.id",
        "address": "parcel.address",
        "project": "project.description",
        "floor_area_m2": "project.floor_area_m2",
    },
    "output": {"application.id": "application_id"},
}
VARIABLES = {
    "applicant": {"name": "Ada Meyer", "email": "ada@example.org"},
    "parcel": {"id": "P-17", "address": "Lindenweg 3"},
    "project": {"description": "A garden shed", "floor_area_m2": 12},
}


def applications(path: Path) -> list[tuple[str, str]]:
    """``(idempotency key, application number)`` of every application in the registry."""
    if not path.exists():
        return []
    with sqlite3.connect(path) as conn:
        try:
            return conn.execute(
                "SELECT idempotency_key, application_id FROM applications"
            ).fetchall()
        except sqlite3.OperationalError:  # not created yet
            return []


def found(instance_id: int):
    """The provider's conclusive finding on step register, once the ladder asked."""
    step = token(instance_id, "register")
    if step.state != TokenState.OUTCOME_UNKNOWN:
        return None
    findings = [f for f in provider_findings(step.operation_key) if f.kind == "reconcile"]
    return findings[0] if findings and findings[0].outcome == "succeeded" else None


def killed_after_the_registry(ws, registry_file: Path) -> tuple[int, tuple[str, str]]:
    """Start an instance of register → end, park its worker right after the registry's
    write and SIGKILL the cluster there. Returns the instance id and the application."""
    ws.pause("demo_registered")
    first = ws.start_cluster(**PARKED)
    definition = definition_publish(
        document={
            "key": "proc.reconcile",
            "version": 1,
            "title": "Register, killed after the registry wrote",
            "nodes": [{"id": "start", "type": "start"}, REGISTER, {"id": "end", "type": "end"}],
            "transitions": [{"from": "start", "to": "register"}, {"from": "register", "to": "end"}],
        }
    )
    instance = instance_start(definition=definition, variables=VARIABLES)
    ws.watch(instance.pk)
    wait_for(
        lambda: ws.reached("demo_registered") and len(applications(registry_file)) == 1,
        timeout=60,
        what="the worker parked after the registry registered the application",
        explain=ws.report,
    )
    first.kill()
    ws.unpause("demo_registered")
    (registered,) = applications(registry_file)
    step = token(instance.pk, "register")
    assert step.state == TokenState.EXECUTING, dump(instance.pk)
    assert operations_of(instance.pk).get().state == OperationState.DISPATCHED, dump(instance.pk)
    assert registered[0] == step.idempotency_key
    return instance.pk, registered


def decided_from_the_finding(instance_id: int, django_user_model) -> None:
    """An operator requests the decision pre-filled from the finding (kind, rationale and
    the step's result: the application number); a second person approves those values."""
    step = token(instance_id, "register")
    findings = provider_findings(step.operation_key)
    prefill = finding_initial(findings)
    requester = user(
        django_user_model, "requester", "recovery.request_decision", "engine.operate_instance"
    )
    approver = user(
        django_user_model, "approver", "recovery.approve_decision", "engine.operate_instance"
    )
    decision = handoff_request(
        instance_id=instance_id,
        token_id=step.pk,
        actor=requester,
        checks={"registry-search": "found", "no-duplicate": "one application"},
        evidence=[SimpleUploadedFile("registry.txt", b"found", content_type="text/plain")],
        result=finding_result(findings),
        **prefill,
    )
    retrying_conflicts(
        lambda: handoff_approve(
            decision_id=decision.pk, actor=approver, result_fp=decision.result_fp
        )
    )


def test_after_a_kill_past_the_registry_the_provider_s_reconcile_finds_the_application(
    workspace, settings, django_user_model
):
    ws = workspace
    registry_file = ws.tmp_path / "var" / "demo-registry.sqlite3"
    settings.GOVFLOW_DEMO_STORE = str(registry_file)  # the file the clusters write
    instance_id, registered = killed_after_the_registry(ws, registry_file)

    second = ws.start_cluster()
    wait_until_sweeping(second)
    finding = wait_for(
        lambda: found(instance_id),
        timeout=60,
        what="the restarted cluster to ask the provider's reconcile",
        explain=ws.report,
    )
    # The provider's word, kept as its evidence: the application number it registered.
    assert finding.values["application_id"] == registered[1], dump(instance_id)
    assert finding.asked_by is None and not finding.applied
    assert operations_of(instance_id).get().state == OperationState.OUTCOME_UNKNOWN
    assert status(instance_id) == InstanceStatus.BLOCKED
    assert not Decision.objects.exists(), "nobody guessed"
    assert applications(registry_file) == [registered], "registered exactly once"
    assert chain_verify(subject_of(instance_id)).ok
    prefill = finding_initial(provider_findings(token(instance_id, "register").operation_key))
    assert prefill["kind"] == "effect_confirmed" and registered[1] in prefill["rationale"]

    decided_from_the_finding(instance_id, django_user_model)
    wait_status(ws, instance_id, InstanceStatus.COMPLETED)
    assert_completed_cleanly(instance_id)
    variables = Instance.objects.get(pk=instance_id).variables
    assert variables["application"]["id"] == registered[1], "the found number flows on"
    assert applications(registry_file) == [registered], "the effect happened exactly once"
    assert failed_tasks() == []


def test_after_a_kill_past_the_effect_a_reconcile_that_settles_completes_the_step(workspace):
    """The same crash for an action whose provider's word settles: no operator at all."""
    ws = workspace
    ws.pause("after_effect")
    first = ws.start_cluster(**PARKED)
    document = linear(action("a", name="alpha.write_settled"), action("b"), key="proc.settles")
    instance = instance_start(
        definition=definition_publish(document=document), variables={"value": "v1"}
    )
    ws.watch(instance.pk)
    wait_for(
        lambda: ws.reached("after_effect") and len(effects.effects()) == 1,
        timeout=60,
        what="the worker parked after step a's effect",
        explain=ws.report,
    )
    first.kill()
    ws.unpause("after_effect")
    assert operations_of(instance.pk).get().state == OperationState.DISPATCHED, dump(instance.pk)

    second = ws.start_cluster()
    wait_until_sweeping(second)
    # Blocked for a moment (outcome unknown after the restart) until the provider answers:
    # wait for the end, not for the first status that is not running.
    wait_for(
        lambda: status(instance.pk) == InstanceStatus.COMPLETED,
        timeout=60,
        what="the provider's reconcile to settle step a and the instance to complete",
        explain=ws.report,
    )
    assert_completed_cleanly(instance.pk)
    states = list(operations_of(instance.pk).values_list("step_id", "state"))
    assert states == [("a", OperationState.EFFECT_CONFIRMED), ("b", OperationState.SUCCEEDED)]
    (finding,) = provider_findings(token(instance.pk, "a").operation_key)
    assert finding.applied and finding.outcome == "succeeded"
    assert not Decision.objects.exists(), "nobody had to decide"
    # Step a's effect happened once (the provider was never called again), b's once.
    assert sorted(calls for _, _, calls in effects.effects()) == [1, 1]
    assert effects.call_count() == 2
    assert failed_tasks() == []
