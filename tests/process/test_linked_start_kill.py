"""kill -9 a real ``qcluster`` while it starts a linked run, restart it, and check that
the run is found again by the same idempotency key: one run in the other module, never
two, and the workflow moves on from its conclusive descriptor."""

from __future__ import annotations

import pytest

from govflow.demo.dataflow.models import DataflowRun
from govflow.engine.models import InstanceStatus, LinkedRun, Token
from govflow.engine.services.definitions import definition_publish
from govflow.engine.services.instances import instance_start
from recovery.api import OperationState, operation_get
from tests.engine_helpers import graph, node

from .support import dump, status, wait_for, wait_until_sweeping
from .test_kill_restart import PARKED

pytestmark = pytest.mark.django_db(transaction=True)


def linked(key: str) -> dict:
    return graph(
        [
            node("start", "start"),
            node(
                "publish",
                "linked_run",
                run_provider="dataflow.publication",
                input={"dataset": "dataset", "rows": "rows"},
                output={"catalogue": "catalogue_id"},
            ),
            node("end", "end"),
        ],
        [("start", "publish"), ("publish", "end")],
        key=key,
    )


def test_kill_after_a_linked_runs_start_finds_the_same_run_again(workspace):
    ws = workspace
    ws.pause("dataflow_started")
    first = ws.start_cluster(**PARKED)
    definition = definition_publish(document=linked("proc.linked.start"))
    instance = instance_start(definition=definition, variables={"dataset": "Trees", "rows": 3})
    ws.watch(instance.pk)
    wait_for(
        lambda: ws.reached("dataflow_started"),
        timeout=60,
        what="a worker parked after Dataflow created the run, before the answer was recorded",
        explain=ws.report,
    )
    start = Token.objects.get(instance=instance, node_id="publish")
    assert operation_get(key=start.operation_key).state == OperationState.DISPATCHED
    first.kill()
    ws.unpause("dataflow_started")
    assert DataflowRun.objects.count() == 1

    second = ws.start_cluster()
    wait_until_sweeping(second)
    # Rehydration makes the start outcome_unknown; Dataflow's lookup by the same key
    # settles it; the run is watched and the workflow completes from its descriptor.
    # (Blocked meanwhile, while the start is outcome_unknown: no wait_status here.)
    wait_for(
        lambda: status(instance.pk) == InstanceStatus.COMPLETED,
        timeout=90,
        what="the instance to complete from the run's descriptor",
        explain=ws.report,
    )
    [run] = DataflowRun.objects.all()
    start.refresh_from_db()
    assert run.idempotency_key == start.idempotency_key, dump(instance.pk)
    assert operation_get(key=start.operation_key).state == OperationState.EFFECT_CONFIRMED
    link = LinkedRun.objects.get(instance=instance)
    assert (link.run_ref, link.state) == (run.reference, "succeeded")
    instance.refresh_from_db()
    assert instance.variables["catalogue"] == f"CAT-{run.pk:05d}"
