"""The recovery core's reads (``recovery.api`` selectors): what a host's pages are shown."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from recovery import api
from recovery.models import IntegrityIncident
from recovery.testing import live_fence, new_subject, record

pytestmark = pytest.mark.django_db

PDF = b"%PDF-1.4\n1 0 obj <<>> endobj\ntrailer <<>>\n%%EOF\n"


def _unknown(subject, fence) -> str:
    op = record(subject, fence)
    api.operation_observe(key=op.key, state="outcome_unknown", fence=fence)
    return op.key


def _request(key: str, user, *names: str):
    return api.decision_request(
        operation_key=key,
        kind="effect_confirmed",
        rationale="The land registry shows the entry made on 3 May.",
        requested_by=user,
        evidence=[SimpleUploadedFile(n, PDF, content_type="application/pdf") for n in names],
    )


def test_operations_of_a_subject_are_its_own_in_the_order_they_were_recorded(subject, fence):
    first = record(subject, fence, step_id="a")
    second = record(subject, fence, step_id="b")
    other = new_subject()
    record(other, live_fence(other))

    assert [op.key for op in api.operations_of(subject)] == [first.key, second.key]
    assert api.operation_get(key=second.key).step_id == "b"
    assert api.operation_get(key="op-missing") is None
    assert api.operation_get(key="") is None


def test_decisions_of_a_subject_carry_their_operation_and_evidence(subject, fence, requester):
    key = _unknown(subject, fence)
    decision = _request(key, requester, "b.pdf", "a.pdf")
    other = new_subject()
    _request(_unknown(other, live_fence(other)), requester, "c.pdf")

    (found,) = api.decisions_of(subject)
    assert found.pk == decision.pk
    assert found.operation.key == key
    assert [f.name for f in api.decision_evidence(found)] == ["b.pdf", "a.pdf"]
    assert api.decisions_open_of(subject) == {key: found}


def test_a_decision_is_found_only_on_its_own_subject(subject, fence, requester):
    decision = _request(_unknown(subject, fence), requester, "a.pdf")

    assert api.decision_get(decision_id=decision.pk).pk == decision.pk
    assert api.decision_get(decision_id=decision.pk, subject=subject).pk == decision.pk
    assert api.decision_get(decision_id=decision.pk, subject=new_subject()) is None
    assert api.decision_get(decision_id=decision.pk + 1000) is None


def test_an_approved_decision_is_no_longer_open(subject, fence, requester, approver):
    decision = _request(_unknown(subject, fence), requester, "a.pdf")
    api.decision_approve(decision_id=decision.pk, approved_by=approver)

    assert api.decisions_open_of(subject) == {}
    assert [d.state for d in api.decisions_of(subject)] == ["approved"]


def test_incidents_of_a_subject_newest_first_and_open_only_on_request(subject, fence):
    first = api.incident_report(subject=subject, reason="a backup was restored")
    # At most one is open per subject: the first is closed (as a resolution would) first.
    IntegrityIncident.objects.filter(pk=first.pk).update(status="resolved")
    second = api.incident_report(subject=subject, reason="a row was edited")

    assert [i.pk for i in api.incidents_of(subject)] == [second.pk, first.pk]
    assert [i.pk for i in api.incidents_of(subject, open_only=True)] == [second.pk]
    assert list(api.incidents_of(new_subject())) == []


def test_checkpoints_of_a_subject_are_shown_in_chain_order(subject, fence):
    key = _unknown(subject, fence)

    shown = [(c.seq, c.kind) for c in api.checkpoints_of(subject)]
    assert shown == [(1, "operation.recorded"), (2, "operation.observed")]
    assert key in api.checkpoints_of(subject).first().fact


def test_a_live_lease_is_seen_until_it_is_released(subject):
    fence = live_fence(subject, holder="worker-7", ttl=60)

    assert api.lease_is_live(fence)
    current = api.lease_current(fence.key)
    assert current.fence == fence
    assert 0 < current.left.total_seconds() <= 60
    assert api.leases_live().filter(key=fence.key).exists()

    api.lease_release(fence=fence)
    assert not api.lease_is_live(fence)
    assert api.lease_current(fence.key) is None
    assert not api.leases_held().filter(key=fence.key).exists()


def test_an_expired_lease_is_held_but_not_live(subject):
    fence = live_fence(subject, holder="worker-8", ttl=60)
    api.lease_expire(fence=fence)

    assert not api.lease_is_live(fence)
    assert api.lease_current(fence.key) is None
    assert api.leases_held().filter(key=fence.key).exists()
    assert not api.leases_live().filter(key=fence.key).exists()
