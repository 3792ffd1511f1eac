"""Standalone ledger calls outside any transaction: one statement per commit (ADR 0040).

Outside a transaction, on PostgreSQL's one-call path, ``operation_record`` writes after the
head its run last wrote and ``operation_observe``'s success checks, inside its one
statement, that the chain and the operation rows after the run's verified mark are what
the run wrote. Anything else writes nothing and goes the transaction path, which refuses
with the same errors as before. These tests run outside a test transaction (the path is
only taken there), on both paths (``path``: the separate statements on SQLite and inside
``multi_statement``), and expect the same outcome, rows and errors.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from recovery import api, chain
from recovery.models import Checkpoint, IntegrityIncident, Operation
from recovery.subjects import LEDGER_WATERMARK
from recovery.testing import fingerprints, live_fence, new_subject, record

pytestmark = pytest.mark.django_db(transaction=True)


def lone(path) -> bool:
    return path == "one_call" and connection.vendor == "postgresql"


def standing(subject):
    """What a refused write must leave as it was."""
    ops = Operation.objects.filter(subject_type=subject.type, subject_id=subject.id)
    return sorted(ops.values_list("key", "state", "revision")), api.subject_revision(subject)


def recorded(subject, fence, n: int):
    """Operation ``n`` of ``subject``: the same key and fingerprints on every path."""
    fps = fingerprints({"n": n})
    fps["idempotency_fp"] = api.fingerprint_value(
        api.FingerprintKind.IDEMPOTENCY_KEY, f"{subject}:{n}"
    )
    return api.operation_record(
        subject=subject, step_id=f"step-{n}", action="test.notify", recovery_mode="non_atomic",
        nonce=f"{subject.id}:{n}", ordinal=0, fence=fence, **fps,
    )  # fmt: skip


def lifecycle(subject, fence, n: int = 1):
    op = recorded(subject, fence, n)
    return api.operation_observe(key=op.key, state="succeeded", fence=fence, result={"n": n})


def rows(subject):
    """Every ledger row of ``subject`` apart from ids and clocks."""
    ops = Operation.objects.filter(subject_type=subject.type, subject_id=subject.id)
    cps = Checkpoint.objects.filter(subject_type=subject.type, subject_id=subject.id)
    skip = {"id", "recorded_at", "updated_at"}
    op_fields = [f.attname for f in Operation._meta.concrete_fields if f.attname not in skip]
    cp_fields = [f.attname for f in Checkpoint._meta.concrete_fields if f.attname not in skip]
    return (
        sorted(ops.values_list(*op_fields)),
        list(cps.order_by("seq").values_list(*cp_fields)),
    )


def incidents(subject) -> int:
    return IntegrityIncident.objects.filter(
        subject_type=subject.type, subject_id=subject.id, status="open"
    ).count()


def test_a_lifecycle_is_one_statement_per_commit(subject, fence, path):
    lifecycle(subject, fence, 1)
    with CaptureQueriesContext(connection) as captured:
        for n in (2, 3, 4):
            done = lifecycle(subject, fence, n)
    assert (done.state, done.revision, done.chain_seq) == ("succeeded", 2, 8)
    assert api.chain_verify(subject).ok
    sent = [q["sql"] for q in captured.captured_queries if q["sql"] not in ("BEGIN", "COMMIT")]
    if lone(path):
        assert len(sent) == 6, sent  # one statement per commit, nothing read
    else:
        assert len(sent) > 6


def test_a_first_lifecycle_on_a_fresh_subject_is_one_statement_per_commit(subject, fence, path):
    with CaptureQueriesContext(connection) as captured:
        lifecycle(subject, fence)
    assert api.chain_verify(subject).ok
    sent = len(captured.captured_queries)
    assert (sent == 2) if lone(path) else (sent > 2)


def test_a_success_whose_row_holds_a_separator_reads_and_verifies_instead(subject, fence, path):
    """The standalone success compares the run's rows joined by the unit and record
    separators (migration 0026); a row holding one is read and verified instead, and its
    value stored exactly."""
    lifecycle(subject, fence, 1)
    fps = fingerprints({"n": 2})
    op = api.operation_record(
        subject=subject, step_id="step\x1e2", action="test.notify", recovery_mode="non_atomic",
        nonce=f"{subject.id}:2", ordinal=0, fence=fence, **fps,
    )  # fmt: skip
    with CaptureQueriesContext(connection) as captured:
        done = api.operation_observe(key=op.key, state="succeeded", fence=fence, result={})
    assert (done.state, done.chain_seq) == ("succeeded", 4) and api.chain_verify(subject).ok
    assert Operation.objects.get(key=op.key).step_id == "step\x1e2"
    sent = [q["sql"] for q in captured.captured_queries if q["sql"] not in ("BEGIN", "COMMIT")]
    assert not any("recovery_lone_success(" in sql for sql in sent), sent
    assert len(sent) > 1
    assert lifecycle(subject, fence, 3).chain_seq == 6 and api.chain_verify(subject).ok


# What a standalone caller does: successes, failures, pending answers and unknown outcomes
# (each then retried by a new operation), someone else's fact in between, a success
# repeated, the process restarted (its marks forgotten), several operations in flight.
MOVES = ("ok", "fail", "pending", "unknown", "fact", "again", "restart", "two")
OBSERVED = {"fail": "failed", "pending": "pending", "unknown": "outcome_unknown"}


def run_sequence(subject, fence, moves) -> None:
    done = None
    for n, move in enumerate(moves):
        if move == "fact":
            api.fact_append(subject=subject, kind="tests.meanwhile", fact={"n": n})
        elif move == "restart":
            chain.marks_clear()
        elif move == "again" and done is not None:
            api.operation_observe(key=done.key, state="succeeded", fence=fence, result={"n": 1})
        elif move == "two":
            first, second = recorded(subject, fence, 2 * n), recorded(subject, fence, 2 * n + 1)
            for op in (second, first):
                api.operation_observe(key=op.key, state="succeeded", fence=fence)
        elif move != "again":
            op = recorded(subject, fence, 2 * n)
            state = OBSERVED.get(move, "succeeded")
            observed = api.operation_observe(key=op.key, state=state, fence=fence, result={"n": 1})
            done = observed if state == "succeeded" else done


@hypothesis_settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(moves=st.lists(st.sampled_from(MOVES), min_size=1, max_size=10))
def test_both_paths_leave_the_same_rows_and_links(moves):
    same_rows_on_both_paths(run_sequence, moves)


def same_rows_on_both_paths(sequence, moves) -> None:
    """Run ``sequence(subject, fence, moves)`` on the one-call path, then again on the
    separate statements from nothing: every row, fingerprint and link must be the same."""
    subject = new_subject()
    fence = live_fence(subject)
    chain.marks_clear()
    sequence(subject, fence, moves)
    written = rows(subject)
    assert api.chain_verify(subject).ok
    Operation.objects.filter(subject_type=subject.type, subject_id=subject.id).delete()
    Checkpoint.objects.filter(subject_type=subject.type, subject_id=subject.id).delete()
    chain.marks_clear()
    with api.multi_statement():
        sequence(subject, fence, moves)
    assert rows(subject) == written


def test_a_run_that_never_wrote_the_subject_lands_after_its_head(subject, fence, path):
    lifecycle(subject, fence, 1)
    chain.marks_clear()  # another process, or this one restarted
    done = lifecycle(subject, fence, 2)
    assert done.chain_seq == 4 and api.chain_verify(subject).ok


def test_someone_elses_fact_between_record_and_success_is_verified_and_kept(subject, fence, path):
    lifecycle(subject, fence, 1)
    op = record(subject, fence)
    api.fact_append(subject=subject, kind="tests.meanwhile", fact={"n": 1})
    done = api.operation_observe(key=op.key, state="succeeded", fence=fence, result={"a": 1})
    assert done.chain_seq == 5 and api.chain_verify(subject).ok
    assert lifecycle(subject, fence, 3).chain_seq == 7


def test_a_record_on_a_stale_fence_records_nothing(subject, fence, path):
    lifecycle(subject, fence, 1)
    before = standing(subject)
    api.lease_release(fence=fence)
    with pytest.raises(api.StaleFence, match="no longer the live lease"):
        record(subject, fence)
    assert standing(subject) == before


@pytest.mark.parametrize("whose", ["subject", "ledger"])
def test_a_record_under_an_open_incident_records_nothing(subject, fence, path, whose):
    lifecycle(subject, fence, 1)
    api.incident_report(subject=subject if whose == "subject" else LEDGER_WATERMARK, reason="x")
    before = standing(subject)
    with pytest.raises(api.IntegrityIncidentOpen) as refused:
        record(subject, fence)
    assert refused.value.ledger_wide == (whose == "ledger")
    assert standing(subject) == before


def test_a_record_of_an_unsettled_effect_or_a_known_key_records_nothing(subject, fence, path):
    effect = fingerprints({"n": 1})
    arguments = dict(
        subject=subject, step_id="s", action="test.notify", recovery_mode="non_atomic",
        nonce=f"{subject.id}:1", ordinal=0, fence=fence, **effect,
    )  # fmt: skip
    first = api.operation_record(**arguments)
    before = standing(subject)
    with pytest.raises(api.OperationExists, match="already recorded"):
        api.operation_record(**arguments)
    with pytest.raises(api.LedgerDisagrees) as refused:
        api.operation_record(**{**arguments, "nonce": f"{subject.id}:2", "ordinal": 1})
    assert (refused.value.operation, refused.value.state) == (first.key, "dispatched")
    assert standing(subject) == before


@pytest.mark.parametrize("why", ["stale", "incident"])
def test_a_success_on_a_stale_fence_or_under_an_incident_changes_nothing(subject, fence, path, why):
    lifecycle(subject, fence, 1)
    op = record(subject, fence)
    if why == "stale":
        api.lease_release(fence=fence)
    else:
        api.incident_report(subject=subject, reason="a row was edited")
    before = standing(subject)
    with pytest.raises(api.StaleFence if why == "stale" else api.IntegrityIncidentOpen):
        api.operation_observe(key=op.key, state="succeeded", fence=fence, result={"a": 1})
    assert standing(subject) == before


def test_a_repeated_success_is_unchanged_and_a_different_one_refused(subject, fence, path):
    done = lifecycle(subject, fence, 1)
    again = api.operation_observe(key=done.key, state="succeeded", fence=fence, result={"n": 1})
    assert again.changed is False and again.revision == 2
    with pytest.raises(api.ContradictoryObservation):
        api.operation_observe(key=done.key, state="succeeded", fence=fence, result={"n": 2})
    assert lifecycle(subject, fence, 2).chain_seq == 4


def _edit_recorded_checkpoint(subject, seq):
    Checkpoint.objects.filter(subject_type=subject.type, subject_id=subject.id, seq=seq).update(
        fact_fp="0" * 64
    )


def _edit_operation_row(subject, seq):
    Operation.objects.filter(subject_type=subject.type, subject_id=subject.id).filter(
        chain_seq=seq
    ).update(input_fp="1" * 64)


def _add_checkpoint_past_the_head(subject, seq):
    Checkpoint.objects.create(
        subject_type=subject.type, subject_id=subject.id, seq=seq + 2, kind="tests.forged",
        fact="{}", fact_fp="2" * 64, prev_link="3" * 64, link="4" * 64, key_id="test",
        recorded_at="2026-01-01T00:00:00Z",
    )  # fmt: skip


def _add_operation_row(subject, seq):
    row = Operation.objects.get(subject_type=subject.type, subject_id=subject.id, chain_seq=seq)
    row.pk, row.key = None, "op-" + "5" * 64
    row.save()


@pytest.mark.parametrize(
    "tamper",
    [_edit_recorded_checkpoint, _edit_operation_row, _add_checkpoint_past_the_head,
     _add_operation_row],
)  # fmt: skip
@pytest.mark.parametrize("earlier", [0, 2], ids=["first", "later"])
def test_a_tampered_tail_refuses_the_success_and_opens_an_incident(
    subject, fence, path, tamper, earlier
):
    for n in range(earlier):
        lifecycle(subject, fence, n + 10)
    op = record(subject, fence)
    tamper(subject, op.chain_seq)
    before = standing(subject)
    with pytest.raises(api.ChainBroken):
        api.operation_observe(key=op.key, state="succeeded", fence=fence, result={"a": 1})
    assert standing(subject) == before
    assert incidents(subject) == 1


def test_a_tampered_earlier_success_in_the_written_tail_is_found(subject, fence, path):
    lifecycle(subject, fence, 1)
    lifecycle(subject, fence, 2)  # its success (#4) is what the run wrote after its mark
    op = record(subject, fence)
    _edit_recorded_checkpoint(subject, 4)
    with pytest.raises(api.ChainBroken):
        api.operation_observe(key=op.key, state="succeeded", fence=fence, result={"a": 1})
    assert incidents(subject) == 1


def test_a_moved_mark_checkpoint_is_found(subject, fence, path):
    lifecycle(subject, fence, 1)
    lifecycle(subject, fence, 2)  # the run's mark is now at #2 (or #3)
    op = record(subject, fence)
    mark = chain.mark_peek(fence)
    seq = mark.seq if mark is not None and mark.seq else 2
    Checkpoint.objects.filter(subject_type=subject.type, subject_id=subject.id, seq=seq).update(
        link="6" * 64
    )
    with pytest.raises(api.ChainBroken):
        api.operation_observe(key=op.key, state="succeeded", fence=fence, result={"a": 1})
    assert incidents(subject) == 1
