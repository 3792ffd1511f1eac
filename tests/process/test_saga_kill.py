"""kill -9 a real ``qcluster`` while it runs a compensation, restart it, and check the saga.

A compensation crosses the same dispatch boundary as any effect. Killed after its
dispatch, it is ``outcome_unknown`` (a handoff for a person) and its provider is never
called again; killed before it, the same intent runs on restart: the same ``cmp-`` key,
the same input, one effect.
"""

from __future__ import annotations

import pytest

from govflow.engine.models import InstanceStatus
from govflow.engine.queue import instances_mark_runnable
from govflow.engine.services.definitions import definition_publish
from govflow.engine.services.instances import instance_cancel, instance_start
from recovery.api import OperationState, Subject, compensations_of
from tests.flows import action, drive, linear
from tests.providers.alpha import effects

from .support import dump, queue_mark, status, wait_for, wait_queue_drained, wait_until_sweeping
from .test_kill_restart import PARKED, retrying_conflicts, user

pytestmark = pytest.mark.django_db(transaction=True)

WAIT = {"id": "wait", "type": "timer", "duration": "PT1H"}


def charged(ws, key: str) -> int:
    """An instance that charged step a (in this process) and now waits on a long timer."""
    document = linear(action("a", "alpha.charge", compensate_on=["cancel"]), WAIT, key=key)
    instance = instance_start(
        definition=definition_publish(document=document), variables={"value": "v1"}
    )
    ws.watch(instance.pk)
    drive(instance)
    assert status(instance.pk) == InstanceStatus.WAITING, dump(instance.pk)
    return instance.pk


def the_compensation(instance_id: int):
    [intent] = compensations_of(Subject("govflow.instance", str(instance_id)))
    return intent


def undone() -> list[tuple[str, str, int]]:
    return effects.effects("alpha.undo")


def cancel(instance_id: int, operator) -> None:
    retrying_conflicts(
        lambda: instance_cancel(instance_id=instance_id, actor=operator, reason="withdrawn")
    )


def test_kill_after_a_compensations_dispatch_leaves_it_unknown_never_run_twice(
    workspace, django_user_model
):
    ws = workspace
    operator = user(django_user_model, "operator", "engine.operate_instance")
    instance_id = charged(ws, "proc.saga.after")
    ws.pause("after_effect")
    first = ws.start_cluster(**PARKED)
    cancel(instance_id, operator)  # records the intent and queues its run
    planned = the_compensation(instance_id)
    wait_for(
        lambda: len(undone()) == 1 and ws.reached("after_effect"),
        timeout=60,
        what="a worker parked after the compensation's effect",
        explain=ws.report,
    )
    assert the_compensation(instance_id).state == OperationState.DISPATCHED, dump(instance_id)
    first.kill()
    ws.unpause("after_effect")

    second = ws.start_cluster()
    wait_until_sweeping(second)
    wait_for(
        lambda: the_compensation(instance_id).state == OperationState.OUTCOME_UNKNOWN,
        timeout=60,
        what="the compensation to be outcome_unknown",
        explain=ws.report,
    )
    # More deliveries of the instance's task call nothing again.
    mark = queue_mark()
    instances_mark_runnable([instance_id])
    wait_queue_drained(ws, since=mark)
    after = the_compensation(instance_id)
    assert (after.key, after.state) == (planned.key, OperationState.OUTCOME_UNKNOWN)
    [(_key, _action, calls)] = undone()
    assert calls == 1, undone()
    assert effects.call_count("alpha.undo") == 1
    assert status(instance_id) == InstanceStatus.CANCELLED


def test_kill_before_a_compensations_dispatch_runs_the_same_intent_once(
    workspace, django_user_model
):
    ws = workspace
    operator = user(django_user_model, "operator", "engine.operate_instance")
    instance_id = charged(ws, "proc.saga.before")
    ws.pause("preview")
    first = ws.start_cluster(**PARKED)
    cancel(instance_id, operator)
    planned = the_compensation(instance_id)
    wait_for(
        lambda: ws.reached("preview"),
        timeout=60,
        what="a worker parked in the compensation's preview, before its dispatch",
        explain=ws.report,
    )
    first.kill()
    ws.unpause("preview")
    assert the_compensation(instance_id).state == OperationState.PREPARED, dump(instance_id)
    assert undone() == []

    second = ws.start_cluster()
    wait_until_sweeping(second)
    wait_for(
        lambda: the_compensation(instance_id).state == OperationState.SUCCEEDED,
        timeout=60,
        what="the compensation to succeed after the restart",
        explain=ws.report,
    )
    after = the_compensation(instance_id)
    assert (after.key, after.input_fp, after.idempotency_fp) == (
        planned.key,
        planned.input_fp,
        planned.idempotency_fp,
    )
    [(_key, _action, calls)] = undone()
    assert calls == 1, undone()
