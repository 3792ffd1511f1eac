"""An instance's end verifies its whole chain (ADR 0038).

A run verifies its chain whole at its first success, then only the tail after its mark
(ADR 0034): a checkpoint older than the mark, changed *during* the run, is not read again
by that run. The commit that ends the instance (completed or failed) verifies the whole
chain once more, so no instance ends over such a change: the ending is refused whole, an
integrity incident opens, and the instance stays blocked on the desk with the provider's
answer kept. Each test runs on both ledger paths (one call per step on PostgreSQL, the
separate statements elsewhere).
"""

from __future__ import annotations

import contextlib
import dataclasses

import pytest

from govflow.engine.models import Instance, InstanceStatus, KeptAnswer, Token, TokenState
from govflow.engine.provider import Failed
from govflow.engine.registry import registry
from govflow.engine.services.instances import instance_cancel
from govflow.handoffs.services.desk import approval_decide
from recovery import api
from recovery.models import Checkpoint, IntegrityIncident, Operation
from tests.engine_helpers import user_with
from tests.flows import action, drive, linear, start
from tests.providers.alpha import actions as alpha
from tests.providers.alpha import effects

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(params=["one_call", "separate"])
def path(request):
    forced = api.multi_statement() if request.param == "separate" else contextlib.nullcontext()
    with forced:
        yield request.param


def subject_of(instance_id: int) -> api.Subject:
    return api.Subject("govflow.instance", str(instance_id))


def tamper(subject: api.Subject, seq: int) -> None:
    """Rewrite one checkpoint's fact behind the chain's back (no key: the link no longer fits)."""
    rows = Checkpoint.objects.filter(subject_type=subject.type, subject_id=subject.id, seq=seq)
    fact = rows.get().fact
    assert "dispatched" in fact or "recorded" in fact or "succeeded" in fact
    rows.update(fact=fact.replace('"state":', '"state" :', 1))


@contextlib.contextmanager
def tampering_during(node_id: str, seq: int = 2):
    """``alpha.write`` that, when step ``node_id`` runs, rewrites checkpoint #``seq`` of its
    own instance: a change made during the run, behind the run's verified mark."""

    def execute(context):
        if context.step_id == node_id:
            tamper(subject_of(context.instance_id), seq)
        return alpha.write.execute(context)

    with registry.override(dataclasses.replace(alpha.write, execute=execute)):
        yield


@pytest.fixture
def operator(django_user_model):
    return user_with(django_user_model, "operator", "engine.operate_instance")


def flow():
    return linear(action("a"), action("b"), action("c"))


def test_an_untampered_instance_completes_and_its_chain_verifies(path):
    instance = drive(start(flow()))
    assert instance.status == InstanceStatus.COMPLETED
    assert instance.completed_at is not None
    assert api.chain_verify(subject_of(instance.pk)).ok
    assert not IntegrityIncident.objects.exists()


def test_an_old_checkpoint_tampered_during_the_last_run_refuses_the_completion(path):
    with tampering_during("c"):
        instance = drive(start(flow()))
    subject = subject_of(instance.pk)
    incident = IntegrityIncident.objects.get(
        subject_type=subject.type, subject_id=subject.id, status="open"
    )
    assert incident.position == 2
    # Nothing of the ending was committed: the instance is blocked, not completed; the
    # last step is still executing and its operation dispatched (no success recorded).
    assert instance.status == InstanceStatus.BLOCKED
    assert instance.completed_at is None
    assert instance.reason.startswith(f"Integrity incident #{incident.pk} is open")
    last = Token.objects.get(instance=instance, node_id="c")
    assert last.state == TokenState.EXECUTING
    assert Operation.objects.get(key=last.operation_key).state == "dispatched"
    # The provider really answered: its answer is kept for when the incident is resolved.
    assert KeptAnswer.objects.filter(instance=instance, token=last).exists()


def test_a_failed_ending_verifies_the_whole_chain_too(path):
    effects.SCRIPT["alpha.write"] = [None, None, Failed("registry refused", permanent=True)]
    with tampering_during("c"):
        instance = drive(start(flow()))
    assert instance.status == InstanceStatus.BLOCKED
    assert instance.reason.startswith("Integrity incident #")
    assert Token.objects.get(instance=instance, node_id="c").state == TokenState.EXECUTING
    assert KeptAnswer.objects.get(instance=instance).outcome == KeptAnswer.Outcome.FAILED


def test_without_the_tamper_the_same_failure_ends_the_instance_failed(path):
    effects.SCRIPT["alpha.write"] = [None, None, Failed("registry refused", permanent=True)]
    instance = drive(start(flow()))
    assert instance.status == InstanceStatus.FAILED
    assert not IntegrityIncident.objects.exists()


def test_a_cancel_is_not_refused_by_a_broken_chain(path, operator):
    """Cancelling is how an operator stops an instance: it stays possible on a broken chain
    (the periodic audit still finds the break, ADR 0038)."""
    waiting = {"id": "wait", "type": "approval", "permission": "engine.change_instance"}
    instance = drive(start(linear(action("a"), waiting)))
    tamper(subject_of(instance.pk), 2)
    instance_cancel(instance_id=instance.pk, actor=operator, reason="withdrawn")
    assert Instance.objects.get(pk=instance.pk).status == InstanceStatus.CANCELLED


def test_an_ending_without_a_success_verifies_the_whole_chain_itself(path, operator):
    """The last run records no success (an approval leads to the end): the ending commit
    verifies the chain itself, and refuses the completion."""
    waiting = {"id": "sign", "type": "approval", "permission": "engine.operate_instance"}
    instance = drive(start(linear(action("a"), waiting)))
    assert instance.status == InstanceStatus.WAITING
    tamper(subject_of(instance.pk), 2)  # after the run that verified it
    sign = Token.objects.get(instance=instance, node_id="sign")
    approval_decide(instance_id=instance.pk, token_id=sign.pk, actor=operator, approved=True)
    instance = drive(instance)
    assert instance.status == InstanceStatus.BLOCKED
    assert instance.completed_at is None
    assert instance.reason.startswith("Integrity incident #")
    assert Token.objects.get(pk=sign.pk).state == TokenState.READY
    subject = subject_of(instance.pk)
    assert IntegrityIncident.objects.get(subject_id=subject.id, status="open").position == 2
