"""Atomic steps share the engine's commit (I5); gated actions never dispatch unpinned (I6)."""

from __future__ import annotations

import dataclasses

import pytest
from django.db import connection

from govflow.engine.errors import InvalidRequest
from govflow.engine.models import InstanceStatus, TokenState, WaitKind
from govflow.engine.provider import Pending, Unknown
from govflow.engine.registry import registry
from govflow.engine.services import runtime
from govflow.engine.services.instances import instance_start
from govflow.engine.services.runtime import instance_run
from recovery.models import Checkpoint, Operation
from tests.engine_helpers import (
    chain_ok,
    counted,
    incidents,
    make_due,
    op_states,
    operations,
    publish,
    subject,
    token_of,
)
from tests.flows import action, drive, linear, start
from tests.providers.alpha import actions as alpha
from tests.providers.alpha import effects
from tests.providers.alpha.models import Note

pytestmark = pytest.mark.django_db


def run(instance):
    report = instance_run(instance_id=instance.pk)
    instance.refresh_from_db()
    return report


def test_atomic_step_writes_its_note_in_the_engines_transaction():
    seen = {}

    def execute(context):
        seen["in_transaction"] = connection.in_atomic_block
        # The ledger row of this very step is already visible: one transaction, not two.
        seen["operation"] = Operation.objects.filter(
            subject_id=str(context.instance_id), state="dispatched"
        ).count()
        return alpha.note.execute(context)

    with registry.override(dataclasses.replace(alpha.note, execute=execute)):
        instance = drive(start(linear(action("n", name="alpha.note"))))
    assert instance.status == InstanceStatus.COMPLETED, instance.reason
    assert seen == {"in_transaction": True, "operation": 1}
    assert list(Note.objects.values_list("instance_id", "text")) == [(instance.pk, "v1")]
    assert instance.variables["n"] == {"noted": "v1"}
    [op] = operations(instance)
    assert (op.state, op.recovery_mode) == ("succeeded", "atomic")
    assert token_of(instance, "n").operation_key == op.key
    kinds = list(
        Checkpoint.objects.filter(subject_id=subject(instance).id).values_list("kind", flat=True)
    )
    # The start commit and the start node's own commit record the projection; the atomic
    # step is one commit with its two ledger facts.
    assert kinds == ["projection", "projection", "operation.recorded", "operation.observed"]
    assert chain_ok(instance)


def test_atomic_step_that_raises_rolls_its_note_back_and_is_retried():
    effects.SCRIPT["alpha.note"] = ["raise"]
    instance = start(linear(action("n", name="alpha.note")))
    run(instance)
    token = token_of(instance, "n")
    assert not Note.objects.exists(), "the provider's write must roll back with the step"
    assert not Operation.objects.exists(), "the ledger row rolls back with it"
    assert (token.state, token.attempt, token.wait_kind) == (TokenState.READY, 1, WaitKind.RETRY)
    assert "raised RuntimeError; rolled back" in token.reason
    assert instance.status == InstanceStatus.RUNNING
    make_due(token)
    run(instance)
    assert instance.status == InstanceStatus.COMPLETED, instance.reason
    assert Note.objects.count() == 1
    assert op_states(instance) == ["succeeded"]
    assert chain_ok(instance)


@pytest.mark.parametrize("returned", [Pending(poll_after=1), Unknown("no idea"), {"noted": "v1"}])
def test_atomic_step_that_does_not_succeed_or_fail_is_rolled_back_never_unknown(returned):
    effects.SCRIPT["alpha.note"] = [returned]
    instance = start(linear(action("n", name="alpha.note")))
    run(instance)
    token = token_of(instance, "n")
    assert token.state == TokenState.READY and token.attempt == 1
    assert "an atomic action must succeed or fail" in token.reason
    assert not Note.objects.exists() and not Operation.objects.exists()
    assert instance.status != InstanceStatus.BLOCKED


def test_atomic_step_that_keeps_raising_fails_after_its_budget():
    effects.SCRIPT["alpha.note"] = ["raise"] * 3
    instance = start(linear(action("n", name="alpha.note")))
    for _ in range(3):
        run(instance)
        make_due(token_of(instance, "n"))
    assert instance.status == InstanceStatus.FAILED
    assert "retry budget of 2 exhausted" in instance.reason
    assert token_of(instance, "n").state == TokenState.FAILED
    assert not Note.objects.exists() and not Operation.objects.exists()


@pytest.mark.parametrize(
    ("name", "field", "mode"),
    [
        ("alpha.restore", "backup_ref", "snapshot_restore"),
        ("alpha.publish", "approval_ref", "irreversible"),
    ],
)
def test_gated_action_with_its_reference_dispatches_and_hands_the_reference_over(name, field, mode):
    seen = {}
    base = registry.get(name)

    def execute(context):
        seen.update(backup_ref=context.backup_ref, approval_ref=context.approval_ref)
        return base.execute(context)

    with registry.override(dataclasses.replace(base, execute=execute)):
        instance = drive(start(linear(action("a", name=name, **{field: "ref-2027-01"}))))
    assert instance.status == InstanceStatus.COMPLETED, instance.reason
    assert seen[field] == "ref-2027-01"
    [op] = operations(instance)
    assert (op.recovery_mode, op.state) == (mode, "succeeded")


@pytest.fixture
def ungated_restore():
    """A definition with an unpinned alpha.restore, published while it was not gated."""
    loose = dataclasses.replace(alpha.restore, recovery_mode="non_atomic")
    with registry.override(loose):
        definition = publish(linear(action("a", name="alpha.restore")))
        instance = instance_start(definition=definition, variables={"value": "v1"})
    return definition, instance


def test_unpinned_gated_action_blocks_its_instance_before_dispatch(ungated_restore):
    definition, instance = ungated_restore
    write, calls = counted(alpha.restore)
    with registry.override(write):
        run(instance)
    assert instance.status == InstanceStatus.BLOCKED
    assert "action 'alpha.restore' is snapshot_restore and needs a pinned 'backup_ref'" in (
        instance.reason
    )
    assert calls == [] and not Operation.objects.exists()
    with pytest.raises(InvalidRequest, match="cannot run here"):
        instance_start(definition=definition, variables={"value": "v1"})


def test_the_step_gate_itself_refuses_an_unpinned_gated_action(ungated_restore, monkeypatch):
    # Defence in depth: even if the definition checks were skipped (that it resolves, and
    # that its pinned contracts still match), the step is not dispatched.
    _, instance = ungated_restore
    monkeypatch.setattr(runtime, "unresolved_reason", lambda definition: "")
    monkeypatch.setattr(runtime, "pinned_contracts_refusal", lambda run: None)
    write, calls = counted(alpha.restore)
    with registry.override(write):
        run(instance)
    assert instance.status == InstanceStatus.BLOCKED
    assert instance.reason == (
        "Action alpha.restore is snapshot_restore and the node pins no "
        "'backup_ref'; it was not dispatched."
    )
    assert [kind for kind, _ in incidents(instance)] == ["gate"]
    assert token_of(instance, "a").state == TokenState.READY
    assert calls == [] and not Operation.objects.exists()


def test_successful_atomic_and_non_atomic_steps_mix_in_one_instance():
    instance = drive(
        start(linear(action("a"), action("n", name="alpha.note"), action("b", value="a.stored")))
    )
    assert instance.status == InstanceStatus.COMPLETED, instance.reason
    assert op_states(instance) == ["succeeded"] * 3
    assert Note.objects.count() == 1 and len(effects.effects()) == 2
    assert instance.variables["b"]["stored"] == "v1"
    assert chain_ok(instance)
