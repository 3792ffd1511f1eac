"""The demo provider module: its workflows publish, run to the end, and its effects are
idempotent and reconcilable by the provider idempotency key."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.db.models.functions import Now

from govflow.demo import actions, store
from govflow.demo.dataflow.provider import PUBLICATION
from govflow.demo.models import DecisionNote
from govflow.demo.sample import sample_variables
from govflow.engine.definitions import DefinitionInvalid, parse_definition
from govflow.engine.models import Definition, Instance, Timer, Token, TokenState, WaitKind
from govflow.engine.provider import ActionContext, Pending, Succeeded, Unknown, registry
from govflow.engine.services.definitions import (
    definition_publish,
    definitions_load_app_workflows,
)
from govflow.engine.services.instances import instance_start
from govflow.engine.services.runtime import instance_run
from govflow.engine.services.sweep import SWEEPER
from govflow.engine.services.timers import timers_fire
from govflow.engine.services.triggers import trigger_deliver
from govflow.handoffs.services.desk import approval_decide
from recovery import api

pytestmark = pytest.mark.django_db

WORKFLOWS = Path(__file__).resolve().parents[2] / "govflow" / "demo" / "workflows"


@pytest.fixture(autouse=True)
def demo_store(tmp_path, settings):
    settings.GOVFLOW_DEMO_STORE = str(tmp_path / "demo-registry.sqlite3")
    return tmp_path / "demo-registry.sqlite3"


@pytest.fixture
def permits_officer(django_user_model):
    user = django_user_model.objects.create_user(username="officer", password="pw")
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="govflow_demo", codename="approve_permit")
    )
    return django_user_model.objects.get(pk=user.pk)


@pytest.fixture
def published():
    return {d.key: d for d in definitions_load_app_workflows() if d.key.startswith("demo.")}


def drive(instance: Instance) -> Instance:
    """Run until the instance stops moving, answering the fee's polls at once."""
    for _ in range(30):
        report = instance_run(instance_id=instance.pk, worker="test-worker")
        polls = Token.objects.filter(
            instance=instance, state=TokenState.READY, wait_kind=WaitKind.POLL
        ).update(not_before=Now())
        if report.steps == 0 and not report.more and not polls:
            break
    instance.refresh_from_db()
    return instance


def fire_timers(instance: Instance) -> int:
    Timer.objects.filter(instance=instance, state="scheduled").update(due_at=Now())
    fence = api.lease_acquire(key=SWEEPER, holder="test-sweeper", ttl=30)
    try:
        return timers_fire(fence=fence)
    finally:
        api.lease_release_if_held(fence=fence)


def waiting(instance: Instance, kind: str) -> Token:
    return Token.objects.get(instance=instance, state=TokenState.WAITING, wait_kind=kind)


def run_to_approval(definition: Definition) -> Instance:
    instance = instance_start(definition=definition, variables=sample_variables())
    instance = drive(instance)
    assert instance.status == "waiting", instance.reason
    waiting(instance, WaitKind.TIMER)  # fee paid, neighbours notified: objection period
    assert instance.variables["payment"]["reference"].startswith("PAY-")
    assert fire_timers(instance) == 1
    instance = drive(instance)
    application_id = instance.variables["application"]["id"]
    assert waiting(instance, WaitKind.TRIGGER).wait_key == f"inspection.completed:{application_id}"
    trigger_deliver(
        message="inspection.completed",
        correlation=application_id,
        delivery_id=f"inspection:{application_id}",
        payload={"result": "passed", "inspector": "J. de Vries", "remarks": "ok"},
    )
    instance = drive(instance)
    assert instance.variables["inspection"]["result"] == "passed"
    waiting(instance, WaitKind.APPROVAL)
    return instance


def context(action: str, key: str, data: dict, **extra) -> ActionContext:
    return ActionContext(
        action=action,
        input=data,
        idempotency_key=key,
        tenant="t",
        access={},
        instance_id=1,
        step_id="step",
        attempt=0,
        poll=0,
        **extra,
    )


REGISTRATION = {
    "applicant_name": "Maria Jansen",
    "applicant_email": "m@example.org",
    "parcel_id": "ASD-K-4821",
    "address": "Keizersgracht 112",
    "project": "Dormer",
    "floor_area_m2": 6,
}


def test_demo_workflows_publish_and_validate_against_the_registry(published):
    assert {"demo.building_permit", "demo.parcel_correction"} <= set(published)
    for path in WORKFLOWS.glob("*.json"):
        spec = parse_definition(json.loads(path.read_text()), registry=registry)
        # The demo's own actions, and the Dataflow demo module's run provider (linked runs).
        assert spec.actions() <= {a.name for a in actions.ALL} | {PUBLICATION.name}
    # v2: the demo actions declare output schemas, a change of their pinned contracts;
    # v3: the permit declares case fields; v4: cancelling after the fee was collected
    # refunds it (compensate_on).
    assert published["demo.building_permit"].version == 4
    # Publishing again is a no-op: same bytes, same row.
    again = definitions_load_app_workflows()
    assert {d.pk for d in again} >= {d.pk for d in published.values()}


def test_every_recovery_mode_is_demonstrated():
    modes = {a.name: a.recovery_mode for a in actions.ALL}
    assert set(modes.values()) == {"atomic", "non_atomic", "snapshot_restore", "irreversible"}
    for action in actions.ALL:
        assert registry.get(action.name) is action


def test_the_permit_cannot_be_published_without_its_approval_reference():
    document = json.loads((WORKFLOWS / "building_permit.json").read_text())
    document["version"] = 99
    node = next(n for n in document["nodes"] if n["id"] == "issue_permit")
    del node["approval_ref"]
    with pytest.raises(DefinitionInvalid, match="approval_ref"):
        definition_publish(document=document)


def test_building_permit_runs_to_an_issued_permit(published, permits_officer):
    instance = run_to_approval(published["demo.building_permit"])
    approval = waiting(instance, WaitKind.APPROVAL)
    approval_decide(
        instance_id=instance.pk,
        token_id=approval.pk,
        actor=permits_officer,
        approved=True,
        note="Complies with the zoning plan.",
    )
    instance = drive(instance)

    assert instance.status == "completed", instance.reason
    variables = instance.variables
    assert variables["decision"] == {
        "approved": True,
        "by": "officer",
        "note": "Complies with the zoning plan.",
    }
    assert variables["permit"]["number"].startswith("PERMIT-")
    records = store.records_for(variables["application"]["id"])
    assert [p["permit_number"] for p in records["permits"]] == [variables["permit"]["number"]]
    assert records["permits"][0]["approval_ref"].startswith("mandate:building-permits")
    assert records["payments"][0]["status"] == "paid"
    assert list(
        DecisionNote.objects.filter(instance_id=instance.pk).values_list("kind", flat=True)
    ) == ["neighbour_notice"]
    assert "rejection_note" not in set(instance.tokens.values_list("node_id", flat=True))
    assert api.chain_verify(api.Subject("govflow.instance", str(instance.pk))).ok


def test_a_redispatch_under_the_engines_key_finds_the_first_registration(published):
    instance = drive(
        instance_start(definition=published["demo.building_permit"], variables=sample_variables())
    )
    token = instance.tokens.get(node_id="register")
    registration = {
        "applicant_name": instance.variables["applicant"]["name"],
        "applicant_email": instance.variables["applicant"]["email"],
        "parcel_id": instance.variables["parcel"]["id"],
        "address": instance.variables["parcel"]["address"],
        "project": instance.variables["project"]["description"],
        "floor_area_m2": instance.variables["project"]["floor_area_m2"],
    }
    ctx = context("demo.register_application", token.idempotency_key, registration)

    again = actions.register_application.execute(ctx)  # e.g. a retry after "effect absent"
    found = actions.register_application.reconcile(ctx)

    assert again.output["application_id"] == instance.variables["application"]["id"]
    assert found == again
    assert store.count("applications") == 1


def test_a_refused_permit_is_noted_and_never_issued(published, permits_officer):
    instance = run_to_approval(published["demo.building_permit"])
    approval_decide(
        instance_id=instance.pk,
        token_id=waiting(instance, WaitKind.APPROVAL).pk,
        actor=permits_officer,
        approved=False,
        note="Exceeds the floor area.",
    )
    instance = drive(instance)

    assert instance.status == "completed", instance.reason
    assert "permit" not in instance.variables
    assert store.count("permits") == 0
    refusal = DecisionNote.objects.get(instance_id=instance.pk, kind="rejection")
    assert refusal.text == "Exceeds the floor area."


def test_approval_needs_the_demo_permission(published, django_user_model):
    from govflow.engine.errors import NotPermitted

    instance = run_to_approval(published["demo.building_permit"])
    clerk = django_user_model.objects.create_user(username="clerk", password="pw")
    with pytest.raises(NotPermitted, match=r"govflow_demo\.approve_permit"):
        approval_decide(
            instance_id=instance.pk,
            token_id=waiting(instance, WaitKind.APPROVAL).pk,
            actor=clerk,
            approved=True,
        )
    assert waiting(instance, WaitKind.APPROVAL)


def test_parcel_correction_restores_from_the_pinned_snapshot(published):
    instance = instance_start(
        definition=published["demo.parcel_correction"],
        variables={
            "parcel": {"id": "UTR-C-1907"},
            "reason": "Boundary edited by mistake on import.",
        },
    )
    instance = drive(instance)
    assert instance.status == "completed", instance.reason
    assert instance.variables["restoration"]["from"] == "snapshot:municipal-registry/nightly"
    assert store.count("parcel_restorations") == 1
    assert DecisionNote.objects.get(instance_id=instance.pk).kind == "correction"


def test_a_duplicate_dispatch_of_register_application_writes_the_registry_once():
    ctx = context("demo.register_application", "idem-1", REGISTRATION)
    first = actions.register_application.execute(ctx)
    second = actions.register_application.execute(ctx)

    assert isinstance(first, Succeeded)
    assert first == second
    assert first.output["application_id"].startswith("BP-")
    assert store.count("applications") == 1


def test_reconcile_finds_the_registration_by_idempotency_key():
    missing = actions.register_application.reconcile(
        context("demo.register_application", "idem-2", REGISTRATION, phase="reconcile")
    )
    assert isinstance(missing, Unknown)

    done = actions.register_application.execute(
        context("demo.register_application", "idem-2", REGISTRATION)
    )
    found = actions.register_application.reconcile(
        context("demo.register_application", "idem-2", REGISTRATION, phase="reconcile")
    )
    assert found == done
    check = actions.register_application.checks[0]
    assert done.output["application_id"] in check.automatic(
        context("demo.register_application", "idem-2", REGISTRATION)
    )


def test_the_fee_is_pending_until_paid_then_polls_and_reconciles_as_paid():
    data = {
        "application_id": "BP-1",
        "payer": "Maria Jansen",
        "amount_cents": 42800,
        "currency": "EUR",
    }
    ctx = context("demo.collect_fee", "fee-1", data)
    assert isinstance(actions.collect_fee.reconcile(ctx), Unknown)
    assert isinstance(actions.collect_fee.execute(ctx), Pending)
    assert isinstance(actions.collect_fee.execute(ctx), Pending)  # duplicate: same request
    assert isinstance(actions.collect_fee.reconcile(ctx), Pending)
    assert isinstance(actions.collect_fee.poll(ctx), Pending)
    paid = actions.collect_fee.poll(ctx)
    assert isinstance(paid, Succeeded)
    assert actions.collect_fee.reconcile(ctx) == paid
    assert store.count("payments") == 1


def test_gated_actions_refuse_without_their_reference():
    permit = actions.issue_permit.execute(
        context(
            "demo.issue_permit",
            "p-1",
            {"application_id": "BP-1", "holder": "M", "parcel_id": "P", "approved_by": "officer"},
        )
    )
    restore = actions.restore_parcel_snapshot.execute(
        context("demo.restore_parcel_snapshot", "r-1", {"parcel_id": "P", "reason": "why"})
    )
    assert permit.permanent and restore.permanent
    assert store.count("permits") == store.count("parcel_restorations") == 0


def test_the_demo_commands_drive_an_instance_to_the_end(published, django_user_model):
    call_command("demo_setup", password="pw-demo-123", stdout=io.StringIO())
    approver = django_user_model.objects.get(username="approver")
    assert approver.has_perm("govflow_demo.approve_permit")
    assert approver.has_perm("engine.start_instance")
    assert approver.has_perm("engine.view_instance")
    # A second approver: one may request a decision and the other approve it.
    for name in ("approver", "approver2"):
        other = django_user_model.objects.get(username=name)
        assert other.has_perms(
            ("recovery.request_decision", "recovery.approve_decision", "recovery.resolve_incident")
        )

    out = io.StringIO()
    call_command("demo_start", stdout=out)
    instance = Instance.objects.latest("pk")
    assert f"Started instance {instance.pk}" in out.getvalue()
    assert f"/admin/engine/instance/{instance.pk}/change/" in out.getvalue()

    instance = drive(instance)
    out = io.StringIO()
    call_command("demo_inspect", str(instance.pk), stdout=out)  # buffered: objection period
    assert "kept" in out.getvalue()
    fire_timers(instance)
    drive(instance)
    call_command("demo_approve", str(instance.pk), stdout=io.StringIO())
    instance = drive(instance)
    assert instance.status == "completed", instance.reason
    out = io.StringIO()
    call_command("demo_status", str(instance.pk), stdout=out)
    assert instance.variables["permit"]["number"] in out.getvalue()

    call_command("demo_start", "--parcel-correction", stdout=io.StringIO())
    correction = drive(Instance.objects.latest("pk"))
    assert correction.definition.key == "demo.parcel_correction"
    assert correction.status == "completed", correction.reason
