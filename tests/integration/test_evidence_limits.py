"""Evidence is streamed to disk in chunks, capped per request, and never left behind.

The issue: five 20 MiB files were all held in memory at once, with no cap on a request's
total. Files are now hashed and checked chunk by chunk into temporary files beside the
store, and moved to their content-addressed places only as the decision is recorded.
"""

from __future__ import annotations

import io
import tracemalloc
from pathlib import Path

import pytest
from django.conf import settings
from django.core.files.uploadedfile import SimpleUploadedFile, UploadedFile
from django.test import Client
from django.urls import reverse

from govflow.engine.models import Instance
from recovery import api
from recovery.evidence import CHUNK_BYTES, TEMP_PREFIX, storage_path
from recovery.models import Decision, EvidenceFile
from recovery.testing import record
from tests.identity import verified_login
from tests.integration.test_decisions import PDF, PNG, assert_nothing_recorded, request
from tests.integration.test_engine_admin import OPERATOR_PERMS, blocked, make_user

pytestmark = pytest.mark.django_db


def store_root() -> Path:
    return Path(settings.STORAGES["recovery_evidence"]["OPTIONS"]["location"])


def files_in_store() -> set[str]:
    root = store_root()
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def assert_no_temporary_files() -> None:
    leftovers = [name for name in files_in_store() if Path(name).name.startswith(TEMP_PREFIX)]
    assert not leftovers, leftovers


@pytest.fixture
def unknown(subject, fence) -> str:
    op = record(subject, fence)
    api.operation_observe(key=op.key, state="outcome_unknown", fence=fence)
    return op.key


class ReadWatcher(io.BytesIO):
    """A file that remembers the largest read asked of it."""

    largest = 0

    def read(self, size=-1):
        self.largest = max(self.largest, size if size >= 0 else len(self.getvalue()))
        return super().read(size)


def test_each_file_is_read_in_chunks_and_stored_intact(unknown, requester):
    data = b"line of the registry extract\n" * 20_000  # ~580 KiB
    watched = ReadWatcher(data)
    upload = UploadedFile(watched, name="extract.txt", size=len(data))
    decision = request(unknown, requester, evidence=[upload])
    assert 0 < watched.largest <= CHUNK_BYTES
    stored = decision.evidence.get()
    assert (stored.size, stored.fingerprint) == (
        len(data),
        api.fingerprint(api.FingerprintKind.EVIDENCE, data),
    )
    assert (store_root() / stored.file.name).read_bytes() == data
    assert_no_temporary_files()


def test_a_large_file_never_sits_in_memory_whole(unknown, requester, tmp_path, settings):
    # tracemalloc counts every thread's allocations, and threads other tests leave behind
    # (a worker's keepalive, a run pool) allocate now and then: a file large against them
    # (32 MiB; once, 3.9 MB was seen beside an 8 MiB one) keeps "a quarter of the file" a
    # measure of this path alone. A whole copy of the file would be four times the bound.
    size = 32 * 1024 * 1024
    settings.RECOVERY_EVIDENCE_MAX_BYTES = settings.RECOVERY_EVIDENCE_MAX_TOTAL_BYTES = 2 * size
    source = tmp_path / "scan.pdf"
    with source.open("wb") as out:
        out.write(PDF)
        out.write(b"%" + b"0" * (size - len(PDF) - 1))
    with source.open("rb") as handle:
        upload = UploadedFile(handle, name="scan.pdf", size=size)
        tracemalloc.start()
        try:
            decision = request(unknown, requester, evidence=[upload])
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert decision.evidence.get().size == size
    assert peak < size // 4, f"peak {peak} bytes while storing an {size}-byte file"


@pytest.mark.parametrize("declared", [True, False], ids=["sizes-declared", "sizes-unknown"])
def test_the_files_of_one_request_have_a_total_limit(
    unknown, subject, requester, settings, declared
):
    settings.RECOVERY_EVIDENCE_MAX_TOTAL_BYTES = 3 * len(PDF)
    uploads = [SimpleUploadedFile(f"page-{i}.pdf", PDF) for i in range(5)]
    if not declared:
        for upload in uploads:
            upload.size = None  # a stream that does not say how long it is: counted as read
    before = files_in_store()
    with pytest.raises(api.EvidenceRejected) as caught:
        request(unknown, requester, evidence=uploads)
    assert str(caught.value) == (
        f"The evidence files of one decision may be at most {3 * len(PDF)} bytes together. "
        "Upload smaller extracts (the pages that show the effect), not whole archives."
    )
    assert_nothing_recorded(subject, unknown)
    assert files_in_store() == before
    assert len(request(unknown, requester, evidence=uploads[:3]).evidence.all()) == 3


def test_a_refused_file_leaves_no_file_of_its_request_behind(unknown, subject, requester):
    fresh = PDF + b"% a page never uploaded before\n"
    before = files_in_store()
    with pytest.raises(api.EvidenceRejected, match=r"is named \.png but its content is"):
        request(
            unknown,
            requester,
            evidence=[SimpleUploadedFile("fresh.pdf", fresh), SimpleUploadedFile("x.png", PDF)],
        )
    assert_nothing_recorded(subject, unknown)
    assert files_in_store() == before  # not the valid first file either


def test_a_decision_the_ledger_refuses_stores_no_file(subject, fence, requester):
    op = record(subject, fence)  # dispatched: not a state a decision may resolve
    fresh = PDF + b"% another page never uploaded before\n"
    before = files_in_store()
    with pytest.raises(api.DecisionError, match="is dispatched"):
        request(op.key, requester, evidence=[SimpleUploadedFile("fresh.pdf", fresh)])
    assert not Decision.objects.exists()
    assert files_in_store() == before


def test_the_same_content_is_stored_once(unknown, requester, approver):
    shot = PNG + b"\x00same"
    first = request(unknown, requester, evidence=[SimpleUploadedFile("a.png", shot)])
    api.decision_reject(decision_id=first.pk, rejected_by=approver, note="blurred")
    second = request(unknown, requester, evidence=[SimpleUploadedFile("b.png", shot)])
    names = set(EvidenceFile.objects.values_list("file", flat=True))
    fp = api.fingerprint(api.FingerprintKind.EVIDENCE, shot)
    assert names == {storage_path(fp)}
    assert second.evidence.get().name == "b.png"
    assert_no_temporary_files()


def test_the_admin_shows_the_total_limit_on_the_form(django_user_model, settings):
    settings.RECOVERY_EVIDENCE_MAX_TOTAL_BYTES = 2 * 1024
    operator = make_user(django_user_model, "olga", *OPERATOR_PERMS)
    client = verified_login(Client(), operator)
    instance = blocked()
    token = instance.tokens.get(node_id="write")
    before = files_in_store()
    response = client.post(
        reverse("admin:engine_instance_handoff", args=[instance.pk, token.pk]),
        {
            "kind": "effect_confirmed",
            "check_store": "the key is in the store",
            "rationale": "The alpha store holds the record.",
            "evidence": [SimpleUploadedFile(f"part-{i}.txt", b"x" * 1024) for i in range(5)],
        },
    )
    assert response.status_code == 200
    assert "may be at most 2048 bytes together" in response.content.decode()
    assert not Decision.objects.exists()
    assert files_in_store() == before


def test_a_body_of_form_fields_over_a_mebibyte_is_refused_before_any_view(
    django_user_model,
):
    # DATA_UPLOAD_MAX_MEMORY_SIZE: 1 MiB of fields at most (variables may be 256 KiB);
    # files are not counted there, and above 1 MiB they are spooled to disk.
    operator = make_user(django_user_model, "olga", *OPERATOR_PERMS)
    client = Client()
    client.force_login(operator)
    response = client.post(
        reverse("admin:engine_instance_start"),
        {"tenant": "t", "variables": '{"a": "' + "x" * (1024 * 1024) + '"}'},
    )
    assert response.status_code == 400
    assert not Instance.objects.exists()
    assert settings.FILE_UPLOAD_MAX_MEMORY_SIZE == 1024 * 1024
