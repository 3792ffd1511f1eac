"""Recording a provider's answer survives a benign race on the instance's chain."""

from __future__ import annotations

import pytest

from govflow.engine.models import InstanceStatus, TokenState
from recovery import api, chain
from recovery.models import Operation
from recovery.services import _ledger, step_call, tail_observe
from tests.engine_helpers import token_of
from tests.flows import action, drive, linear, start
from tests.providers.alpha import effects

pytestmark = pytest.mark.django_db(transaction=True)


def conflicting(monkeypatch, kind: str, times: int) -> list[str]:
    """Make the next ``times`` appends of ``kind`` lose the chain's compare-and-swap, as if
    another writer (a decision requested on another step) had appended first: a checkpoint
    appended alone (``chain.append``), with its operation's move in one statement
    (PostgreSQL, ADR 0050), or by a success's call that checks its run's tail (PostgreSQL,
    ADR 0076: its answer 'chain' raises the same conflict)."""
    real_append, real_swap = chain.append, _ledger._swap_and_append
    real_tail = tail_observe.observe_in_tail
    lost = []

    def lose(appended_kind: str) -> None:
        if appended_kind == kind and len(lost) < times:
            lost.append(appended_kind)
            raise api.ChainConflict("another writer appended first")

    def append(cursor, subject, head, appended_kind, fact, *rest):
        lose(appended_kind)
        return real_append(cursor, subject, head, appended_kind, fact, *rest)

    def swap_and_append(cursor, swap, checkpoint):
        lose(checkpoint.kind)
        return real_swap(cursor, swap, checkpoint)

    def observe_in_tail(key, state, fence, **rest):
        lose("operation.observed")
        return real_tail(key, state, fence, **rest)

    monkeypatch.setattr(chain, "append", append)
    monkeypatch.setattr(_ledger, "_swap_and_append", swap_and_append)
    monkeypatch.setattr(tail_observe, "observe_in_tail", observe_in_tail)
    monkeypatch.setattr(step_call, "observe_in_tail", observe_in_tail)
    return lost


def test_an_outcome_is_recorded_again_when_the_chain_moved_meanwhile(monkeypatch):
    instance = start(linear(action("a"), action("b")))
    lost = conflicting(monkeypatch, "operation.observed", times=2)
    instance = drive(instance)
    assert len(lost) == 2
    assert instance.status == InstanceStatus.COMPLETED, instance.reason
    assert token_of(instance, "a").state == TokenState.COMPLETED
    # The provider was called once per step; nothing became outcome_unknown.
    assert len(effects.effects()) == 2
    assert set(Operation.objects.values_list("state", flat=True)) == {"succeeded"}
    assert api.chain_verify(api.Subject("govflow.instance", str(instance.pk))).ok


def test_a_chain_that_keeps_moving_ends_the_run_and_the_step_is_decided_later(monkeypatch):
    instance = start(linear(action("a")))
    conflicting(monkeypatch, "operation.observed", times=99)
    report_instance = drive(instance, rounds=1)
    # Three refused commits: the run gave up. The step stays executing with its
    # operation dispatched; the next run (rehydration) makes it outcome_unknown.
    assert token_of(report_instance, "a").state == TokenState.EXECUTING
    monkeypatch.undo()
    instance = drive(instance)
    assert token_of(instance, "a").state == TokenState.OUTCOME_UNKNOWN
    assert instance.status == InstanceStatus.BLOCKED
