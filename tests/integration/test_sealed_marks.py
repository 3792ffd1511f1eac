"""A run that leaves its instance going on seals its verified chain mark; the next run
verifies the chain from the seal on instead of whole (ADR 0066). Both databases.

An instance that waits and resumes many times (timers, messages, people) starts a new run
each time, and a new run has no mark of its own: its first dispatch read and verified the
whole chain, so the cost of a resume grew with the instance's length. Here a long instance
runs two steps per run, and each run's first dispatch is measured by the checkpoints it
read. A seal nobody but GovFlow could have written is trusted; any other is ignored; a
break after the seal stops the run; a break before it is found at the instance's end.
"""

from __future__ import annotations

import logging

import pytest
from django.db import connection

from govflow.engine.models import Instance, InstanceStatus, Token
from govflow.engine.provider import Pending
from govflow.engine.services.runtime import instance_run
from recovery import api, chain
from recovery.models import Checkpoint, IntegrityIncident, Operation, StoredMark
from recovery.services import stored_marks
from tests.engine_helpers import make_due
from tests.flows import action, linear, start
from tests.providers.alpha import effects

pytestmark = pytest.mark.django_db(transaction=True)

STEPS = 40
EVERY = 8  # STORE_AFTER for these tests: a seal every few runs


@pytest.fixture(autouse=True)
def _short_runs(settings, monkeypatch):
    settings.GOVFLOW_MAX_STEPS_PER_RUN = 2
    monkeypatch.setattr(stored_marks, "STORE_AFTER", EVERY)


@pytest.fixture
def reads(monkeypatch):
    """The checkpoints each first dispatch read from a seal on (or whole, without one)."""
    seen: list[int] = []
    load_sealed = chain.load_sealed

    def counted(cursor, subject):
        row, checkpoints, operations = load_sealed(cursor, subject)
        seen.append(len(checkpoints))
        return row, checkpoints, operations

    monkeypatch.setattr(chain, "load_sealed", counted)
    return seen


@pytest.fixture
def whole_reads(monkeypatch):
    """The checkpoints read by every read of a chain from its start."""
    seen: list[int] = []
    load_checkpoints = chain.load_checkpoints

    def counted(cursor, subject, since=0):
        checkpoints = load_checkpoints(cursor, subject, since)
        if not since:
            seen.append(len(checkpoints))
        return checkpoints

    monkeypatch.setattr(chain, "load_checkpoints", counted)
    return seen


def long_instance() -> Instance:
    return start(linear(*(action(f"s{i}") for i in range(1, STEPS + 1))))


def run_once(instance: Instance) -> Instance:
    instance_run(instance_id=instance.pk)
    instance.refresh_from_db()
    return instance


def run_until(instance: Instance, seq: int) -> None:
    """Run until the chain is longer than ``seq`` (the instance still going on)."""
    while length(instance) <= seq:
        assert run_once(instance).status == InstanceStatus.RUNNING


def length(instance: Instance) -> int:
    return Checkpoint.objects.filter(subject_id=str(instance.pk)).count()


def seal_of(instance: Instance) -> StoredMark:
    return StoredMark.objects.get(subject_type="govflow.instance", subject_id=str(instance.pk))


def subject_of(instance: Instance) -> api.Subject:
    return api.Subject("govflow.instance", str(instance.pk))


def tamper(instance: Instance, seq: int) -> None:
    rows = Checkpoint.objects.filter(subject_id=str(instance.pk), seq=seq)
    rows.update(fact=rows.get().fact.replace('"', "'", 1))


def test_a_resumed_run_reads_the_chain_from_the_seal_not_whole(reads):
    instance = long_instance()
    runs = 0
    while run_once(instance).status == InstanceStatus.RUNNING:
        runs += 1
        assert runs < STEPS * 2
    assert instance.status == InstanceStatus.COMPLETED
    whole = length(instance)
    assert whole > 4 * EVERY
    seal = seal_of(instance)
    assert whole - seal.seq <= EVERY + 12  # sealed again as the chain grew
    # Every first dispatch once the chain is past the first seal read the checkpoints from
    # a seal on: a bounded number, whatever the chain's length.
    assert len(reads) >= STEPS // 2
    assert max(reads[len(reads) // 3 :]) <= 2 * EVERY + 12, reads
    assert api.chain_verify(subject_of(instance)).ok


def test_a_seal_that_does_not_verify_is_ignored_and_the_chain_read_whole(
    reads, whole_reads, caplog
):
    instance = long_instance()
    run_until(instance, 3 * EVERY)
    # Forged: its MAC made without the key, claiming a position past the chain's end.
    StoredMark.objects.filter(pk=seal_of(instance).pk).update(mac="0" * 64, seq=10**9)
    whole = length(instance)
    whole_reads.clear()
    with caplog.at_level(logging.WARNING, logger=stored_marks.__name__):
        assert run_once(instance).status == InstanceStatus.RUNNING
    assert whole_reads and whole_reads[0] >= whole  # the tail first, then everything
    assert "does not verify" in caplog.text
    assert not IntegrityIncident.objects.filter(subject_id=str(instance.pk)).exists()
    # That run verified the whole chain: it sealed again, over the forgery.
    seal = seal_of(instance)
    assert seal.seq < length(instance)
    assert (
        chain.unseal(
            subject_of(instance), chain.Seal(seal.seq, seal.link, seal.ops, seal.key_id, seal.mac)
        )
        is not None
    )


def test_a_seal_copied_from_another_instance_is_ignored(whole_reads, caplog):
    first, second = long_instance(), long_instance()
    run_until(first, 3 * EVERY)
    run_until(second, EVERY)
    StoredMark.objects.filter(subject_id=str(second.pk)).delete()
    copied = seal_of(first)
    copied.pk, copied.subject_id = None, str(second.pk)
    copied.save()
    whole, before = length(second), len(whole_reads)
    assert run_once(second).status == InstanceStatus.RUNNING
    assert whole_reads[before] >= whole  # read whole: the copy vouched for nothing
    assert "does not verify" in caplog.text


def test_a_break_after_the_seal_stops_the_resumed_run(reads):
    instance = long_instance()
    run_until(instance, 3 * EVERY)
    position = seal_of(instance).seq + 1
    run_until(instance, position)  # the checkpoint after the seal exists
    tamper(instance, position)
    assert run_once(instance).status == InstanceStatus.BLOCKED
    incident = IntegrityIncident.objects.get(subject_id=str(instance.pk), status="open")
    assert incident.position == position, incident.reason


def test_a_rewritten_sealed_checkpoint_sends_the_run_to_the_whole_chain(reads):
    instance = long_instance()
    run_until(instance, 3 * EVERY)
    position = seal_of(instance).seq
    Checkpoint.objects.filter(subject_id=str(instance.pk), seq=position).update(link="f" * 64)
    assert run_once(instance).status == InstanceStatus.BLOCKED
    incident = IntegrityIncident.objects.get(subject_id=str(instance.pk), status="open")
    assert incident.position == position, incident.reason


def test_a_break_before_the_seal_is_found_at_the_instances_end(reads):
    """What a seal gives up, as a run's own mark does (ADR 0034): a checkpoint before the
    seal changed between two runs is not read by the next run, and is found by the
    instance's whole-chain verification at its end (ADR 0038), which refuses the end."""
    instance = long_instance()
    run_until(instance, 3 * EVERY)
    tamper(instance, 2)
    while run_once(instance).status == InstanceStatus.RUNNING:
        pass
    assert instance.status == InstanceStatus.BLOCKED
    incident = IntegrityIncident.objects.get(subject_id=str(instance.pk), status="open")
    assert incident.position == 2, incident.reason


@pytest.fixture
def whole_verifications(monkeypatch):
    """How many times a chain was replayed whole (``chain.verify_marking``), and from a
    mark (``chain.verify_tail``): a list of "whole" and "tail", in order."""
    seen: list[str] = []
    for name, kind in (("verify_marking", "whole"), ("verify_tail", "tail")):
        real = getattr(chain, name)

        def spied(*args, _real=real, _kind=kind, **kwargs):
            seen.append(_kind)
            return _real(*args, **kwargs)

        monkeypatch.setattr(chain, name, spied)
    return seen


def pending_at(step: int) -> None:
    """Step ``step`` of :func:`long_instance` answers ``Pending`` (its poll, a success)."""
    effects.SCRIPT["alpha.write"] = [None] * (step - 1) + [Pending(poll_after=60)]


def run_to_the_poll(instance: Instance, step: int) -> Token:
    """Run until step ``step`` answered ``Pending``; then make its poll due."""
    while run_once(instance).status == InstanceStatus.RUNNING:
        pass
    assert instance.status == InstanceStatus.WAITING, instance.reason
    assert Operation.objects.get(subject_id=str(instance.pk), state="pending")
    token = Token.objects.get(instance=instance, node_id=f"s{step}")
    assert token.not_before is not None, token
    make_due(token)
    return token


def test_a_run_that_begins_with_a_polls_success_verifies_from_the_seal(whole_verifications):
    """ADR 0066 amended: a run whose first ledger write is a success (a polled step's
    answer) has no mark of its own; on PostgreSQL it verifies from its subject's seal, read
    in the success's own statement, not the whole chain, so a resumed poll's cost does not
    grow with the instance. SQLite (in-process reads) still verifies such a run's first
    success whole."""
    pending_at(30)
    instance = long_instance()
    run_to_the_poll(instance, 30)
    assert seal_of(instance).seq > 2 * EVERY
    whole_verifications.clear()
    run_once(instance)
    first = "tail" if connection.vendor == "postgresql" else "whole"
    assert whole_verifications[:1] == [first], whole_verifications
    assert whole_verifications[1:] == ["tail"] * (len(whole_verifications) - 1)
    assert Token.objects.get(instance=instance, node_id="s30").state == "completed"
    assert api.chain_verify(subject_of(instance)).ok


def test_a_polls_success_that_ends_the_instance_still_verifies_the_whole_chain(
    whole_verifications,
):
    """The instance's end verifies its whole chain (ADR 0038), not from the seal: a
    checkpoint before the seal changed while the step waited is found, and the end is
    refused."""
    pending_at(STEPS)
    instance = long_instance()
    run_to_the_poll(instance, STEPS)
    assert seal_of(instance).seq > 2 * EVERY
    tamper(instance, 2)
    whole_verifications.clear()
    assert run_once(instance).status == InstanceStatus.BLOCKED
    assert whole_verifications == ["whole"], whole_verifications
    incident = IntegrityIncident.objects.get(subject_id=str(instance.pk), status="open")
    assert incident.position == 2, incident.reason


def test_a_forged_seal_before_a_polls_success_is_ignored_and_the_chain_verified_whole(
    whole_verifications, caplog
):
    pending_at(30)
    instance = long_instance()
    run_to_the_poll(instance, 30)
    StoredMark.objects.filter(pk=seal_of(instance).pk).update(mac="0" * 64)
    whole_verifications.clear()
    with caplog.at_level(logging.WARNING, logger=stored_marks.__name__):
        assert run_once(instance).status == InstanceStatus.RUNNING
    assert whole_verifications[:1] == ["whole"], whole_verifications
    assert ("does not verify" in caplog.text) == (connection.vendor == "postgresql")
    assert not IntegrityIncident.objects.filter(subject_id=str(instance.pk)).exists()
    assert Token.objects.get(instance=instance, node_id="s30").state == "completed"
