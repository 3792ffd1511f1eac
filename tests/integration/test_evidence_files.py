"""Evidence files after the upload (issue 9, item 5): stored only after the commit,
re-hashed on every read, and served only through a permission-checked download.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from django.conf import settings
from django.core.files.storage import storages
from django.db import transaction
from django.test import Client
from django.urls import reverse

from recovery import api
from recovery.evidence import TEMP_PREFIX
from recovery.models import Decision, EvidenceFile, IntegrityIncident
from recovery.testing import record
from tests.integration.test_decisions import PDF, pdf
from tests.integration.test_decisions import request as request_decision
from tests.integration.test_engine_admin import make_user
from tests.integration.test_evidence_limits import assert_no_temporary_files, files_in_store

pytestmark = pytest.mark.django_db


@pytest.fixture
def unknown(subject, fence) -> str:
    """The key of an operation whose outcome is unknown."""
    op = record(subject, fence)
    api.operation_observe(key=op.key, state="outcome_unknown", fence=fence)
    return op.key


FRESH = PDF + b"% a page uploaded only here\n"


def stored_files() -> set[str]:
    """The files in the evidence store, without the ones still being received."""
    return {name for name in files_in_store() if not Path(name).name.startswith(TEMP_PREFIX)}


class RolledBack(Exception):
    pass


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_request_leaves_no_file(unknown, requester):
    before = stored_files()
    with pytest.raises(RolledBack), transaction.atomic():
        api.decision_request(
            operation_key=unknown,
            kind="effect_confirmed",
            rationale="The registry shows it.",
            requested_by=requester,
            evidence=[pdf("fresh.pdf", FRESH)],
        )
        assert stored_files() == before  # not before the commit
        raise RolledBack  # e.g. the caller's next write failed
    assert not Decision.objects.exists() and not EvidenceFile.objects.exists()
    assert stored_files() == before
    assert_no_temporary_files()


@pytest.mark.django_db(transaction=True)
def test_a_committed_request_stores_its_file_after_the_commit(unknown, requester):
    decision = api.decision_request(
        operation_key=unknown,
        kind="effect_confirmed",
        rationale="The registry shows it.",
        requested_by=requester,
        evidence=[pdf("fresh.pdf", FRESH)],
    )
    stored = decision.evidence.get()
    assert storages["recovery_evidence"].open(stored.file.name).read() == FRESH
    assert_no_temporary_files()


def stored_path(evidence: EvidenceFile) -> Path:
    return Path(storages["recovery_evidence"].path(evidence.file.name))


@pytest.fixture
def stored(unknown, requester, request) -> EvidenceFile:
    """A stored PDF whose content is this test's own (the store is shared and
    content-addressed: a test that damages its file must not damage another's)."""
    decision = request_decision(
        unknown, requester, evidence=[pdf("extract.pdf", content_of(request.node.name))]
    )
    return decision.evidence.get()


def content_of(test_name: str) -> bytes:
    return FRESH + f"% {test_name}\n".encode()


@pytest.mark.django_db(transaction=True)
def test_a_tampered_file_is_refused_on_read_and_opens_an_incident(stored, subject, requester):
    read = api.evidence_open(evidence_id=stored.pk, user=requester)
    assert read.file.read() == stored_path(stored).read_bytes()  # untouched: served
    read.file.close()
    stored_path(stored).write_bytes(FRESH.replace(b"here", b"HERE"))
    with pytest.raises(api.EvidenceCorrupt) as caught:
        api.evidence_open(evidence_id=stored.pk, user=requester)
    incident = IntegrityIncident.objects.get(subject_id=subject.id, status="open")
    assert caught.value.incident_id == incident.pk
    assert str(caught.value).startswith(
        f"The evidence file {stored.pk} (extract.pdf) of decision {stored.decision_id} no "
        "longer matches its fingerprint"
    )
    assert f"Integrity incident #{incident.pk} is open" in str(caught.value)
    assert "it was changed after it was stored" in incident.reason


def test_a_missing_file_is_refused_on_read(stored, subject, requester):
    stored_path(stored).unlink()
    with pytest.raises(api.EvidenceCorrupt, match="is missing from the evidence store"):
        api.evidence_open(evidence_id=stored.pk, user=requester)
    assert IntegrityIncident.objects.filter(subject_id=subject.id, status="open").exists()


def evidence_url(evidence: EvidenceFile) -> str:
    return reverse("admin:recovery_decision_evidence", args=[evidence.pk])


def test_anonymous_readers_are_sent_to_the_login(stored):
    response = Client().get(evidence_url(stored))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))


def test_a_user_without_a_decision_permission_gets_403(stored, django_user_model):
    client = Client()
    client.force_login(make_user(django_user_model, "vera", "engine.view_instance"))
    assert client.get(evidence_url(stored)).status_code == 403


def test_a_permitted_user_downloads_the_file_as_an_attachment_with_nosniff(
    stored, django_user_model
):
    client = Client()
    client.force_login(make_user(django_user_model, "carl", "recovery.approve_decision"))
    response = client.get(evidence_url(stored))
    assert response.status_code == 200
    assert response["Content-Disposition"] == 'attachment; filename="extract.pdf"'
    assert response["Content-Type"] == "application/pdf"
    assert response["X-Content-Type-Options"] == "nosniff"
    assert b"".join(response.streaming_content) == stored_path(stored).read_bytes()
    assert stored_path(stored).read_bytes().startswith(FRESH)


def test_a_tampered_file_is_not_served_by_the_view(stored, subject, django_user_model):
    client = Client()
    client.force_login(
        make_user(
            django_user_model,
            "carl",
            "recovery.approve_decision",
            "recovery.view_integrityincident",
        )
    )
    stored_path(stored).write_bytes(b"%PDF-1.4 something else entirely\n")
    response = client.get(evidence_url(stored))
    incident = IntegrityIncident.objects.get(subject_id=subject.id, status="open")
    # Back to the page the link was on, or else to the incident it opened.
    assert response.status_code == 302
    assert response["Location"] == reverse(
        "admin:recovery_integrityincident_change", args=[incident.pk]
    )
    response = client.get(response["Location"])
    assert b"something else" not in response.content
    messages = [str(m) for m in response.context["messages"]]
    assert any("no longer matches its fingerprint" in m and "not served" in m for m in messages)
    assert IntegrityIncident.objects.filter(subject_id=subject.id, status="open").exists()


def test_evidence_has_no_public_url(stored):
    # The store has no URL of its own, and nothing under the web root serves it.
    storage = storages["recovery_evidence"]
    assert settings.STORAGES["recovery_evidence"]["OPTIONS"]["base_url"] is None
    assert not getattr(settings, "MEDIA_ROOT", "") or not Path(
        storage.location
    ).resolve().is_relative_to(Path(settings.MEDIA_ROOT).resolve())
    public = "/" + storage.url(stored.file.name).lstrip("/")
    assert Client().get(public).status_code == 404
    assert Client().get("/media/" + stored.file.name).status_code == 404


def test_the_decision_page_links_each_file_to_the_checked_view(stored, django_user_model):
    client = Client()
    client.force_login(make_user(django_user_model, "vic", "recovery.view_decision"))
    shown = client.get(
        reverse("admin:recovery_decision_change", args=[stored.decision_id])
    ).content.decode()
    assert f'<a href="{evidence_url(stored)}">extract.pdf</a>' in shown
