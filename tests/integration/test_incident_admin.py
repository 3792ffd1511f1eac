"""The incident's admin page: resolution by four eyes, through the test client.

Every action view checks the view and resolve permissions, takes POST only with a CSRF
token, calls one service and shows its words. An instance's page says it is blocked by
the incident and links to it; the incident's page links back to the instance.
"""

from __future__ import annotations

import json
import uuid

import pytest
from django.test import Client
from django.urls import reverse
from django.utils.html import escape

from govflow.engine.models import Instance
from recovery import api
from recovery.models import Checkpoint, IncidentResolution, IntegrityIncident, Operation
from tests.engine_helpers import marked_runnable, unmark_all, user_with
from tests.engine_helpers import subject as subject_of_instance
from tests.flows import action, drive, linear, start
from tests.identity import verified_login

pytestmark = pytest.mark.django_db

RATIONALE = "The operation row was restored from the 02:00 backup."
RESOLVERS = (
    "engine.view_instance",
    "recovery.view_integrityincident",
    "recovery.resolve_incident",
)
ACTIONS = ["request", "approve", "reject", "withdraw"]


def logged_in(user, **kwargs) -> Client:
    """A client logged in with a second factor verified (resolving incidents needs one)."""
    return verified_login(Client(**kwargs), user)


def page(incident) -> str:
    return reverse("admin:recovery_integrityincident_change", args=[incident.pk])


def action_url(name: str, incident) -> str:
    return reverse(f"admin:recovery_integrityincident_resolution_{name}", args=[incident.pk])


def instance_page(instance) -> str:
    return reverse("admin:engine_instance_change", args=[instance.pk])


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def tampered_instance() -> tuple[Instance, IntegrityIncident, Operation]:
    """A completed one-step instance whose operation row was edited: an open incident."""
    instance = drive(start(linear(action("a"))))
    subject = subject_of_instance(instance)
    operation = Operation.objects.get(subject_type=subject.type, subject_id=subject.id)
    Operation.objects.filter(pk=operation.pk).update(ordinal=operation.ordinal + 5)
    _, incident = api.subject_verify(subject=subject)
    return instance, incident, operation


def repaired(operation: Operation) -> None:
    Operation.objects.filter(pk=operation.pk).update(ordinal=operation.ordinal)


@pytest.fixture
def rita(django_user_model):
    return user_with(django_user_model, "rita", *RESOLVERS)


@pytest.fixture
def rob(django_user_model):
    return user_with(django_user_model, "rob", *RESOLVERS)


@pytest.fixture
def broken():
    return tampered_instance()


@pytest.mark.parametrize("name", ACTIONS)
def test_actions_send_anonymous_visitors_to_the_login_and_refuse_staff_without_permission(
    client, django_user_model, broken, name
):
    _, incident, _ = broken
    target = action_url(name, incident)
    data = {"rationale": RATIONALE, "note": "no"}
    response = client.post(target, data)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))
    for i, perms in enumerate(
        ((), ("recovery.view_integrityincident",), ("recovery.resolve_incident",))
    ):
        staff = user_with(django_user_model, f"sam{i}", *perms)
        assert logged_in(staff).post(target, data).status_code == 403, perms
    assert not IncidentResolution.objects.exists()
    assert IntegrityIncident.objects.get(pk=incident.pk).status == "open"


def test_the_page_needs_the_view_permission_and_offers_no_action_without_resolve(
    client, django_user_model, broken
):
    _, incident, _ = broken
    assert client.get(page(incident)).status_code == 302
    staff = user_with(django_user_model, "sam")
    assert logged_in(staff).get(page(incident)).status_code == 403
    viewer = user_with(django_user_model, "vera", "recovery.view_integrityincident")
    response = logged_in(viewer).get(page(incident))
    assert response.status_code == 200
    html = response.content.decode()
    assert "Request resolution" not in html and action_url("request", incident) not in html
    assert escape(incident.reason) in html


@pytest.mark.parametrize("name", ACTIONS)
def test_actions_refuse_get_and_posts_without_a_csrf_token(rita, broken, name):
    _, incident, _ = broken
    # A GET (a reload after a validation error) changes nothing and goes back to the page.
    response = logged_in(rita).get(action_url(name, incident))
    assert (response.status_code, response["Location"]) == (302, page(incident))
    guarded = logged_in(rita, enforce_csrf_checks=True)
    assert guarded.post(action_url(name, incident), {"rationale": RATIONALE}).status_code == 403
    assert not IncidentResolution.objects.exists()


def test_posting_to_the_incidents_change_page_is_forbidden(rita, broken):
    _, incident, _ = broken
    response = logged_in(rita).post(page(incident), {"status": "resolved"})
    assert response.status_code == 403
    assert IntegrityIncident.objects.get(pk=incident.pk).status == "open"


def test_an_instance_blocked_by_an_incident_links_to_it_and_back(django_user_model, rita, broken):
    instance, incident, _ = broken
    response = logged_in(rita).get(instance_page(instance))
    html = response.content.decode()
    assert (
        f'Blocked by <a href="{page(incident)}">integrity incident #{incident.pk}</a>: '
        f"{escape(incident.reason)}"
    ) in html
    # Without the incident's view permission the words are there, the link is not.
    clerk = user_with(django_user_model, "clerk", "engine.view_instance")
    html = logged_in(clerk).get(instance_page(instance)).content.decode()
    assert f"Blocked by integrity incident #{incident.pk}: " in html
    assert page(incident) not in html

    html = logged_in(rita).get(page(incident)).content.decode()
    assert (
        f"Workflow instance <code>govflow.instance:{instance.pk}</code> — "
        f'<a href="{instance_page(instance)}">open workflow instance {instance.pk}</a>'
    ) in html


def test_a_resolution_is_requested_and_approved_by_a_second_person_in_the_admin(rita, rob, broken):
    instance, incident, operation = broken
    ops_rita, ops_rob = logged_in(rita), logged_in(rob)

    # Still broken: the request is refused on its form, keeping what was typed.
    response = ops_rita.post(action_url("request", incident), {"rationale": RATIONALE})
    assert response.status_code == 200
    assert "cannot be resolved yet: the chain of" in response.content.decode()
    assert RATIONALE in response.content.decode()
    assert not IncidentResolution.objects.exists()
    response = ops_rita.post(action_url("request", incident), {"rationale": " "})
    assert "This field is required." in response.content.decode()

    repaired(operation)
    html = ops_rita.get(page(incident)).content.decode()
    assert "The chain of <code>" in html and "verifies now" in html
    response = ops_rita.post(action_url("request", incident), {"rationale": RATIONALE}, follow=True)
    resolution = IncidentResolution.objects.get()
    assert messages_of(response) == [
        f"Resolution request {resolution.pk} of incident {incident.pk} is recorded. Another "
        "person with the permission to resolve incidents must check it and approve it; "
        "approval verifies the chain again."
    ]
    html = response.content.decode()
    assert "Withdraw request" in html and "Approve resolution" not in html

    response = ops_rita.post(action_url("approve", incident), follow=True)
    assert messages_of(response) == [
        "The person who requested a resolution cannot approve it: a second person must check "
        "what was repaired."
    ]
    assert IntegrityIncident.objects.get(pk=incident.pk).status == "open"

    html = ops_rob.get(page(incident)).content.decode()
    assert "Approve resolution" in html and "Reject resolution" in html
    assert "Withdraw request" not in html and RATIONALE in html
    unmark_all()
    response = ops_rob.post(action_url("approve", incident), follow=True)
    length = api.subject_revision(subject_of_instance(instance))
    assert messages_of(response) == [
        f"Incident {incident.pk} is resolved: the chain of govflow.instance:{instance.pk} "
        f"verifies again ({length} checkpoints)."
    ], "a completed instance is not queued"
    incident.refresh_from_db()
    assert (incident.status, incident.resolved_by) == ("resolved", rob)
    html = response.content.decode()
    assert "approved by rob" in html and "Approve resolution" not in html
    assert "incident.resolution_requested" in html and "incident.resolved" in html
    html = ops_rob.get(instance_page(instance)).content.decode()
    assert "Blocked by" not in html


def test_approval_on_a_broken_chain_is_shown_as_an_error_and_resolves_nothing(rita, rob, broken):
    instance, incident, operation = broken
    repaired(operation)
    logged_in(rita).post(action_url("request", incident), {"rationale": RATIONALE})
    Operation.objects.filter(pk=operation.pk).update(ordinal=operation.ordinal + 1)
    response = logged_in(rob).post(action_url("approve", incident), follow=True)
    (message,) = messages_of(response)
    assert message.startswith(
        f"Incident {incident.pk} stays open: the chain of govflow.instance:{instance.pk} is "
        f"still broken at checkpoint #{operation.chain_seq}: "
    )
    assert [m.level_tag for m in response.context["messages"]] == ["error"]
    assert IntegrityIncident.objects.get(pk=incident.pk).status == "open"
    assert IncidentResolution.objects.get().state == "requested"


def test_a_request_is_rejected_with_a_note_or_withdrawn_by_its_requester(rita, rob, broken):
    _, incident, operation = broken
    repaired(operation)
    ops_rita, ops_rob = logged_in(rita), logged_in(rob)
    ops_rita.post(action_url("request", incident), {"rationale": RATIONALE})

    response = ops_rob.post(action_url("reject", incident), {"note": ""})
    assert response.status_code == 200 and "This field is required." in response.content.decode()
    response = ops_rob.post(
        action_url("reject", incident), {"note": "Name the backup."}, follow=True
    )
    first = IncidentResolution.objects.get()
    assert messages_of(response) == [
        f"Resolution request {first.pk} is rejected; incident {incident.pk} stays open."
    ]
    assert "Name the backup." in response.content.decode()

    ops_rita.post(action_url("request", incident), {"rationale": RATIONALE + " Backup B-7."})
    response = ops_rob.post(action_url("withdraw", incident), follow=True)
    assert messages_of(response)[0].startswith("Only its requester (rita) can withdraw")
    response = ops_rita.post(action_url("withdraw", incident), follow=True)
    second = IncidentResolution.objects.get(state="withdrawn")
    assert messages_of(response)[-1] == (
        f"You withdrew resolution request {second.pk}; incident {incident.pk} stays open."
    )
    assert IntegrityIncident.objects.get(pk=incident.pk).status == "open"
    assert "Request resolution" in response.content.decode()


def test_approving_an_instances_incident_in_the_admin_queues_the_instance(rita, rob):
    instance = start(linear(action("a")))  # not run yet: its first step is ready
    incident = api.incident_report(
        subject=subject_of_instance(instance), reason="A token row was edited."
    )
    logged_in(rita).post(
        action_url("request", incident), {"rationale": RATIONALE, "watermark": "0"}
    )
    unmark_all()
    response = logged_in(rob).post(action_url("approve", incident), follow=True)
    (message,) = messages_of(response)
    assert message.startswith(f"Incident {incident.pk} is resolved: the chain of govflow.instance:")
    assert message.endswith(f"Instance {instance.pk} is queued to continue.")
    assert marked_runnable() == [instance.pk]


@pytest.mark.django_db(transaction=True)
def test_a_resolution_request_carries_evidence_the_approver_opens(rita, rob, broken):
    from recovery.models import EvidenceFile
    from tests.integration.test_decisions import PDF, pdf
    from tests.integration.test_evidence_files import stored_files

    _instance, incident, operation = broken
    # Content no other test uploads: the store keeps one file per fingerprint.
    content = PDF + f"% restore log of incident {incident.pk} {uuid.uuid4()}\n".encode()
    before = stored_files()
    # Refused while the chain is still broken: nothing recorded, no file kept.
    response = logged_in(rita).post(
        action_url("request", incident),
        {"rationale": RATIONALE, "evidence": [pdf("restore-log.pdf", content)]},
    )
    assert "cannot be resolved yet" in response.content.decode()
    assert not EvidenceFile.objects.exists() and stored_files() == before

    repaired(operation)
    logged_in(rita).post(
        action_url("request", incident),
        {"rationale": RATIONALE, "evidence": [pdf("restore-log.pdf", content)]},
        follow=True,
    )
    resolution = IncidentResolution.objects.get()
    evidence = EvidenceFile.objects.get()
    assert resolution.evidence == [evidence.pk]
    assert evidence.attached_to == f"recovery.incident:{incident.pk}"
    assert stored_files() - before == {evidence.file.name}, "stored after the commit"
    trail = api.incident_trail(incident.pk)
    (fact,) = Checkpoint.objects.filter(
        subject_type=trail.type, subject_id=trail.id, kind="incident.resolution_requested"
    ).values_list("fact", flat=True)
    assert json.loads(fact)["evidence"] == [evidence.fingerprint]

    html = logged_in(rob).get(page(incident)).content.decode()
    link = reverse("admin:recovery_decision_evidence", args=[evidence.pk])
    assert f'href="{link}"' in html and "restore-log.pdf" in html
    download = logged_in(rob).get(link)
    assert download.status_code == 200, download.content[:300]
    assert download["Content-Disposition"].startswith("attachment")
    assert download["X-Content-Type-Options"] == "nosniff"
    assert b"".join(download.streaming_content) == content
