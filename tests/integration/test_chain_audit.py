"""The periodic chain audit (ADR 0038): whole chains that grew, verified with the anchors.

The sweeper runs a pass at most every ``GOVFLOW_CHAIN_AUDIT_INTERVAL`` seconds. A pass
verifies at most ``GOVFLOW_CHAIN_AUDIT_SUBJECTS`` chains, each one whose chain grew since
the audit last verified it, and opens the incident ``recovery_verify`` opens for a broken
one. Its progress is a row in the database: a restart goes on where it stopped.
"""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

from govflow.engine.models import InstanceStatus
from govflow.engine.services.chain_audit import (
    chains_audit,
    chains_audit_if_due,
    chains_audit_schedule_reset,
)
from govflow.engine.services.sweep import Sweeper
from recovery import api
from recovery.chain import marks_clear
from recovery.models import ChainAudit, Checkpoint, IntegrityIncident
from recovery.testing import chained_step, live_fence, new_subject, record
from tests.flows import action, drive, linear, start

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def audit_now(settings):
    """Checkpoints are audited at once (no settling time) and the sweeper's pass is due."""
    settings.GOVFLOW_CHAIN_AUDIT_SETTLE = 0
    chains_audit_schedule_reset()
    yield
    chains_audit_schedule_reset()


def grown(subject=None, steps: int = 2):
    """A subject whose chain has a few steps (as the engine writes them)."""
    subject = subject or new_subject()
    fence = live_fence(subject, holder=f"w-{subject.id}")
    op = record(subject, fence)
    for _ in range(steps):
        op = chained_step(subject, fence, op)
    api.lease_release(fence=fence)
    return subject


def tamper(subject, seq: int = 2) -> None:
    rows = Checkpoint.objects.filter(subject_type=subject.type, subject_id=subject.id, seq=seq)
    rows.update(fact=rows.get().fact.replace('"state":', '"state" :', 1))


def audited(result) -> list:
    return [v.subject for v in result.verified]


def open_incident(subject) -> IntegrityIncident:
    return IntegrityIncident.objects.get(
        subject_type=subject.type, subject_id=subject.id, status="open"
    )


def test_a_checkpoint_tampered_after_an_instance_completed_is_found_by_the_audit():
    instance = drive(start(linear(action("a"), action("b"))))
    assert instance.status == InstanceStatus.COMPLETED
    subject = api.Subject("govflow.instance", str(instance.pk))
    tamper(subject)  # after the instance ended: no run will read this chain again
    result = chains_audit()
    assert [v.subject for v, _ in result.broken] == [subject]
    incident = open_incident(subject)
    assert incident.position == 2
    # The same incident recovery_verify opens: it finds it open and opens no second one.
    with pytest.raises(SystemExit):
        call_command("recovery_verify", "--subject", str(subject), stdout=StringIO())
    assert open_incident(subject).pk == incident.pk
    assert IntegrityIncident.objects.count() == 1


def test_an_untouched_chain_is_not_verified_again_until_it_grows():
    first, second = grown(), grown()
    assert audited(chains_audit()) == [first, second]
    assert audited(chains_audit()) == []  # nothing grew
    grown(second, steps=1)
    assert audited(chains_audit()) == [second]
    assert ChainAudit.objects.get().subjects == 3


def test_a_pass_verifies_at_most_the_configured_number_of_chains(settings):
    settings.GOVFLOW_CHAIN_AUDIT_SUBJECTS = 2
    subjects = [grown() for _ in range(5)]
    passes = [chains_audit() for _ in range(4)]
    assert [audited(p) for p in passes] == [subjects[:2], subjects[2:4], subjects[4:], []]
    assert [p.more for p in passes] == [True, True, False, False]


def test_the_audits_progress_survives_a_restart(settings):
    settings.GOVFLOW_CHAIN_AUDIT_SUBJECTS = 1
    first, second = grown(), grown()
    assert audited(chains_audit()) == [first]
    covered = ChainAudit.objects.get().checkpoint
    # A restart: nothing of the process is left (marks, the sweeper's schedule).
    marks_clear()
    chains_audit_schedule_reset()
    assert ChainAudit.objects.get().checkpoint == covered > 0
    assert audited(chains_audit()) == [second]  # it goes on, not over
    assert audited(chains_audit()) == []


def test_young_checkpoints_wait_for_a_later_pass(settings):
    settings.GOVFLOW_CHAIN_AUDIT_SETTLE = 3600
    grown()
    result = chains_audit()
    assert (audited(result), result.more, result.checkpoint) == ([], False, 0)


def test_the_sweeper_runs_the_audit_when_it_is_due_and_opens_the_incident(settings):
    subject = grown()
    tamper(subject)
    Sweeper(holder="sweeper-test").run(duration=0)
    assert open_incident(subject).position == 2
    settings.GOVFLOW_CHAIN_AUDIT_INTERVAL = 3600
    grown()
    assert chains_audit_if_due() is None  # not due again within the interval


def test_a_commit_landing_while_the_audit_reads_a_chain_is_not_taken_for_tampering(monkeypatch):
    from recovery.chain import verify

    subject = grown()
    real, raced = verify.load_checkpoints, []

    def racing(cursor, of, *args, **kwargs):
        rows = real(cursor, of, *args, **kwargs)
        if not raced:  # the engine commits a step between the audit's reads
            raced.append(grown(subject, steps=1))
        return rows

    monkeypatch.setattr(verify, "load_checkpoints", racing)
    result = chains_audit()
    assert (audited(result), result.broken) == ([subject], ())
    assert not IntegrityIncident.objects.exists()
