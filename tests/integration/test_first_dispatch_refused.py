"""A chain found broken by a run's first dispatch dispatches nothing (ADR 0052).

A run's first dispatch chained into the start node's commit verifies the instance's chain
where it needed only its head. When that finds the chain broken, the commit rolls back and
the step is dispatched again in a commit of its own, which reads only the head: the
integrity incident is opened first, so the ledger refuses that dispatch too, and no
provider is called on a chain nobody can vouch for.
"""

from __future__ import annotations

import pytest

from govflow.engine.models import InstanceStatus, Token, TokenState
from recovery import api
from recovery.models import Checkpoint, IntegrityIncident, Operation
from tests.flows import action, drive, linear, start
from tests.providers.alpha import effects

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_chain_broken_before_the_first_run_dispatches_nothing():
    seq = 1  # the start's checkpoint: the chain a fresh instance has
    instance = start(linear(action("a"), action("b")))
    subject = api.Subject("govflow.instance", str(instance.pk))
    rows = Checkpoint.objects.filter(subject_type=subject.type, subject_id=subject.id, seq=seq)
    rows.update(fact_fp="e" * 64)
    instance = drive(instance)
    assert instance.status == InstanceStatus.BLOCKED, instance.reason
    incident = IntegrityIncident.objects.get(
        subject_type=subject.type, subject_id=subject.id, status="open"
    )
    assert incident.position == seq
    assert instance.reason.startswith(f"Integrity incident #{incident.pk} is open")
    assert not Operation.objects.filter(subject_type=subject.type, subject_id=subject.id).exists()
    assert effects.call_count() == 0
    assert Token.objects.get(instance=instance, node_id="a").state == TokenState.READY
