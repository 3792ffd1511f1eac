"""The ledger's admin pages: visible to those allowed to view, editable by nobody."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from recovery import api
from recovery.models import Checkpoint, Decision, IntegrityIncident, Lease, Operation
from recovery.testing import record

pytestmark = pytest.mark.django_db

MODELS = ["operation", "checkpoint", "lease", "integrityincident", "decision"]


@dataclass(frozen=True)
class Ledger:
    operation: Operation
    checkpoint: Checkpoint
    lease: Lease
    incident: IntegrityIncident
    decision: Decision

    def obj(self, model: str):
        return getattr(self, "incident" if model == "integrityincident" else model)


@pytest.fixture
def ledger(subject, fence, requester) -> Ledger:
    op = record(subject, fence, step_id="register-deed", action="land.register")
    api.operation_observe(key=op.key, state="outcome_unknown", fence=fence)
    decision = api.decision_request(
        operation_key=op.key,
        kind="effect_confirmed",
        requested_by=requester,
        rationale="Registry extract shows deed 2024/118 entered.",
        evidence=[SimpleUploadedFile("registry extract.txt", b"deed 2024/118 entered\n")],
    )
    incident = api.incident_open(
        verification=api.Verification(
            subject, False, 3, 2, "checkpoint #2's fact does not match its fingerprint"
        )
    )
    return Ledger(
        operation=Operation.objects.get(key=op.key),
        checkpoint=Checkpoint.objects.get(subject_id=subject.id, seq=2),
        lease=Lease.objects.get(key=fence.key),
        incident=incident,
        decision=decision,
    )


def url(name: str, model: str, *args) -> str:
    return reverse(f"admin:recovery_{model}_{name}", args=[quote(a) for a in args])


def shows(ledger: Ledger, model: str) -> list[str]:
    """Text each changelist shows for the ledger's row."""
    return {
        "operation": [ledger.operation.key, "land.register", "register-deed", "Outcome unknown"],
        "checkpoint": [ledger.operation.subject_id, "operation.observed", "test2"],
        "lease": [ledger.lease.key, "worker-1"],
        "integrityincident": [ledger.incident.subject_id, "Open"],
        "decision": ["Effect confirmed", "Awaiting approval", "requester"],
    }[model]


def details(ledger: Ledger, model: str) -> list[str]:
    """Text each change page shows beyond the changelist."""
    return {
        "operation": [ledger.operation.input_fp, ledger.operation.idempotency_fp],
        "checkpoint": [
            ledger.checkpoint.link,
            ledger.checkpoint.fact_fp,
            "&quot;state&quot;:&quot;outcome_unknown&quot;",
        ],
        "lease": [str(ledger.lease.fence)],
        "integrityincident": ["checkpoint #2&#x27;s fact does not match its fingerprint"],
        "decision": [
            "Registry extract shows deed 2024/118 entered.",
            "registry_extract.txt",
            ledger.decision.evidence.get().fingerprint,
        ],
    }[model]


@pytest.mark.parametrize("model", MODELS)
def test_superuser_sees_the_changelist(admin_client, ledger, model):
    response = admin_client.get(url("changelist", model))
    assert response.status_code == 200
    html = response.content.decode()
    for text in shows(ledger, model):
        assert text in html, text
    assert url("add", model) not in html  # no "Add" button


@pytest.mark.parametrize("model", MODELS)
def test_superuser_sees_the_change_page_without_any_way_to_save(admin_client, ledger, model):
    response = admin_client.get(url("change", model, ledger.obj(model).pk))
    assert response.status_code == 200
    html = response.content.decode()
    for text in [*shows(ledger, model), *details(ledger, model)]:
        assert text in html, text
    for button in (
        'name="_save"',
        'name="_continue"',
        'name="_addanother"',
        url("delete", model, ledger.obj(model).pk),
    ):
        assert button not in html, button


@pytest.mark.parametrize("model", MODELS)
def test_adding_is_forbidden(admin_client, ledger, model):
    before = type(ledger.obj(model)).objects.count()
    assert admin_client.get(url("add", model)).status_code == 403
    assert admin_client.post(url("add", model), {"reason": "x"}).status_code == 403
    assert type(ledger.obj(model)).objects.count() == before


FORGED = {
    "operation": {"state": "succeeded", "fence": "99"},
    "checkpoint": {"fact": "{}", "kind": "forged"},
    "lease": {"holder": "intruder", "fence": "99"},
    "integrityincident": {"status": "resolved", "reason": "nothing"},
    "decision": {"state": "approved", "rationale": "forged"},
}


@pytest.mark.parametrize("model", MODELS)
def test_posting_a_change_is_forbidden_and_modifies_nothing(admin_client, ledger, model):
    obj = ledger.obj(model)
    response = admin_client.post(url("change", model, obj.pk), FORGED[model])
    assert response.status_code == 403
    fresh = type(obj).objects.get(pk=obj.pk)
    for field in FORGED[model]:
        assert getattr(fresh, field) == getattr(obj, field), field


@pytest.mark.parametrize("model", MODELS)
def test_deleting_is_forbidden(admin_client, ledger, model):
    obj = ledger.obj(model)
    assert admin_client.get(url("delete", model, obj.pk)).status_code == 403
    assert admin_client.post(url("delete", model, obj.pk), {"post": "yes"}).status_code == 403
    response = admin_client.post(
        url("changelist", model),
        {"action": "delete_selected", "_selected_action": [obj.pk], "post": "yes"},
    )
    assert response.status_code in (200, 302)
    assert type(obj).objects.filter(pk=obj.pk).exists()


def test_the_chain_still_verifies_after_the_admin_was_used(admin_client, ledger):
    for model in MODELS:
        admin_client.post(url("change", model, ledger.obj(model).pk), FORGED[model])
        admin_client.post(url("delete", model, ledger.obj(model).pk), {"post": "yes"})
    subject = api.Subject(ledger.operation.subject_type, ledger.operation.subject_id)
    assert api.chain_verify(subject).ok


@pytest.mark.parametrize("model", MODELS)
def test_a_user_who_is_not_staff_is_sent_to_the_login_page(
    client, django_user_model, ledger, model
):
    user = django_user_model.objects.create_user("citizen", password="pw")
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="recovery"))
    client.force_login(user)
    for target in (url("changelist", model), url("change", model, ledger.obj(model).pk)):
        response = client.get(target)
        assert response.status_code == 302
        assert response["Location"].startswith(reverse("admin:login") + "?next=")


@pytest.mark.parametrize("model", MODELS)
def test_staff_without_the_view_permission_is_forbidden(client, django_user_model, ledger, model):
    client.force_login(django_user_model.objects.create_user("clerk", is_staff=True))
    assert client.get(url("changelist", model)).status_code == 403
    assert client.get(url("change", model, ledger.obj(model).pk)).status_code == 403
    index = client.get(reverse("admin:index"))
    assert index.status_code == 200
    assert url("changelist", model) not in index.content.decode()


def test_staff_sees_only_what_they_may_view(client, ledger, requester):
    client.force_login(requester)  # view_decision only
    assert client.get(url("changelist", "decision")).status_code == 200
    assert client.get(url("change", "decision", ledger.decision.pk)).status_code == 200
    assert client.get(url("changelist", "operation")).status_code == 403
