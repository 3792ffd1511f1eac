"""Evidence an approver can open (issue 10, part 4): PNG, JPEG and PDF shown in the browser
only when their bytes say so and they were recorded as that type, sandboxed and never
sniffed; everything else downloaded; the BLAKE3 shown and checked again on every read."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse

from recovery import api
from recovery.models import EvidenceFile
from recovery.testing import record
from tests.integration.test_decisions import PNG, pdf
from tests.integration.test_decisions import request as request_decision
from tests.integration.test_engine_admin import (
    OPERATOR_PERMS,
    blocked,
    decision_form,
    logged_in,
    make_user,
    url,
)
from tests.integration.test_evidence_files import content_of

pytestmark = pytest.mark.django_db


@pytest.fixture
def unknown(subject, fence) -> str:
    """The key of an operation whose outcome is unknown."""
    op = record(subject, fence)
    api.operation_observe(key=op.key, state="outcome_unknown", fence=fence)
    return op.key


@pytest.fixture
def operator(django_user_model):
    return make_user(django_user_model, "olga", *OPERATOR_PERMS)


@pytest.fixture
def ops(operator) -> Client:
    return logged_in(operator)


def open_url(evidence: EvidenceFile, inline: bool = True) -> str:
    base = reverse("admin:recovery_decision_evidence", args=[evidence.pk])
    return base + "?inline=1" if inline else base


@pytest.fixture
def reader(django_user_model) -> Client:
    client = Client()
    client.force_login(make_user(django_user_model, "carl", "recovery.approve_decision"))
    return client


def evidence_of(unknown, requester, upload) -> EvidenceFile:
    return request_decision(unknown, requester, evidence=[upload]).evidence.get()


def test_a_png_is_shown_inline_sandboxed_with_nosniff_and_its_blake3(unknown, requester, reader):
    png = evidence_of(unknown, requester, SimpleUploadedFile("scan.png", PNG + b"desk-inline"))
    response = reader.get(open_url(png))
    assert response.status_code == 200
    assert response["Content-Disposition"].startswith("inline")
    assert response["Content-Type"] == "image/png"
    assert response["Content-Security-Policy"] == "sandbox"
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["X-Evidence-BLAKE3"] == png.fingerprint
    assert b"".join(response.streaming_content).startswith(PNG)


def test_a_pdf_is_shown_inline_and_downloaded_without_the_flag(unknown, requester, reader, request):
    doc = evidence_of(unknown, requester, pdf("extract.pdf", content_of(request.node.name)))
    assert reader.get(open_url(doc))["Content-Disposition"].startswith("inline")
    assert reader.get(open_url(doc, inline=False))["Content-Disposition"].startswith("attachment")


def test_text_is_never_shown_inline(unknown, requester, reader):
    text = evidence_of(unknown, requester, SimpleUploadedFile("note.txt", b"<script>x</script>"))
    response = reader.get(open_url(text))
    assert response["Content-Disposition"] == 'attachment; filename="note.txt"'
    assert response["Content-Type"] == "text/plain"


def test_a_file_recorded_as_an_image_whose_bytes_are_not_one_is_a_download(
    unknown, requester, reader
):
    text = evidence_of(unknown, requester, SimpleUploadedFile("page.txt", b"<html>not png"))
    EvidenceFile.objects.filter(pk=text.pk).update(content_type="image/png")
    response = reader.get(open_url(text))
    assert response["Content-Disposition"].startswith("attachment")


def test_anonymous_readers_go_to_the_login_and_others_get_403(
    unknown, requester, django_user_model
):
    png = evidence_of(unknown, requester, SimpleUploadedFile("scan.png", PNG + b"desk-perm"))
    anonymous = Client().get(open_url(png))
    assert anonymous.status_code == 302
    assert anonymous["Location"].startswith(reverse("admin:login"))
    viewer = Client()
    viewer.force_login(make_user(django_user_model, "vera", "engine.view_instance"))
    assert viewer.get(open_url(png)).status_code == 403


def test_the_instance_page_offers_to_open_images_and_shows_the_limits(ops, settings):
    settings.RECOVERY_EVIDENCE_MAX_BYTES = 2048
    instance = blocked()
    token = instance.tokens.get(node_id="write")
    page = ops.get(url("instance_change", instance.pk)).content.decode()
    assert "At most 2.0\xa0KB per file and 50.0\xa0MB for all files together" in page
    assert 'type="file" name="evidence" multiple' in page
    files = [
        SimpleUploadedFile("scan.png", PNG + b"desk-page"),
        SimpleUploadedFile("extract.txt", b"key found\n"),
    ]
    ops.post(url("instance_handoff", instance.pk, token.pk), decision_form(token, evidence=files))
    page = ops.get(url("instance_change", instance.pk)).content.decode()
    png = EvidenceFile.objects.get(name="scan.png")
    txt = EvidenceFile.objects.get(name="extract.txt")
    assert f'href="{open_url(png)}"' in page
    assert f'href="{open_url(txt)}"' not in page
    assert f'title="{png.fingerprint}"' in page
