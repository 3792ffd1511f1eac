"""A run's first dispatch reads and verifies the chain where it needed only the head
(ADR 0052).

``operation_record(follow=True)`` inside the caller's transaction, when the run holding the
fence has verified nothing yet: the subject's checkpoints and operations in one statement
(the head's read was one too), verified as a run's first success verifies them; a broken
chain refuses the dispatch itself, before any provider is called. Once the caller's
commit is made the run's mark covers the chain through the new checkpoint, so the run's
first chained step checks its tail inside its call (ADR 0051) instead of reading the chain
back. A rolled-back commit leaves no mark: it may have vouched for rows that are gone.
Both databases; the tail call itself is PostgreSQL's.
"""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from govflow.engine.models import InstanceStatus, Token
from govflow.engine.provider import Pending
from govflow.engine.registry import registry
from govflow.engine.services.runtime import instance_run
from recovery import api, chain
from recovery.errors import ChainBroken
from recovery.models import Checkpoint, IntegrityIncident, Operation
from recovery.services.operations import operation_record
from recovery.testing import chained_step, fingerprints, record
from tests.engine_helpers import counted, make_due
from tests.flows import action, linear, start
from tests.providers.alpha import effects

pytestmark = pytest.mark.django_db(transaction=True)

CHAIN_READ = "FROM recovery_checkpoint"


class Abandoned(Exception):
    """Raised inside a test's transaction to roll it back."""


def recorded(subject, fence, *, follow: bool):
    return operation_record(
        subject=subject,
        step_id="s1",
        action="test.notify",
        recovery_mode="non_atomic",
        nonce=f"{subject.id}:s1",
        ordinal=0,
        fence=fence,
        follow=follow,
        **fingerprints(None),
    )


def reads_of_the_chain(queries) -> int:
    return sum(CHAIN_READ in q["sql"] and "INSERT" not in q["sql"] for q in queries)


def test_a_followed_dispatch_leaves_the_mark_through_its_own_checkpoint(subject, fence):
    first = record(subject, fence)  # committed alone: someone's earlier write
    chain.mark_drop(fence)  # this run has verified nothing yet
    with transaction.atomic():
        op = recorded(subject, fence, follow=True)
        assert chain.mark_peek(fence) is None  # not before the commit is made
    mark = chain.mark_peek(fence)
    assert mark is not None and mark.head == (op.chain_seq, _link(subject, op.chain_seq))
    assert [c.seq for c in mark.written] == [op.chain_seq] and mark.seq == first.chain_seq
    # The run's first chained step then checks the tail in its call, reading nothing.
    with transaction.atomic(), CaptureQueriesContext(connection) as captured:
        chained_step(subject, fence, op)
    sent = [q["sql"] for q in captured.captured_queries]
    if connection.vendor == "postgresql":
        assert sum("recovery_tail_observe_record(" in sql for sql in sent) == 1, sent
        assert reads_of_the_chain(captured.captured_queries) == 0, sent
    assert api.chain_verify(subject).ok


def test_without_follow_only_the_head_is_read_and_no_mark_is_left(subject, fence):
    record(subject, fence)
    chain.mark_drop(fence)
    with transaction.atomic(), CaptureQueriesContext(connection) as captured:
        recorded(subject, fence, follow=False)
    assert chain.mark_peek(fence) is None
    assert reads_of_the_chain(captured.captured_queries) == 1  # the head's: LIMIT 1
    assert any("LIMIT 1" in q["sql"] for q in captured.captured_queries)


def test_a_rolled_back_commit_leaves_no_mark_over_the_rows_it_wrote(subject, fence):
    record(subject, fence)
    chain.mark_drop(fence)
    with pytest.raises(Abandoned), transaction.atomic():
        # A checkpoint of the same transaction, read and verified by the dispatch: gone
        # once the transaction rolls back, so no mark may vouch for it.
        api.projection_record(subject=subject, projection_fp="a" * 64, fence=fence)
        recorded(subject, fence, follow=True)
        raise Abandoned
    assert chain.mark_peek(fence) is None
    # The run's next dispatch reads and verifies what is stored, and finds it whole.
    with transaction.atomic():
        op = recorded(subject, fence, follow=True)
    assert chain.mark_peek(fence).head == (op.chain_seq, _link(subject, op.chain_seq))
    assert api.chain_verify(subject).ok


def test_a_broken_chain_refuses_the_followed_dispatch(subject, fence):
    record(subject, fence)
    _tamper(subject, 1)
    chain.mark_drop(fence)
    with pytest.raises(ChainBroken), transaction.atomic():
        recorded(subject, fence, follow=True)
    assert chain.mark_peek(fence) is None
    assert Operation.objects.filter(subject_id=subject.id, step_id="s1").count() == 0


def test_a_broken_chain_stops_the_instance_before_its_first_step_is_called(settings):
    write, calls = counted()
    with registry.override(write):
        instance = start(linear(action("s1"), action("s2")))
        settings.GOVFLOW_MAX_STEPS_PER_RUN = 1
        instance_run(instance_id=instance.pk)  # the start node: s1 is ready
        settings.GOVFLOW_MAX_STEPS_PER_RUN = 500
        subject = api.Subject("govflow.instance", str(instance.pk))
        _tamper(subject, 1)
        report = instance_run(instance_id=instance.pk)
    assert calls == []  # the provider was never called: the dispatch itself was refused
    assert report.status == InstanceStatus.BLOCKED
    assert Token.objects.get(instance=instance, node_id="s1").state == "ready"
    assert not Operation.objects.filter(subject_id=subject.id).exists()
    incident = IntegrityIncident.objects.get(subject_id=subject.id, status="open")
    assert incident.position == 1, incident.reason


def test_a_poll_reads_only_the_head(settings):
    """A step polled again and again reads its chain whole once, at its first dispatch,
    not at every poll: a poll's dispatch needs only the head (its outcome is usually
    ``pending``, which verifies nothing), so a long-polled step's cost does not grow with
    its chain."""
    effects.SCRIPT["alpha.write"] = [Pending(poll_after=60)]
    effects.SCRIPT["alpha.write:poll"] = [Pending(poll_after=60)] * 3
    whole = "SELECT 0, seq, kind"  # chain.load_sealed
    write, calls = counted()
    with registry.override(write):
        instance = start(linear(action("a"), action("b")))
        with CaptureQueriesContext(connection) as first:
            instance_run(instance_id=instance.pk)
        polls = []
        for _ in range(3):
            make_due(Token.objects.get(instance=instance, node_id="a"))
            with CaptureQueriesContext(connection) as captured:
                instance_run(instance_id=instance.pk)
            polls.append(sum(whole in q["sql"] for q in captured.captured_queries))
    assert [phase for phase, *_ in calls] == ["execute", "poll", "poll", "poll"]
    assert sum(whole in q["sql"] for q in first.captured_queries) == 1
    assert polls == [0, 0, 0]


def _link(subject, seq: int) -> str:
    return Checkpoint.objects.get(subject_type=subject.type, subject_id=subject.id, seq=seq).link


def _tamper(subject, seq: int) -> None:
    rows = Checkpoint.objects.filter(subject_type=subject.type, subject_id=subject.id, seq=seq)
    fact = rows.get().fact
    rows.update(fact=fact.replace('"', "'", 1) if '"' in fact else fact + " ")
