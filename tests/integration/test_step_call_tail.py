"""A run's later chained steps check the chain's tail inside their one call (ADR 0051).

Once a run's chained step has committed, the run knows the checkpoints it wrote after its
verified mark, row for row. The next chained step (``operation_observe_record`` on
PostgreSQL's one-call path) does not read the chain back: ``recovery_tail_observe_record``
checks that the stored rows past the mark are exactly those, then writes. Rows that differ
— tampered, or someone else's fact in between — write nothing there, and the step reads and
verifies as before in the same transaction: a broken chain is refused with an incident, a
legitimate fact is verified and kept. Every test runs on both paths (``path``) and expects
the same outcome; the rows of random sequences are the same on both.
"""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from recovery import api, chain
from recovery.models import Operation
from recovery.testing import fingerprints
from tests.integration.test_lone_calls import (
    _add_checkpoint_past_the_head,
    _add_operation_row,
    _edit_operation_row,
    _edit_recorded_checkpoint,
    incidents,
    recorded,
    same_rows_on_both_paths,
    standing,
)
from tests.providers.alpha.models import Note

pytestmark = pytest.mark.django_db(transaction=True)

TAIL = "recovery_tail_observe_record("
READ = "SELECT 0 AS part"  # the chain read before a success's verification


def one_call(path) -> bool:
    return path == "one_call" and connection.vendor == "postgresql"


def next_step(subject, fence, n: int) -> dict:
    fps = fingerprints({"n": n})
    fps["idempotency_fp"] = api.fingerprint_value(
        api.FingerprintKind.IDEMPOTENCY_KEY, f"{subject}:{n}"
    )
    return dict(
        subject=subject, step_id=f"step-{n}", action="test.notify", recovery_mode="non_atomic",
        nonce=f"{subject.id}:{n}", ordinal=0, fence=fence, **fps,
    )  # fmt: skip


def chained(subject, fence, op, n: int, *, last: bool = True, first=None):
    """Observe ``op``'s success and record operation ``n``: one step's joint write, as the
    engine makes it at the end of its commit (``last``: sent alone when it can be)."""
    observation = api.Observation(key=op.key, state="succeeded", fence=fence, result={"n": n})
    return api.operation_observe_record(
        observation=observation,
        record=next_step(subject, fence, n),
        projection_fp="",
        first=first,
        last=last,
    )


def sqls(captured) -> list[str]:
    return [q["sql"] for q in captured.captured_queries]


def test_later_chained_steps_check_the_tail_instead_of_reading_it(subject, fence, path):
    op = recorded(subject, fence, 1)
    _, op = chained(subject, fence, op, 2)
    with CaptureQueriesContext(connection) as captured:
        for n in (3, 4, 5):
            done, op = chained(subject, fence, op, n)
    assert (done.state, done.revision, op.state, op.chain_seq) == ("succeeded", 2, "dispatched", 9)
    assert api.chain_verify(subject).ok
    statements = [sql for sql in sqls(captured) if sql not in ("BEGIN", "COMMIT")]
    if one_call(path):
        # One statement per step: no read of the chain, the tail checked in the call.
        assert len(statements) == 3 and all(TAIL in sql for sql in statements), statements
    else:
        assert not any(TAIL in sql for sql in statements)


@pytest.mark.parametrize(
    "tamper",
    [_edit_recorded_checkpoint, _edit_operation_row, _add_checkpoint_past_the_head,
     _add_operation_row],
)  # fmt: skip
@pytest.mark.parametrize("earlier", [1, 3], ids=["second", "later"])
def test_a_tampered_tail_refuses_the_step_and_opens_an_incident(
    subject, fence, path, tamper, earlier
):
    op = recorded(subject, fence, 1)
    for n in range(2, 2 + earlier):
        _, op = chained(subject, fence, op, n)
    tamper(subject, op.chain_seq)
    before = standing(subject)
    with pytest.raises(api.ChainBroken) as refused:
        chained(subject, fence, op, 10)
    assert refused.value.ledger_write == "observe"
    assert standing(subject) == before
    assert incidents(subject) == 1


def test_someone_elses_fact_between_steps_is_verified_and_kept(subject, fence, path):
    op = recorded(subject, fence, 1)
    _, op = chained(subject, fence, op, 2)
    api.fact_append(subject=subject, kind="tests.meanwhile", fact={"n": 1})
    with CaptureQueriesContext(connection) as captured:
        done, op = chained(subject, fence, op, 3)
    assert (done.chain_seq, op.chain_seq) == (5, 6) and api.chain_verify(subject).ok
    if one_call(path):
        # The tail was not as the run wrote it: nothing written there, then read and verified.
        statements = sqls(captured)
        assert sum(TAIL in sql for sql in statements) == 1
        assert sum(READ in sql for sql in statements) == 1
    with CaptureQueriesContext(connection) as captured:
        _, op = chained(subject, fence, op, 4)  # known again from here on
    assert op.chain_seq == 8 and api.chain_verify(subject).ok
    assert not any(READ in sql for sql in sqls(captured)) or not one_call(path)


def test_a_field_holding_a_separator_is_read_and_verified_instead(subject, fence, path):
    """The tail call compares the run's rows joined by the unit and record separators
    (migration 0026). A field holding one cannot be told apart there: the step that would
    compare it reads and verifies the tail instead, and every value is stored exactly."""
    op = recorded(subject, fence, 1)
    _, op = chained(subject, fence, op, 2)
    observation = api.Observation(key=op.key, state="succeeded", fence=fence, result={"n": 2})
    odd = {**next_step(subject, fence, 3), "step_id": "step\x1f3\x1e"}
    _, op = api.operation_observe_record(
        observation=observation, record=odd, projection_fp="", last=True
    )
    with CaptureQueriesContext(connection) as captured:
        done, after = chained(subject, fence, op, 4)  # step 3's row is in the tail now
    assert (done.state, after.chain_seq) == ("succeeded", 7) and api.chain_verify(subject).ok
    assert Operation.objects.get(key=op.key).step_id == "step\x1f3\x1e"
    if one_call(path):
        assert not any(TAIL in sql for sql in sqls(captured))
        assert sum(READ in sql for sql in sqls(captured)) == 1
    _, after = chained(subject, fence, after, 5)
    assert after.chain_seq == 9 and api.chain_verify(subject).ok


def test_a_rolled_back_step_is_not_remembered(subject, fence, path):
    op = recorded(subject, fence, 1)
    _, op = chained(subject, fence, op, 2)

    class Undone(Exception):
        pass

    with pytest.raises(Undone), transaction.atomic():
        chained(subject, fence, op, 3, last=False)  # the caller may roll back after it
        raise Undone
    assert standing(subject)[1] == 3
    done, after = chained(subject, fence, op, 3)  # what the run wrote is still the tail
    assert (done.chain_seq, after.chain_seq) == (4, 5) and api.chain_verify(subject).ok
    _, after = chained(subject, fence, after, 4)
    assert after.chain_seq == 7 and api.chain_verify(subject).ok


def test_a_step_on_a_stale_fence_changes_nothing(subject, fence, path):
    op = recorded(subject, fence, 1)
    _, op = chained(subject, fence, op, 2)
    api.lease_release(fence=fence)
    api.lease_acquire(key=fence.key, holder="someone-else", ttl=60)
    before = standing(subject)
    with pytest.raises(api.StaleFence) as refused:
        chained(subject, fence, op, 3)
    assert refused.value.ledger_write == "observe"
    assert standing(subject) == before


@pytest.mark.parametrize(
    ("state", "allowed"), [("pending", True), ("failed", True), ("succeeded", False)]
)
def test_the_next_operation_of_the_same_effect_sees_the_step_as_it_moves_it(
    subject, fence, path, state, allowed
):
    """A poll of a pending provider or a retry after a failure is a new operation of the
    same effect (its idempotency key); after a success it would be a second effect. The
    check sees step k's operation as this very call moves it, not as it stood before."""
    op = recorded(subject, fence, 1)
    _, op = chained(subject, fence, op, 2)  # the run's mark now covers what it wrote
    effect = next_step(subject, fence, 2)["idempotency_fp"]  # step 2's own
    again = {**next_step(subject, fence, 3), "idempotency_fp": effect}
    observation = api.Observation(key=op.key, state=state, fence=fence, result={"n": 2})
    before = standing(subject)
    with CaptureQueriesContext(connection) as captured:
        if allowed:
            done, after = api.operation_observe_record(
                observation=observation, record=again, projection_fp="", last=True
            )
            assert (done.state, after.state, after.chain_seq) == (state, "dispatched", 5)
            assert api.chain_verify(subject).ok
        else:
            with pytest.raises(api.LedgerDisagrees) as refused:
                api.operation_observe_record(
                    observation=observation, record=again, projection_fp="", last=True
                )
            assert refused.value.ledger_write == "record"
            assert standing(subject) == before
    if one_call(path):
        assert any(TAIL in sql for sql in sqls(captured))


def test_an_unsettled_operation_of_the_same_effect_refuses_only_the_next_dispatch(
    subject, fence, path
):
    op = recorded(subject, fence, 1)
    _, op = chained(subject, fence, op, 2)
    other = api.Subject(subject.type, f"{subject.id}-other")
    in_flight = recorded(other, api.lease_acquire(key=f"lease:{other}", holder="w", ttl=60), 7)
    effect = Operation.objects.get(key=in_flight.key).idempotency_fp
    before = standing(subject)
    observation = api.Observation(key=op.key, state="succeeded", fence=fence, result={"n": 2})
    with pytest.raises(api.LedgerDisagrees) as refused:
        api.operation_observe_record(
            observation=observation,
            record={**next_step(subject, fence, 3), "idempotency_fp": effect},
            projection_fp="",
            last=True,
        )
    assert refused.value.ledger_write == "record"
    assert standing(subject) == before, "the observation rolled back with the refused dispatch"


def test_a_key_recorded_before_is_refused_after_the_tail(subject, fence, path):
    op = recorded(subject, fence, 1)
    _, op = chained(subject, fence, op, 2)
    again = next_step(subject, fence, 3)
    earlier = api.operation_record(**again)
    api.operation_observe(key=earlier.key, state="failed", fence=fence)
    before = standing(subject)
    observation = api.Observation(key=op.key, state="succeeded", fence=fence, result={"n": 2})
    with pytest.raises(api.OperationExists) as refused:
        api.operation_observe_record(
            observation=observation, record=again, projection_fp="", last=True
        )
    assert refused.value.ledger_write == "record"
    assert standing(subject) == before


def note_moved(note, expect: str):
    return api.RowWrite(
        Note, note.pk, {"text": "moved"}, {"text": expect}, lambda: RuntimeError("moved first")
    )


def test_a_step_sent_alone_is_its_whole_commit_with_the_callers_row(subject, fence, path):
    op = recorded(subject, fence, 1)
    _, op = chained(subject, fence, op, 2)
    note = Note.objects.create(instance_id=1, text="ready")
    with CaptureQueriesContext(connection) as captured:
        done, op = chained(subject, fence, op, 3, first=note_moved(note, "ready"))
    assert (done.state, op.chain_seq) == ("succeeded", 5) and api.chain_verify(subject).ok
    assert Note.objects.get(pk=note.pk).text == "moved"
    if one_call(path):
        # The row, the tail checked, both moves and checkpoints: one statement.
        statements = [sql for sql in sqls(captured) if sql not in ("BEGIN", "COMMIT")]
        assert len(statements) == 1 and TAIL in statements[0], statements


@pytest.mark.parametrize("why", ["stale fence", "row moved", "open incident"])
def test_a_step_sent_alone_and_refused_writes_nothing_not_even_the_callers_row(
    subject, fence, path, why
):
    op = recorded(subject, fence, 1)
    _, op = chained(subject, fence, op, 2)
    note = Note.objects.create(instance_id=1, text="ready")
    expect, error = "ready", api.StaleFence
    if why == "stale fence":
        api.lease_release(fence=fence)
        api.lease_acquire(key=fence.key, holder="someone-else", ttl=60)
    elif why == "row moved":
        expect, error = "elsewhere", RuntimeError
    else:
        api.incident_report(subject=subject, reason="tests: an operator stopped it")
        error = api.IntegrityIncidentOpen
    before = standing(subject)
    with pytest.raises(error):
        chained(subject, fence, op, 3, first=note_moved(note, expect))
    assert standing(subject) == before
    assert Note.objects.get(pk=note.pk).text == "ready"


# Random sequences of what a run does on one chain: standalone lifecycles, chained steps
# (alone, or inside the caller's transaction), someone else's fact, the process restarted
# (its marks forgotten), a step rolled back.
MOVES = ("chain", "chain", "inside", "lone", "fact", "restart", "undone")


def run_sequence(subject, fence, moves) -> None:
    op = recorded(subject, fence, 0)
    for n, move in enumerate(moves, 1):
        if move == "chain":
            _, op = chained(subject, fence, op, n)
        elif move == "inside":
            with transaction.atomic():
                _, op = chained(subject, fence, op, n, last=False)
        elif move == "lone":
            api.operation_observe(key=op.key, state="succeeded", fence=fence, result={"n": n})
            op = recorded(subject, fence, n)
        elif move == "fact":
            api.fact_append(subject=subject, kind="tests.meanwhile", fact={"n": n})
        elif move == "restart":
            chain.marks_clear()
        else:
            try:
                with transaction.atomic():
                    chained(subject, fence, op, n, last=False)
                    raise LookupError
            except LookupError:
                pass
    api.operation_observe(key=op.key, state="succeeded", fence=fence, result={"n": 0})


@hypothesis_settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(moves=st.lists(st.sampled_from(MOVES), min_size=1, max_size=10))
def test_both_paths_leave_the_same_rows_and_links(moves):
    same_rows_on_both_paths(run_sequence, moves)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the ledger's server functions")
@pytest.mark.parametrize("checked", [None, False, True], ids=["previous", "alone", "checked"])
def test_the_tail_call_of_this_and_of_the_previous_release_answer_alike(checked):
    """Migration 0028 adds a 19-argument call (the caller's rows checked the lease) beside
    the 18-argument one a worker of the previous release still sends: both refuse a tail
    that is not the stored one, writing nothing."""
    args = ["t.subject", "nowhere", 1, "0" * 64, "rows", "ops", "lease:x", "h", 1]
    args += ['["op-x","dispatched","1","succeeded","","true","1","l"]', "[]", "{}", "t", "0"]
    args += ["k", "[]", "{}", "{}"]
    placeholders = ", ".join(["%s"] * len(args))
    if checked is not None:
        args.append(checked)
        placeholders += ", %s::boolean"
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT recovery_tail_observe_record({placeholders})", args)
        assert cursor.fetchone()[0] == "tail"
