"""A standalone dispatch write and success refuse what they refused before, the same way.

On PostgreSQL ``operation_record`` inserts its operation and checkpoint in one statement
and ``operation_observe``'s success reads its operation, subject and chain in one
(ADR 0035); elsewhere, and inside ``multi_statement``, they are separate statements. Each
test runs on both paths and expects the same error and nothing written.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from recovery import api, chain
from recovery.models import Checkpoint, Operation
from recovery.subjects import LEDGER_WATERMARK
from recovery.testing import fingerprints, record

pytestmark = pytest.mark.django_db


def standing(subject):
    """What a refused write must leave as it was."""
    ops = Operation.objects.filter(subject_type=subject.type, subject_id=subject.id)
    return sorted(ops.values_list("key", "state", "revision")), api.subject_revision(subject)


def statements(captured) -> list[str]:
    return [
        q["sql"]
        for q in captured.captured_queries
        if q["sql"] not in ("BEGIN", "COMMIT") and not q["sql"].startswith(("SAVEPOINT", "RELEASE"))
    ]


def one_call(path) -> bool:
    return path == "one_call" and connection.vendor == "postgresql"


def test_a_dispatch_write_lands_with_its_checkpoint(subject, fence, path):
    with CaptureQueriesContext(connection) as captured:
        op = record(subject, fence)
    assert (op.state, op.revision, op.chain_seq) == ("dispatched", 1, 1)
    row = Operation.objects.get(key=op.key)
    assert row.chain_seq == 1 and row.fence == fence.fence
    assert Checkpoint.objects.get(subject_type=subject.type, seq=1, subject_id=subject.id).kind
    assert api.chain_verify(subject).ok
    assert len(statements(captured)) == (2 if one_call(path) else 3)


def test_a_dispatch_write_on_a_stale_fence_records_nothing(subject, fence, path):
    api.lease_release(fence=fence)
    with pytest.raises(api.StaleFence, match="no longer the live lease"):
        record(subject, fence)
    assert standing(subject) == ([], 0)


@pytest.mark.parametrize("whose", ["subject", "ledger"])
def test_a_dispatch_write_under_an_open_incident_records_nothing(subject, fence, path, whose):
    blocked = subject if whose == "subject" else LEDGER_WATERMARK
    api.incident_report(subject=blocked, reason="a row was edited")
    with pytest.raises(api.IntegrityIncidentOpen) as refused:
        record(subject, fence)
    assert refused.value.ledger_wide == (whose == "ledger")
    assert standing(subject) == ([], 0)


def test_a_dispatch_of_an_unsettled_effect_records_nothing(subject, fence, path):
    effect = fingerprints({"n": 1})
    first = record(subject, fence)
    effect["idempotency_fp"] = Operation.objects.get(key=first.key).idempotency_fp
    before = standing(subject)
    with pytest.raises(api.LedgerDisagrees) as refused:
        api.operation_record(
            subject=subject, step_id="s", action="test.notify", recovery_mode="non_atomic",
            nonce=f"{subject.id}:2", ordinal=1, fence=fence, **effect,
        )  # fmt: skip
    assert (refused.value.operation, refused.value.state) == (first.key, "dispatched")
    assert standing(subject) == before


def test_a_key_recorded_before_is_refused(subject, fence, path):
    arguments = dict(
        subject=subject, step_id="s", action="test.notify", recovery_mode="non_atomic",
        nonce=f"{subject.id}:1", ordinal=0, fence=fence, **fingerprints({"n": 2}),
    )  # fmt: skip
    op = api.operation_record(**arguments)
    api.operation_observe(key=op.key, state="failed", fence=fence)
    before = standing(subject)
    with pytest.raises(api.OperationExists, match="already recorded"):
        api.operation_record(**arguments)
    assert standing(subject) == before


def test_a_chain_that_moved_after_its_head_was_read_is_a_conflict(
    subject, fence, path, monkeypatch
):
    real, moved = chain.read_head, []

    def read_then_moved(cursor, subject_):
        head = real(cursor, subject_)
        if not moved:
            moved.append(True)
            api.fact_append(subject=subject_, kind="tests.meanwhile", fact={"n": 1})
        return head

    monkeypatch.setattr(chain, "read_head", read_then_moved)
    with pytest.raises(api.ChainConflict, match="written by someone else first"):
        record(subject, fence)
    monkeypatch.undo()
    assert standing(subject) == ([], 0), "the operation rolled back with its checkpoint"


def test_a_success_reads_once_and_moves_the_operation(subject, fence, path):
    op = record(subject, fence)
    with CaptureQueriesContext(connection) as captured:
        done = api.operation_observe(key=op.key, state="succeeded", fence=fence, result={"a": 1})
    assert (done.state, done.revision, done.chain_seq) == ("succeeded", 2, 2)
    assert api.chain_verify(subject).ok
    # A run with no mark reads from its subject's seal, in the same one read (ADR 0070).
    reads = [sql for sql in statements(captured) if sql.startswith(("SELECT", "WITH sealed"))]
    assert len(reads) == (1 if one_call(path) else 2), reads


def test_a_success_on_a_stale_fence_changes_nothing(subject, fence, path):
    op = record(subject, fence)
    before = standing(subject)
    api.lease_release(fence=fence)
    with pytest.raises(api.StaleFence):
        api.operation_observe(key=op.key, state="succeeded", fence=fence, result={"a": 1})
    assert standing(subject) == before


def test_a_success_under_an_open_incident_changes_nothing(subject, fence, path):
    op = record(subject, fence)
    api.incident_report(subject=subject, reason="a row was edited")
    before = standing(subject)
    with pytest.raises(api.IntegrityIncidentOpen):
        api.operation_observe(key=op.key, state="succeeded", fence=fence, result={"a": 1})
    assert standing(subject) == before


def test_a_success_on_a_broken_chain_changes_nothing(subject, fence, path):
    op = record(subject, fence)
    cps = Checkpoint.objects.filter(subject_type=subject.type, subject_id=subject.id)
    cps.filter(seq=1).update(fact_fp="0" * 64)  # edited by someone without the chain key
    before = standing(subject)
    with pytest.raises(api.ChainBroken):
        api.operation_observe(key=op.key, state="succeeded", fence=fence, result={"a": 1})
    assert standing(subject) == before


def test_a_success_for_an_unknown_key_is_not_found(path, fence):
    with pytest.raises(api.OperationNotFound, match="No ledger operation has key"):
        api.operation_observe(key="op-missing", state="succeeded", fence=fence)


def test_a_repeated_success_is_unchanged_and_a_different_one_refused(subject, fence, path):
    op = record(subject, fence)
    api.operation_observe(key=op.key, state="succeeded", fence=fence, result={"a": 1})
    again = api.operation_observe(key=op.key, state="succeeded", fence=fence, result={"a": 1})
    assert again.changed is False and again.revision == 2
    with pytest.raises(api.ContradictoryObservation):
        api.operation_observe(key=op.key, state="succeeded", fence=fence, result={"a": 2})
