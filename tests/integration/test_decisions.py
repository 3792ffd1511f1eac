"""Decisions: an operator resolves an uncertain operation with evidence; another approves."""

from __future__ import annotations

import struct
import threading
import zlib
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.core.files.storage import storages
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import IntegrityError, connections, transaction
from django.db.models import F
from django.test import TestCase, override_settings

from recovery import api
from recovery.evidence import storage_path
from recovery.models import Checkpoint, Decision, EvidenceFile, IntegrityIncident, Operation
from recovery.services import decisions as decision_service
from recovery.testing import record

pytestmark = pytest.mark.django_db

PDF = b"%PDF-1.4\n1 0 obj <<>> endobj\ntrailer <<>>\n%%EOF\n"


def _chunk(tag: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))


# filetype recognises a PNG by its signature; a valid 1x1 image keeps the sample honest.
PNG = (
    b"\x89PNG\r\n\x1a\n"
    + _chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0))
    + _chunk(b"IDAT", zlib.compress(b"\x00\x00"))
    + _chunk(b"IEND", b"")
)


def pdf(name: str = "registry-extract.pdf", data: bytes = PDF) -> SimpleUploadedFile:
    return SimpleUploadedFile(name, data, content_type="application/pdf")


@pytest.fixture
def unknown(subject, fence) -> str:
    """The key of an operation whose outcome is unknown (#1 recorded, #2 observed)."""
    op = record(subject, fence)
    api.operation_observe(key=op.key, state="outcome_unknown", fence=fence)
    return op.key


def request(key: str, user, kind: str = "effect_confirmed", **kwargs) -> Decision:
    """Request a decision as a committed request would: evidence files reach the store
    after the commit, and a test's own transaction never commits, so its commit hooks
    run here."""
    kwargs.setdefault("rationale", "The land registry shows the entry made on 3 May.")
    kwargs.setdefault("evidence", [pdf()])
    with TestCase.captureOnCommitCallbacks(execute=True):
        return api.decision_request(operation_key=key, kind=kind, requested_by=user, **kwargs)


def unique(constraint: str) -> str:
    """PostgreSQL names a violated partial unique index; SQLite names its column."""
    return rf"{constraint}|UNIQUE constraint failed: recovery_decision\.operation_id"


def kinds(subject) -> list[str]:
    return list(
        Checkpoint.objects.filter(subject_id=subject.id)
        .order_by("seq")
        .values_list("kind", flat=True)
    )


def assert_nothing_recorded(subject, key: str) -> None:
    assert not Decision.objects.exists() and not EvidenceFile.objects.exists()
    assert Operation.objects.get(key=key).state == "outcome_unknown"
    assert kinds(subject) == ["operation.recorded", "operation.observed"]


# Requesting


@pytest.mark.parametrize("kind", ["effect_confirmed", "effect_absent", "cancel"])
def test_every_decision_needs_a_rationale(subject, unknown, requester, kind):
    with pytest.raises(api.DecisionError, match="needs a rationale: say what was checked"):
        request(unknown, requester, kind, rationale="   ")
    assert_nothing_recorded(subject, unknown)


@pytest.mark.parametrize("kind", ["effect_confirmed", "effect_absent"])
def test_confirming_or_denying_an_effect_needs_evidence(subject, unknown, requester, kind):
    with pytest.raises(api.DecisionError, match="needs at least one evidence file") as exc:
        request(unknown, requester, kind, evidence=[])
    assert "A timeout, a restart or an empty local result is not evidence" in str(exc.value)
    assert_nothing_recorded(subject, unknown)


def test_a_cancel_needs_only_a_rationale(subject, unknown, requester):
    decision = request(unknown, requester, "cancel", evidence=[])
    assert (decision.state, decision.kind) == ("requested", "cancel")
    assert kinds(subject)[-1] == "decision.requested"


def test_an_unknown_decision_kind_is_refused(subject, unknown, requester):
    with pytest.raises(api.DecisionError, match="Unknown decision 'maybe'; use one of"):
        request(unknown, requester, "maybe")
    assert_nothing_recorded(subject, unknown)


def test_the_providers_verification_checks_must_be_answered(subject, unknown, requester):
    required = ["registry_checked", "reference_matches"]
    with pytest.raises(api.DecisionError, match="checks first: reference_matches"):
        request(
            unknown,
            requester,
            checks={"registry_checked": "yes", "reference_matches": " "},
            required_checks=required,
        )
    assert_nothing_recorded(subject, unknown)
    decision = request(
        unknown,
        requester,
        required_checks=required,
        checks={"registry_checked": " yes ", "reference_matches": "REF-9"},
    )
    assert decision.checks == {"registry_checked": "yes", "reference_matches": "REF-9"}


# Evidence

REJECTED = [
    (
        "extract.pdf",
        b"Dear clerk, the entry was made.",
        "'extract.pdf' is named .pdf but its "
        "content is not a recognised file type. Upload the real file.",
    ),
    ("photo.png", PDF, "'photo.png' is named .png but its content is application/pdf"),
    ("scan.jpg", PNG, "is named .jpg but its content is image/png"),
    ("notes.txt", b"", "'notes.txt' is empty; evidence must show something."),
    (
        "tool.exe",
        b"MZ\x90\x00",
        "'tool.exe': files of type .exe are not accepted as evidence. "
        "Accepted: .csv, .eml, .jpeg, .jpg, .json, .log, .pdf, .png, .txt.",
    ),
    ("README", b"hello", "files of type (no extension) are not accepted"),
    ("notes.txt", "café".encode("latin-1"), "is named .txt but is not UTF-8 text."),
    ("dump.log", b"a\x00b", "is named .log but contains binary data."),
]


@pytest.mark.parametrize(
    ("name", "data", "message"), REJECTED, ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(REJECTED)]
)
def test_unacceptable_evidence_is_rejected_with_what_to_do(
    subject, unknown, requester, name, data, message
):
    with pytest.raises(api.EvidenceRejected) as exc:
        request(unknown, requester, evidence=[pdf(), pdf(name, data)])
    assert message in str(exc.value)
    assert_nothing_recorded(subject, unknown)


@override_settings(RECOVERY_EVIDENCE_MAX_BYTES=len(PDF))
def test_evidence_over_the_size_limit_is_rejected(subject, unknown, requester):
    limit = len(PDF)
    with pytest.raises(api.EvidenceRejected, match=f"at most {limit} bytes. Upload a smaller"):
        request(unknown, requester, evidence=[pdf(data=PDF + b"\n")])
    unsized = pdf(data=PDF + b"\n")
    unsized.size = None  # a stream whose size is not declared is still read only to the limit
    with pytest.raises(api.EvidenceRejected, match=f"larger than {limit} bytes"):
        request(unknown, requester, evidence=[unsized])
    assert_nothing_recorded(subject, unknown)
    assert request(unknown, requester, evidence=[pdf()]).evidence.get().size == limit


@pytest.mark.parametrize(
    ("name", "stored_as"),
    [
        ("../../etc/passwd.txt", "passwd.txt"),
        ("Rapport d'été final.pdf", "Rapport_dété_final.pdf"),
        ("C:\\Users\\clerk\\Scan 1.PDF", "Scan_1.pdf"),
    ],
)
def test_evidence_is_stored_by_fingerprint_outside_the_web_root(
    subject, unknown, requester, name, stored_as
):
    data = PDF if stored_as.endswith(".pdf") else b"root:x:0:0\n"
    decision = request(
        unknown, requester, evidence=[pdf(name, data), SimpleUploadedFile("shot.png", PNG)]
    )
    stored = {e.name: e for e in decision.evidence.all()}
    assert set(stored) == {stored_as, "shot.png"}
    item = stored[stored_as]
    fp = api.fingerprint(api.FingerprintKind.EVIDENCE, data)
    assert (item.fingerprint, item.size) == (fp, len(data))
    assert item.content_type == ("application/pdf" if data == PDF else "text/plain")
    assert stored["shot.png"].content_type == "image/png"
    assert item.file.name == storage_path(fp)  # the operator's file name never reaches disk
    location = Path(settings.STORAGES["recovery_evidence"]["OPTIONS"]["location"]).resolve()
    on_disk = Path(storages["recovery_evidence"].path(item.file.name)).resolve()
    assert on_disk.is_relative_to(location) and on_disk.read_bytes() == data
    for web_root in (Path(settings.STATIC_ROOT), Path(settings.BASE_DIR)):
        assert not on_disk.is_relative_to(web_root.resolve())
    fact = Checkpoint.objects.get(subject_id=subject.id, kind="decision.requested").fact
    assert fp in fact and stored_as not in fact


# Approving


def test_the_requester_cannot_approve_their_own_decision(subject, unknown, approver):
    decision = request(unknown, approver)
    with pytest.raises(api.DecisionError, match="cannot approve it: a second person"):
        api.decision_approve(decision_id=decision.pk, approved_by=approver)
    with pytest.raises(api.DecisionError, match="cannot reject their own decision"):
        api.decision_reject(decision_id=decision.pk, rejected_by=approver, note="no")
    with pytest.raises(IntegrityError, match="recovery_decision_four_eyes"), transaction.atomic():
        Decision.objects.filter(pk=decision.pk).update(
            decided_by=F("requested_by"), state="approved"
        )
    assert Decision.objects.get(pk=decision.pk).state == "requested"
    assert Operation.objects.get(key=unknown).state == "outcome_unknown"


@pytest.mark.parametrize("kind", ["effect_confirmed", "effect_absent"])
def test_approval_moves_the_operation_once_and_appends_checkpoints(
    subject, unknown, requester, approver, second_approver, kind
):
    decision = request(unknown, requester, kind)
    approved = api.decision_approve(decision_id=decision.pk, approved_by=approver)
    assert (approved.state, approved.decided_by, approved.decided_at is not None) == (
        "approved",
        approver,
        True,
    )
    row = Operation.objects.get(key=unknown)
    assert (row.state, row.revision, row.chain_seq) == (kind, 3, 4)
    assert kinds(subject)[2:] == ["decision.requested", "decision.approved"]
    assert api.chain_verify(subject) == api.Verification(subject, True, 4)

    with pytest.raises(api.DecisionConflict, match="no longer awaiting approval"):
        api.decision_approve(decision_id=decision.pk, approved_by=second_approver)
    with pytest.raises(api.DecisionConflict):
        api.decision_reject(decision_id=decision.pk, rejected_by=second_approver, note="late")
    assert Operation.objects.get(key=unknown).revision == 3
    assert Decision.objects.get(pk=decision.pk).decided_by == approver
    assert kinds(subject).count("decision.approved") == 1


def test_an_approved_cancel_leaves_the_effect_unknown_for_a_later_decision(
    subject, unknown, requester, approver
):
    cancel = request(unknown, requester, "cancel", evidence=[])
    api.decision_approve(decision_id=cancel.pk, approved_by=approver)
    assert Operation.objects.get(key=unknown).state == "outcome_unknown"
    assert kinds(subject)[-1] == "decision.approved"
    # The work was abandoned, but whether the effect happened is still unknown: the
    # evidence that settles it later can still be recorded.
    later = request(unknown, requester, "effect_absent")
    api.decision_approve(decision_id=later.pk, approved_by=approver)
    assert Operation.objects.get(key=unknown).state == "effect_absent"
    assert api.chain_verify(subject).ok


def test_the_database_refuses_a_second_approved_effect_decision(unknown, requester, approver):
    first = request(unknown, requester)
    api.decision_approve(decision_id=first.pk, approved_by=approver)
    with (
        pytest.raises(IntegrityError, match=unique("recovery_one_approved_effect_decision")),
        transaction.atomic(),
    ):
        Decision.objects.create(
            operation=first.operation,
            kind="effect_absent",
            rationale="x",
            state="approved",
            requested_by=requester,
            decided_by=approver,
            requested_at=first.requested_at,
        )
    assert Decision.objects.count() == 1


def test_a_decision_the_operation_has_outgrown_is_refused_and_changes_nothing(
    subject, fence, unknown, requester, approver
):
    decision = request(unknown, requester, "effect_absent")
    api.operation_observe(key=unknown, state="effect_confirmed", fence=fence)  # reconciled
    with pytest.raises(api.DecisionConflict, match="is now effect_confirmed, so decision"):
        api.decision_approve(decision_id=decision.pk, approved_by=approver)
    assert Operation.objects.get(key=unknown).state == "effect_confirmed"
    assert Decision.objects.get(pk=decision.pk).state == "requested"
    assert api.chain_verify(subject).ok
    api.decision_reject(decision_id=decision.pk, rejected_by=approver, note="Reconciled.")


@pytest.mark.parametrize(
    ("state", "kind"),
    [
        ("succeeded", "effect_confirmed"),
        ("failed", "effect_absent"),
        ("dispatched", "effect_confirmed"),
        ("pending", "effect_absent"),
        ("succeeded", "cancel"),
    ],
)
def test_only_an_uncertain_operation_can_be_decided(subject, fence, requester, state, kind):
    op = record(subject, fence)
    if state != "dispatched":
        api.operation_observe(key=op.key, state=state, fence=fence)
    with pytest.raises(api.DecisionError, match=f"is {state}; '.*' can only resolve"):
        request(op.key, requester, kind)
    assert not Decision.objects.exists()
    with pytest.raises(api.DecisionError, match="No ledger operation has key 'op-nope'"):
        request("op-nope", requester, kind)


def test_a_pending_operation_can_be_cancelled(subject, fence, requester):
    op = record(subject, fence)
    api.operation_observe(key=op.key, state="pending", fence=fence)
    assert request(op.key, requester, "cancel", evidence=[]).state == "requested"


def test_only_one_live_decision_per_operation(subject, unknown, requester, approver):
    first = request(unknown, requester)
    with pytest.raises(api.DecisionConflict, match="already has a decision awaiting approval"):
        request(unknown, approver, "effect_absent")
    with (
        pytest.raises(IntegrityError, match=unique("recovery_one_open_request_per_operation")),
        transaction.atomic(),
    ):
        Decision.objects.create(
            operation=first.operation,
            kind="cancel",
            rationale="x",
            requested_by=approver,
            requested_at=first.requested_at,
        )
    assert list(Decision.objects.values_list("pk", flat=True)) == [first.pk]
    assert kinds(subject).count("decision.requested") == 1


def test_users_without_the_permission_are_refused(
    subject, unknown, django_user_model, requester, approver, second_approver
):
    clerk = django_user_model.objects.create_user("clerk", is_staff=True)
    for user in (clerk, second_approver, AnonymousUser()):
        with pytest.raises(api.DecisionError, match=r"'recovery\.request_decision' is required"):
            request(unknown, user)
    decision = request(unknown, approver)
    with pytest.raises(api.DecisionError, match=r"'recovery\.approve_decision' is required"):
        api.decision_approve(decision_id=decision.pk, approved_by=requester)
    with pytest.raises(api.DecisionError, match="may not reject a decision"):
        api.decision_reject(decision_id=decision.pk, rejected_by=requester, note="no")
    second_approver.is_active = False
    with pytest.raises(api.DecisionError, match="may not approve a decision"):
        api.decision_approve(decision_id=decision.pk, approved_by=second_approver)
    assert Decision.objects.get().state == "requested"
    assert Operation.objects.get(key=unknown).state == "outcome_unknown"


def test_rejection_keeps_the_operation_and_allows_a_new_request(
    subject, unknown, requester, approver
):
    decision = request(unknown, requester)
    with pytest.raises(api.DecisionError, match="Say why the decision is rejected"):
        api.decision_reject(decision_id=decision.pk, rejected_by=approver, note=" ")
    rejected = api.decision_reject(
        decision_id=decision.pk, rejected_by=approver, note="The extract is for another parcel."
    )
    assert (rejected.state, rejected.decided_by) == ("rejected", approver)
    assert rejected.decision_note == "The extract is for another parcel."
    assert Operation.objects.get(key=unknown).state == "outcome_unknown"
    with pytest.raises(api.DecisionConflict):
        api.decision_approve(decision_id=decision.pk, approved_by=approver)
    again = request(unknown, requester, "effect_absent")
    api.decision_approve(decision_id=again.pk, approved_by=approver)
    assert Operation.objects.get(key=unknown).state == "effect_absent"
    assert kinds(subject)[2:] == [
        "decision.requested",
        "decision.rejected",
        "decision.requested",
        "decision.approved",
    ]
    assert api.chain_verify(subject).ok


@pytest.mark.django_db(transaction=True)
def test_confirming_an_effect_on_a_tampered_chain_is_refused(subject, unknown, requester, approver):
    decision = request(unknown, requester)
    Operation.objects.filter(key=unknown).update(fence=99)
    with pytest.raises(api.ChainBroken, match="broken at #2"):
        api.decision_approve(decision_id=decision.pk, approved_by=approver)
    assert Decision.objects.get(pk=decision.pk).state == "requested"
    assert Operation.objects.get(key=unknown).state == "outcome_unknown"
    incident = IntegrityIncident.objects.get(subject_id=subject.id, status="open")
    assert incident.position == 2 and "fence is 99 in its row" in incident.reason


# Race (PostgreSQL: SQLite serialises writers, so nothing would overlap)


@pytest.mark.django_db(transaction=True)
def test_two_approvers_racing_move_the_operation_exactly_once(
    on_postgres, subject, unknown, requester, approver, second_approver, monkeypatch
):
    decision = request(unknown, requester)
    barrier = threading.Barrier(2)
    original = decision_service.transition

    def slow_transition(*args, **kwargs):
        # Hold the winner's claim open so the loser's claim is truly concurrent.
        threading.Event().wait(0.3)
        return original(*args, **kwargs)

    monkeypatch.setattr(decision_service, "transition", slow_transition)
    outcomes: dict[str, object] = {}

    def approve(user) -> None:
        try:
            barrier.wait(timeout=10)
            api.decision_approve(decision_id=decision.pk, approved_by=user)
            outcomes[user.username] = "approved"
        except Exception as exc:
            outcomes[user.username] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=approve, args=(u,)) for u in (approver, second_approver)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(map(type, outcomes.values()), key=str) == sorted(
        [str, api.DecisionConflict], key=str
    ), outcomes
    winner = next(name for name, outcome in outcomes.items() if outcome == "approved")
    assert Decision.objects.get(pk=decision.pk).decided_by.username == winner
    row = Operation.objects.get(key=unknown)
    assert (row.state, row.revision) == ("effect_confirmed", 3)
    assert kinds(subject).count("decision.approved") == 1
    assert api.chain_verify(subject).ok
