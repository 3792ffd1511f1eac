"""Incremental chain verification (ADR 0034): a run verifies its chain whole once, then the tail.

A success verifies its subject's chain (I7). The first success of a run (a lease: each
claim or run takes a new fence) verifies the whole chain and keeps a mark in the
process's memory; each later success of that run reads and verifies only the checkpoints
after the mark and the operation rows they touch. A tampered checkpoint in that tail blocks
the success as before; a tampered *older* row is found at the next full verification: the
next run's first success, a decision's confirmed effect, ``recovery_verify`` and every
``chain_verify`` (the desk's and the API's). Each test runs on both ledger paths
(``operation_observe_record`` as one call on PostgreSQL, the separate statements elsewhere).
"""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection

from govflow.engine.models import InstanceStatus
from recovery import api
from recovery.chain import replay
from recovery.models import Checkpoint, IntegrityIncident, Operation
from recovery.testing import chained_step, live_fence, record
from tests.flows import action, drive, linear, start
from tests.integration.test_decisions import request

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def verified(monkeypatch):
    """Counts the checkpoints whose link and fact are verified (a full replay counts all)."""
    counted = []
    real = replay._checkpoint_fact

    def counting(*args):
        counted.append(args[3][0])
        return real(*args)

    monkeypatch.setattr(replay, "_checkpoint_fact", counting)
    return counted


def step(subject, fence, op):
    """One step as the engine writes it: ``op`` succeeded, the next one dispatched."""
    return chained_step(subject, fence, op)


def steps(subject, fence, n: int):
    op = record(subject, fence)
    for _ in range(n):
        op = step(subject, fence, op)
    return op


def next_run(subject, fence):
    """The run ends (its lease released); another run takes the subject: a new fence."""
    api.lease_release(fence=fence)
    return live_fence(subject, holder="worker-2")


def checkpoints(subject):
    return Checkpoint.objects.filter(subject_type=subject.type, subject_id=subject.id)


def tamper(subject, seq: int) -> None:
    row = checkpoints(subject).get(seq=seq)
    checkpoints(subject).filter(seq=seq).update(fact=row.fact.replace("succeeded", "failed"))


def incident_of(subject):
    return IntegrityIncident.objects.get(
        subject_type=subject.type, subject_id=subject.id, status="open"
    )


@pytest.mark.parametrize("length", [3, 30])
def test_a_runs_later_successes_verify_only_the_checkpoints_after_its_mark(
    subject, fence, path, verified, length
):
    op = steps(subject, fence, length)
    verified.clear()
    step(subject, fence, op)
    # The previous step's two checkpoints (its observation, this step's dispatch):
    # the same two whatever the chain's length. On PostgreSQL's one call the run knows
    # them as it wrote them, and the call checks them in the server (ADR 0051): none is
    # replayed here.
    in_call = path == "one_call" and connection.vendor == "postgresql"
    assert verified == ([] if in_call else [2 * length, 2 * length + 1])
    fence = next_run(subject, fence)
    op = Operation.objects.filter(subject_id=subject.id, state="dispatched").get()
    verified.clear()
    step(subject, fence, api.RecordedOperation(op.key, subject, op.state, 1, op.chain_seq))
    assert verified == list(range(1, 2 * length + 4))  # a new run: the whole chain, once


def test_a_tampered_checkpoint_after_the_mark_blocks_the_success_and_opens_an_incident(
    subject, fence, path
):
    op = steps(subject, fence, 4)  # the run's mark stands at #7; #8 is the last observation
    tamper(subject, 8)
    with pytest.raises(api.ChainBroken, match="checkpoint chain is broken at #8"):
        step(subject, fence, op)
    assert (incident_of(subject).position, Operation.objects.get(key=op.key).state) == (
        8,
        "dispatched",
    )
    assert checkpoints(subject).count() == 9


def test_a_tampered_old_checkpoint_is_found_at_the_next_runs_first_success(subject, fence, path):
    op = steps(subject, fence, 4)
    tamper(subject, 2)  # before the run's mark
    op = step(subject, fence, op)  # this run verified #2 already: it reads past its mark only
    assert not IntegrityIncident.objects.exists()
    fence = next_run(subject, fence)
    with pytest.raises(api.ChainBroken, match="checkpoint chain is broken at #2"):
        step(subject, fence, op)
    assert incident_of(subject).position == 2
    assert Operation.objects.get(key=op.key).state == "dispatched"


def test_an_old_operation_row_changed_is_found_at_the_next_runs_first_success(subject, fence, path):
    op = steps(subject, fence, 4)
    first = Operation.objects.filter(subject_id=subject.id).order_by("id").first()
    Operation.objects.filter(pk=first.pk).update(result_fp="0" * 64)
    op = step(subject, fence, op)
    fence = next_run(subject, fence)
    with pytest.raises(api.ChainBroken, match="result_fp"):
        step(subject, fence, op)
    assert incident_of(subject).position == first.chain_seq


def test_a_mark_whose_checkpoint_was_rewritten_is_dropped_and_the_whole_chain_verified(
    subject, fence, path
):
    op = steps(subject, fence, 4)  # the run's mark stands at #7
    checkpoints(subject).filter(seq=7).update(link="0" * 64)
    with pytest.raises(api.ChainBroken, match="broken at #7"):
        step(subject, fence, op)
    assert incident_of(subject).position == 7


def test_a_tampered_old_checkpoint_is_found_when_an_operator_confirms_an_effect(
    subject, fence, path, requester, approver
):
    op = steps(subject, fence, 4)
    api.operation_observe(key=op.key, state="outcome_unknown", fence=fence)
    tamper(subject, 2)  # before the run's mark
    decision = request(op.key, requester)
    with pytest.raises(api.ChainBroken, match="checkpoint chain is broken at #2"):
        api.decision_approve(decision_id=decision.pk, approved_by=approver)
    assert incident_of(subject).position == 2
    assert Operation.objects.get(key=op.key).state == "outcome_unknown"


def test_a_tampered_old_checkpoint_is_found_by_recovery_verify(subject, fence, path):
    op = steps(subject, fence, 4)
    tamper(subject, 2)
    step(subject, fence, op)
    with pytest.raises(SystemExit):
        call_command("recovery_verify", "--subject", str(subject), stdout=(out := StringIO()))
    assert "#2" in out.getvalue()
    assert incident_of(subject).position == 2
    assert not api.chain_verify(subject).ok  # the desk's and the API's verification too


def test_an_instance_of_many_steps_verifies_each_checkpoint_a_bounded_number_of_times(verified):
    instance = drive(start(linear(*(action(f"a{n}") for n in range(25)))))
    assert instance.status == InstanceStatus.COMPLETED
    length = api.subject_revision(api.Subject("govflow.instance", str(instance.pk)))
    # Verifying the whole chain at every success would be ~length²/4 (2,500 here).
    assert len(verified) <= 3 * length, (len(verified), length)
