"""A step's joint ledger write refuses what the separate writes refuse, with the same errors.

``operation_observe_record`` is one server call on PostgreSQL and two calls elsewhere
(ADR 0031). Each test runs on both paths (``multi_statement`` forces the separate ones on
PostgreSQL; on SQLite both are the separate ones) and expects the same error, tagged with
the write it refused, and nothing changed.
"""

from __future__ import annotations

import itertools

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from recovery import api
from recovery.models import Checkpoint, Operation
from recovery.services import _ledger, operations, step_call
from recovery.testing import fingerprints, record
from tests.providers.alpha.models import Note

pytestmark = pytest.mark.django_db

_nonces = itertools.count(1)


def next_step(subject, fence, **changes):
    """``operation_record``'s arguments for the next step on the same chain."""
    return {
        "subject": subject,
        "step_id": "step-2",
        "action": "test.notify",
        "recovery_mode": "non_atomic",
        "nonce": f"{subject.id}:step-2:{next(_nonces)}",
        "ordinal": 0,
        "fence": fence,
        **fingerprints(),
        **changes,
    }


def observed(op, fence, state="succeeded"):
    return api.Observation(key=op.key, state=state, fence=fence, result={"id": 7})


def standing(subject):
    """What a refused write must leave as it was."""
    ops = Operation.objects.filter(subject_type=subject.type, subject_id=subject.id)
    return sorted(ops.values_list("key", "state", "revision")), api.subject_revision(subject)


def test_both_writes_land_with_their_checkpoints(subject, fence, path):
    op = record(subject, fence)
    with CaptureQueriesContext(connection) as captured:
        done, recorded = api.operation_observe_record(
            observation=observed(op, fence), record=next_step(subject, fence), projection_fp=""
        )
    assert (done.state, done.revision, done.chain_seq) == ("succeeded", 2, 2)
    assert (recorded.state, recorded.revision, recorded.chain_seq) == ("dispatched", 1, 3)
    kinds = Checkpoint.objects.filter(subject_type=subject.type, subject_id=subject.id)
    assert list(kinds.order_by("seq").values_list("kind", flat=True)) == [
        "operation.recorded",
        "operation.observed",
        "operation.recorded",
    ]
    assert api.chain_verify(subject).ok
    calls = sum("recovery_observe_record(" in q["sql"] for q in captured.captured_queries)
    assert calls == int(path == "one_call" and connection.vendor == "postgresql")


def test_a_stale_fence_changes_nothing(subject, fence, path):
    op = record(subject, fence)
    before = standing(subject)
    api.lease_release(fence=fence)
    with pytest.raises(api.StaleFence) as refused:
        api.operation_observe_record(
            observation=observed(op, fence), record=next_step(subject, fence)
        )
    assert refused.value.ledger_write == "observe"
    assert standing(subject) == before


def test_an_open_incident_refuses_the_success(subject, fence, path):
    op = record(subject, fence)
    before = standing(subject)
    api.incident_report(subject=subject, reason="a row was edited")
    with pytest.raises(api.IntegrityIncidentOpen) as refused:
        api.operation_observe_record(
            observation=observed(op, fence), record=next_step(subject, fence)
        )
    assert refused.value.ledger_write == "observe"
    assert standing(subject) == before


def test_an_unsettled_effect_refuses_only_the_next_dispatch(subject, fence, path):
    op = record(subject, fence)
    other = api.Subject(subject.type, f"{subject.id}-other")
    in_flight = record(other, api.lease_acquire(key=f"lease:{other}", holder="w", ttl=60))
    idempotency_fp = Operation.objects.get(key=in_flight.key).idempotency_fp
    before = standing(subject)
    with pytest.raises(api.LedgerDisagrees) as refused:
        api.operation_observe_record(
            observation=observed(op, fence),
            record=next_step(subject, fence, idempotency_fp=idempotency_fp),
        )
    assert refused.value.ledger_write == "record"
    assert standing(subject) == before, "the observation rolled back with the refused dispatch"


def test_a_key_recorded_before_is_refused(subject, fence, path):
    first = record(subject, fence)
    again = next_step(subject, fence)
    second = api.operation_record(**again)
    api.operation_observe(key=second.key, state="failed", fence=fence)
    before = standing(subject)
    with pytest.raises(api.OperationExists) as refused:
        api.operation_observe_record(observation=observed(first, fence), record=again)
    assert refused.value.ledger_write == "record"
    assert standing(subject) == before


def test_a_chain_that_moved_after_it_was_verified_is_a_conflict(subject, fence, path, monkeypatch):
    op = record(subject, fence)
    real = _ledger.verified_head

    def verified_then_moved(cursor, subject_, *args, **kwargs):
        head = real(cursor, subject_, *args, **kwargs)
        api.fact_append(subject=subject_, kind="tests.meanwhile", fact={"n": 1})
        return head

    monkeypatch.setattr(operations, "verified_head", verified_then_moved)
    monkeypatch.setattr(step_call, "verified_head", verified_then_moved)
    with pytest.raises(api.ChainConflict) as refused:
        api.operation_observe_record(
            observation=observed(op, fence), record=next_step(subject, fence)
        )
    assert refused.value.ledger_write == "observe"
    assert Operation.objects.get(key=op.key).state == "dispatched"


def test_a_broken_chain_refuses_the_success(subject, fence, path):
    op = record(subject, fence)
    cps = Checkpoint.objects.filter(subject_type=subject.type, subject_id=subject.id)
    cps.filter(seq=1).update(fact_fp="0" * 64)  # edited by someone without the chain key
    before = standing(subject)
    with pytest.raises(api.ChainBroken) as refused:
        api.operation_observe_record(
            observation=observed(op, fence), record=next_step(subject, fence)
        )
    assert refused.value.ledger_write == "observe"
    assert standing(subject) == before


def row_write(note, *, expect: str) -> api.RowWrite:
    return api.RowWrite(
        Note, note.pk, {"text": "moved"}, {"text": expect}, lambda: RuntimeError("moved first")
    )


def test_the_callers_row_is_written_first_and_with_the_rest(subject, fence, path):
    op = record(subject, fence)
    note = Note.objects.create(instance_id=1, text="ready")
    api.operation_observe_record(
        observation=observed(op, fence),
        record=next_step(subject, fence),
        first=row_write(note, expect="ready"),
    )
    note.refresh_from_db()
    assert note.text == "moved" and Operation.objects.get(key=op.key).state == "succeeded"


@pytest.mark.parametrize(
    "first",
    [
        pytest.param(lambda note: row_write(note, expect="ready"), id="one row"),
        pytest.param(
            lambda note: _TwoNotes(note, absent_pk=note.pk + 1000), id="a part among several"
        ),
    ],
)
def test_a_callers_row_moved_meanwhile_refuses_everything(subject, fence, path, first):
    op = record(subject, fence)
    note = Note.objects.create(instance_id=1, text="elsewhere")
    before = standing(subject)
    with pytest.raises(RuntimeError, match="moved first"):
        api.operation_observe_record(
            observation=observed(op, fence),
            record=next_step(subject, fence),
            first=first(note),
        )
    assert standing(subject) == before
    assert Note.objects.get(pk=note.pk).text == "elsewhere"


def test_a_callers_row_on_a_stale_fence_is_a_stale_fence(subject, fence, path):
    op = record(subject, fence)
    note = Note.objects.create(instance_id=1, text="ready")
    api.lease_release(fence=fence)
    with pytest.raises(api.StaleFence):
        api.operation_observe_record(
            observation=observed(op, fence),
            record=next_step(subject, fence),
            first=row_write(note, expect="ready"),
        )
    assert Note.objects.get(pk=note.pk).text == "ready"


class _TwoNotes:
    """Two of the caller's rows in front of the call (``FirstWrites``, ADR 0047): one that
    must match, and one that may match nothing (as the engine's instance row on a live
    fence: no error, so the call is made on its own)."""

    def __init__(self, note, absent_pk: int) -> None:
        self.note, self.absent_pk, self.took_values = note, absent_pk, None

    def parts(self, fence):
        sql, params = row_write(self.note, expect="ready").sql(fence)
        table = Note._meta.db_table
        return (
            [
                f"one AS ({sql} RETURNING 1)",
                f"none AS (UPDATE {table} SET text = 'x' WHERE id = %s RETURNING 1)",
            ],
            [*params, self.absent_pk],
            ["(SELECT count(*) FROM one)", "(SELECT count(*) FROM none)"],
            "(SELECT count(*) FROM one) = 1 AND EXISTS (SELECT 1 FROM none)",
        )

    def took(self, fence, values):
        self.took_values = list(values)
        if values[0] != 1:
            raise RuntimeError("moved first")

    def write(self, fence):
        row_write(self.note, expect="ready").write(fence)
        Note.objects.filter(pk=self.absent_pk).update(text="x")


def test_several_rows_in_front_and_one_that_matched_nothing_without_error(subject, fence, path):
    op = record(subject, fence)
    note = Note.objects.create(instance_id=1, text="ready")
    first = _TwoNotes(note, absent_pk=note.pk + 1000)
    with CaptureQueriesContext(connection) as captured:
        done, recorded = api.operation_observe_record(
            observation=observed(op, fence), record=next_step(subject, fence), first=first
        )
    assert (done.state, recorded.state) == ("succeeded", "dispatched")
    assert Note.objects.get(pk=note.pk).text == "moved" and api.chain_verify(subject).ok
    calls = sum("recovery_observe_record(" in q["sql"] for q in captured.captured_queries)
    if path == "one_call" and connection.vendor == "postgresql":
        assert first.took_values == [1, 0]
        assert calls == 2  # refused as 'row' in front, then the call alone
    else:
        assert first.took_values is None and calls == 0
