"""An instance's ending compares its whole chain instead of reading it (ADR 0076).

On PostgreSQL a run that verified its whole chain (read at its first dispatch, or found
empty) and then moved its mark only over checkpoints it wrote knows every stored row of its
chain. The success that ends the instance (ADR 0038: the whole chain verified in the
ending commit) is then one call, ``recovery_tail_observe``, that compares every stored
checkpoint and operation row of the subject with the run's, instead of reading them back
and replaying them. Anything not as written — a checkpoint or an operation row changed
during the run, a row added beside the chain — writes nothing there, and the ending reads
and verifies the whole chain as before, which refuses it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from govflow.engine.models import InstanceStatus, Token, TokenState
from govflow.engine.registry import registry
from govflow.events.models import Event
from recovery import api, chain
from recovery.chain import marks, replay, written
from recovery.models import Checkpoint, IntegrityIncident, Lease, Operation
from recovery.testing import chained_step, live_fence, new_subject, record
from tests.flows import action, drive, linear, start
from tests.providers.alpha import actions as alpha

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's one-call path"),
]


def subject_of(instance_id: int) -> api.Subject:
    return api.Subject("govflow.instance", str(instance_id))


@contextlib.contextmanager
def during(node_id: str, change):
    """``alpha.write`` that, when step ``node_id`` runs, calls ``change(subject)``: a change
    made behind the run's back, after its first verification."""

    def execute(context):
        if context.step_id == node_id:
            change(subject_of(context.instance_id))
        return alpha.write.execute(context)

    with registry.override(dataclasses.replace(alpha.write, execute=execute)):
        yield


def flow():
    return linear(action("a"), action("b"), action("c"))


def endings(captured) -> list[str]:
    return [q["sql"] for q in captured.captured_queries if "recovery_tail_observe(" in q["sql"]]


def whole_reads(captured) -> list[str]:
    """Statements that read a subject's checkpoints without a position to start from."""
    return [
        q["sql"]
        for q in captured.captured_queries
        if "FROM recovery_checkpoint c WHERE" in q["sql"] and "c.seq >=" not in q["sql"]
    ]


def refused(instance) -> IntegrityIncident:
    subject = subject_of(instance.pk)
    incident = IntegrityIncident.objects.get(
        subject_type=subject.type, subject_id=subject.id, status="open"
    )
    assert instance.status == InstanceStatus.BLOCKED
    assert instance.reason.startswith(f"Integrity incident #{incident.pk} is open")
    last = Token.objects.get(instance=instance, node_id="c")
    assert last.state == TokenState.EXECUTING
    assert Operation.objects.get(key=last.operation_key).state == "dispatched"
    return incident


def test_the_ending_compares_the_whole_chain_in_one_call_and_reads_none_of_it():
    with CaptureQueriesContext(connection) as captured:
        instance = drive(start(flow()))
    assert instance.status == InstanceStatus.COMPLETED
    assert len(endings(captured)) == 1
    assert whole_reads(captured) == []
    assert api.chain_verify(subject_of(instance.pk)).ok
    assert not IntegrityIncident.objects.exists()


def test_an_earlier_steps_operation_row_changed_during_the_run_refuses_the_completion():
    def change(subject):
        first = Token.objects.get(instance_id=int(subject.id), node_id="a")
        Operation.objects.filter(key=first.operation_key).update(result_fp="0" * 64)

    with during("c", change), CaptureQueriesContext(connection) as captured:
        instance = drive(start(flow()))
    assert len(endings(captured)) == 1  # compared, found changed, then read whole
    assert whole_reads(captured)
    refused(instance)


def test_an_old_checkpoint_changed_during_the_run_refuses_the_completion():
    def change(subject):
        rows = Checkpoint.objects.filter(subject_type=subject.type, subject_id=subject.id, seq=2)
        rows.update(fact_fp="f" * 64)

    with during("c", change):
        instance = drive(start(flow()))
    assert refused(instance).position == 2


def test_a_checkpoint_added_before_the_chain_refuses_the_completion():
    """A row at #0, where no checkpoint is: outside every position a tail starts after, but
    part of the whole chain the ending compares."""

    def change(subject):
        first = Checkpoint.objects.get(subject_type=subject.type, subject_id=subject.id, seq=1)
        first.pk, first.seq = None, 0
        first.save()

    with during("c", change):
        instance = drive(start(flow()))
    refused(instance)


def test_a_chain_longer_than_a_mark_keeps_is_read_whole_at_the_end(monkeypatch):
    monkeypatch.setattr(replay, "GENESIS_LIMIT", 3)
    monkeypatch.setattr(written, "GENESIS_LIMIT", 3)
    with CaptureQueriesContext(connection) as captured:
        instance = drive(start(flow()))
    assert instance.status == InstanceStatus.COMPLETED
    assert endings(captured) == []
    assert len(whole_reads(captured)) == 1
    assert api.chain_verify(subject_of(instance.pk)).ok


def stored_texts(subject) -> list[list[str]]:
    columns = ("seq", "kind", "fact", "fact_fp", "prev_link", "link", "key_id", "projection_fp")
    rows = Checkpoint.objects.filter(subject_type=subject.type, subject_id=subject.id)
    return [[str(v) for v in row] for row in rows.order_by("seq").values_list(*columns)]


def test_a_runs_mark_knows_its_whole_chain_as_stored_and_an_ending_compares_it():
    """What the ending compares is the run's knowledge: after a dispatch and chained steps,
    the mark's rows from the chain's beginning are the stored rows, text for text."""
    subject = new_subject()
    fence = live_fence(subject)
    op = record(subject, fence)
    for _ in range(3):
        op = chained_step(subject, fence, op)
    mark = chain.mark_peek(fence)
    written_texts = [[str(c.seq), *map(str, c.row()[3:])] for c in mark.written]
    assert [*mark.genesis, *written_texts] == stored_texts(subject)
    api.chain_mark_drop(fence=fence)  # an instance's end: the whole chain (ADR 0038)
    assert chain.mark_peek(fence) is mark  # kept: it knows the whole chain
    with CaptureQueriesContext(connection) as captured, transaction.atomic():
        done = api.operation_observe(key=op.key, state="succeeded", fence=fence, result={})
    assert done.changed and done.chain_seq == len(stored_texts(subject))
    assert len(endings(captured)) == 1 and whole_reads(captured) == []
    assert api.chain_verify(subject).ok


def completed_events(instance) -> list[Event]:
    return list(Event.objects.filter(instance_id=instance.pk, type="instance.completed"))


def test_an_ending_is_one_statement_its_event_written_and_its_lease_released():
    with CaptureQueriesContext(connection) as captured:
        instance = drive(start(flow()))
    assert instance.status == InstanceStatus.COMPLETED
    [ending] = [sql for sql in endings(captured)]
    assert 'INSERT INTO "events_event"' in ending and 'UPDATE "engine_instance"' in ending
    [event] = completed_events(instance)
    assert event.data["status"] == "completed" and event.data["previous_status"] == "running"
    lease = Lease.objects.get(key=f"instance:{instance.pk}")
    assert lease.holder is None and lease.released_at is not None
    # The run is over: nothing it kept for its chain stays in the process's memory.
    assert kept_marks(instance) == []


def kept_marks(instance) -> list[marks.Mark]:
    return [m for m in marks._marks.values() if m.subject == subject_of(instance.pk)]


def test_a_run_that_ends_waiting_keeps_no_mark_and_the_next_run_verifies_from_the_seal():
    """A run that leaves its instance waiting releases its lease: its mark (with the rows
    of its whole chain) can serve no later run, which takes a new fence, and is forgotten
    then, not when newer marks push it out. The next run verifies from the sealed mark."""
    waits = linear(action("a"), {"id": "wait", "type": "timer", "duration": "PT1H"}, action("b"))
    instance = drive(start(waits))
    assert instance.status == InstanceStatus.WAITING
    assert Lease.objects.get(key=f"instance:{instance.pk}").holder is None
    assert kept_marks(instance) == []
    Token.objects.filter(instance=instance, node_id="wait").update(state=TokenState.READY)
    with CaptureQueriesContext(connection) as captured:
        instance = drive(instance)
    assert instance.status == InstanceStatus.COMPLETED
    assert whole_reads(captured) == []  # from the seal, not the whole chain
    assert api.chain_verify(subject_of(instance.pk)).ok
    assert kept_marks(instance) == []


def test_a_lease_lapsed_before_the_ending_writes_nothing_of_it():
    """The ending's one statement is all or nothing: with the run's lease lapsed behind its
    back, neither the steps' rows, nor the success, nor the event, nor the release is
    written, and the engine goes the way a lost lease always goes."""

    def lapse(subject):
        Lease.objects.filter(key=f"instance:{subject.id}").update(
            expires_at=timezone.now() - dt.timedelta(seconds=1)
        )

    with during("c", lapse):
        instance = drive(start(flow()), rounds=1)
    assert instance.status != InstanceStatus.COMPLETED and instance.completed_at is None
    assert completed_events(instance) == []
    last = Token.objects.get(instance=instance, node_id="c")
    assert Operation.objects.get(key=last.operation_key).state != "succeeded"
    assert Lease.objects.get(key=f"instance:{instance.pk}").holder is not None
    assert api.chain_verify(subject_of(instance.pk)).ok
