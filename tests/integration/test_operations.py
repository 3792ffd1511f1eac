"""Ledger operations: record before dispatch, observe after, monotonic facts."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from recovery import api
from recovery.models import Checkpoint, Operation
from recovery.testing import live_fence, new_subject, record

pytestmark = pytest.mark.django_db


def test_recording_commits_the_operation_and_its_checkpoint_before_dispatch(subject, fence):
    op = record(subject, fence)
    row = Operation.objects.get(key=op.key)
    assert row.state == "dispatched"
    assert row.fence == fence.fence
    assert row.revision == 1
    assert op.key.startswith("op-")
    cp = Checkpoint.objects.get(subject_type=subject.type, subject_id=subject.id)
    assert (cp.seq, cp.kind) == (1, "operation.recorded")
    assert api.chain_verify(subject).ok


def test_success_moves_the_operation_and_appends_a_verified_checkpoint(subject, fence):
    op = record(subject, fence)
    done = api.operation_observe(key=op.key, state="succeeded", fence=fence, result={"id": 7})
    assert done.state == "succeeded" and done.revision == 2 and done.changed
    assert Operation.objects.get(key=op.key).result_fp == api.fingerprint_value(
        api.FingerprintKind.RESULT, {"id": 7}
    )
    assert api.subject_revision(subject) == 2
    assert api.chain_verify(subject).ok


def test_repeating_the_same_terminal_observation_changes_nothing(subject, fence):
    op = record(subject, fence)
    api.operation_observe(key=op.key, state="succeeded", fence=fence, result={"id": 7})
    again = api.operation_observe(key=op.key, state="succeeded", fence=fence, result={"id": 7})
    assert not again.changed
    assert Checkpoint.objects.filter(subject_id=subject.id).count() == 2


@pytest.mark.parametrize(("state", "result"), [("failed", {"id": 7}), ("succeeded", {"id": 8})])
def test_contradictory_observation_is_rejected_and_changes_nothing(subject, fence, state, result):
    op = record(subject, fence)
    api.operation_observe(key=op.key, state="succeeded", fence=fence, result={"id": 7})
    with pytest.raises(api.ContradictoryObservation, match="facts never change"):
        api.operation_observe(key=op.key, state=state, fence=fence, result=result)
    row = Operation.objects.get(key=op.key)
    assert (row.state, row.revision) == ("succeeded", 2)
    assert Checkpoint.objects.filter(subject_id=subject.id).count() == 2


def test_outcome_unknown_cannot_be_turned_into_success_by_a_late_answer(subject, fence):
    op = record(subject, fence)
    api.operation_observe(key=op.key, state="outcome_unknown", fence=fence)
    with pytest.raises(api.InvalidTransition, match="effect_absent, effect_confirmed"):
        api.operation_observe(key=op.key, state="succeeded", fence=fence)


def test_reconcile_with_different_input_fails_closed(subject, fence):
    op = record(subject, fence, input_value={"parcel": "A-1"})
    api.operation_observe(key=op.key, state="outcome_unknown", fence=fence)
    with pytest.raises(api.InputFingerprintMismatch, match="not the input it was recorded"):
        api.operation_observe(
            key=op.key, state="effect_confirmed", fence=fence, input={"parcel": "A-2"}
        )
    with pytest.raises(api.InputFingerprintMismatch):
        api.operation_check_input(key=op.key, input={"parcel": "A-2"})
    assert Operation.objects.get(key=op.key).state == "outcome_unknown"
    api.operation_check_input(key=op.key, input={"parcel": "A-1"})
    done = api.operation_observe(
        key=op.key, state="effect_confirmed", fence=fence, input={"parcel": "A-1"}
    )
    assert done.state == "effect_confirmed"


def test_a_key_is_recorded_once(subject, fence):
    op = record(subject, fence, nonce="same", input_value={"x": 1})
    with pytest.raises(api.OperationExists, match="already recorded"):
        record(subject, fence, nonce="same", input_value={"x": 1})
    assert Operation.objects.filter(key=op.key).count() == 1


def test_prepared_operation_crosses_the_boundary_in_its_own_commit(subject, fence):
    op = record(subject, fence, state="prepared")
    moved = api.operation_dispatch(key=op.key, fence=fence)
    assert moved.state == "dispatched" and moved.revision == 2
    assert not api.operation_dispatch(key=op.key, fence=fence).changed
    assert api.chain_verify(subject).ok


def test_pending_is_answered_by_a_new_operation_with_the_same_idempotency_hash(subject, fence):
    fps = api.fingerprint_value(api.FingerprintKind.IDEMPOTENCY_KEY, "idem-fee-1")
    common = dict(
        subject=subject,
        step_id="pay",
        action="demo.fee",
        recovery_mode="non_atomic",
        definition_fp="a" * 64,
        input_fp="b" * 64,
        preview_fp="c" * 64,
        access_fp="d" * 64,
        idempotency_fp=fps,
        fence=fence,
    )
    first = api.operation_record(nonce="i1:pay:poll0", ordinal=0, **common)
    api.operation_observe(key=first.key, state="pending", fence=fence)
    with pytest.raises(api.ContradictoryObservation):
        api.operation_observe(key=first.key, state="succeeded", fence=fence)
    second = api.operation_record(nonce="i1:pay:poll1", ordinal=1, **common)
    assert second.key != first.key
    api.operation_observe(key=second.key, state="succeeded", fence=fence)
    assert set(Operation.objects.filter(idempotency_fp=fps).values_list("state", flat=True)) == {
        "pending",
        "succeeded",
    }


def test_raw_fingerprints_are_validated(subject, fence):
    with pytest.raises(api.RecoveryValidationError, match="64-character"):
        api.operation_record(
            subject=subject,
            step_id="s",
            action="a",
            recovery_mode="atomic",
            definition_fp="secret input",
            input_fp="b" * 64,
            preview_fp="c" * 64,
            access_fp="d" * 64,
            idempotency_fp="e" * 64,
            nonce="n",
            ordinal=0,
            fence=fence,
        )
    with pytest.raises(api.RecoveryValidationError, match="recovery mode"):
        api.operation_record(
            subject=subject,
            step_id="s",
            action="a",
            recovery_mode="maybe",
            definition_fp="a" * 64,
            input_fp="b" * 64,
            preview_fp="c" * 64,
            access_fp="d" * 64,
            idempotency_fp="e" * 64,
            nonce="n",
            ordinal=0,
            fence=fence,
        )
    assert not Operation.objects.exists()


def test_planted_secret_appears_nowhere_in_the_database(subject, fence):
    secret = "S3CRET-pl4nted-credential-9f1c"
    op = record(subject, fence, input_value={"applicant": "Ada", "api_token": secret})
    api.operation_observe(
        key=op.key,
        state="outcome_unknown",
        fence=fence,
        result={"error": f"timeout talking with token {secret}"},
    )
    assert api.chain_verify(subject).ok
    with connection.cursor() as cursor:
        tables = connection.introspection.table_names(cursor)
        for table in tables:
            quoted = connection.ops.quote_name(table)
            cursor.execute(f"SELECT * FROM {quoted}")
            for row in cursor.fetchall():
                assert secret not in repr(row), f"secret found in {table}"


def _lifecycle_statements() -> list[str]:
    subject = new_subject()
    fence = live_fence(subject)
    with CaptureQueriesContext(connection) as ctx:
        op = record(subject, fence)
        api.operation_observe(key=op.key, state="succeeded", fence=fence, result={"ok": True})
    return [
        q["sql"]
        for q in ctx.captured_queries
        if q["sql"] not in ("BEGIN", "COMMIT")
        and not q["sql"].startswith("SAVEPOINT")
        and not q["sql"].startswith("RELEASE")
    ]


def test_lifecycle_costs_two_commits_and_four_statements_where_a_step_is_one_call():
    """PostgreSQL (ADR 0035, 0050): head read + one INSERT of operation and checkpoint; one
    read of the operation, its subject's operations and chain + one statement of the
    update and its checkpoint. SQLite keeps the seven separate statements (ADR 0001): no
    round trips to save."""
    statements = _lifecycle_statements()
    assert len(statements) == (4 if connection.vendor == "postgresql" else 7), statements
    if connection.vendor == "postgresql":
        assert statements[-1].startswith("WITH up AS (UPDATE recovery_operation"), statements


def test_lifecycle_costs_seven_statements_when_sent_separately():
    with api.multi_statement():
        statements = _lifecycle_statements()
    assert len(statements) == 7, statements


def test_one_operation_is_read_by_its_key_as_it_stands_in_the_ledger(subject, fence):
    op = record(subject, fence, input_value={"parcel": "A-1"})
    seen = api.operation_get(key=op.key)
    assert (seen.key, seen.subject, seen.state) == (op.key, subject, "dispatched")
    assert seen.input_fp == api.fingerprint_value(api.FingerprintKind.INPUT, {"parcel": "A-1"})
    assert seen.step_id == Operation.objects.get(key=op.key).step_id
    api.operation_observe(key=op.key, state="outcome_unknown", fence=fence)
    assert api.operation_get(key=op.key).state == "outcome_unknown"
    assert api.operation_get(key="op-" + "0" * 64) is None
    assert api.operation_get(key="") is None


def test_reading_an_operation_costs_one_statement(subject, fence):
    op = record(subject, fence)
    with CaptureQueriesContext(connection) as captured:
        api.operation_get(key=op.key)
    assert len(captured.captured_queries) == 1
