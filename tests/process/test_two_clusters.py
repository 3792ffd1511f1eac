"""Two real clusters on one queue, every task delivered three times: exactly-once transitions.

django-q2 delivers at least once and several clusters may run at once (DESIGN.md §7).
Correctness must come from the engine's lease and fence alone: every instance completes,
no step transition happens twice, no instance is lost, every chain verifies, and the
external store sees exactly one effect per (instance, step).
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict

import pytest

from govflow.engine.models import Instance, InstanceStatus, Token, TokenState
from govflow.engine.queue import ADVANCE, instances_mark_runnable
from govflow.engine.services.definitions import definition_publish
from govflow.engine.services.instances import instance_start
from recovery.api import OperationState, chain_verify
from recovery.models import Operation
from tests.flows import action, linear

from .support import (
    STOPPED,
    SUBJECT_TYPE,
    dump,
    failed_tasks,
    store_rows,
    subject_of,
    wait_for,
    wait_queue_drained,
)

pytestmark = pytest.mark.django_db(transaction=True)

INSTANCES = 200
STEPS = ("a", "b")

# Steps are short here, and nothing is killed: a normal lease keeps a worker that is
# slowed down by the load from losing its lease mid-step (which would rightly make that
# step outcome_unknown). The sweeper's lease stays short so a second cluster's start-up
# sweep does not hold a worker for long.
BUSY = {
    "GOVFLOW_LEASE_TTL": "30",
    "GOVFLOW_SWEEP_FULL_EVERY": "2",
    "GOVFLOW_Q_WORKERS": "2",
}


def test_two_clusters_and_triple_deliveries_complete_every_instance_exactly_once(workspace):
    ws = workspace
    definition = definition_publish(
        document=linear(*(action(step) for step in STEPS), key="proc.two_clusters")
    )
    ids = []
    for n in range(INSTANCES):
        pk = instance_start(definition=definition, variables={"value": f"i{n}"}).pk
        ids.append(pk)
        # Each instance's task is delivered twice more, as a broker may redeliver; side
        # by side in the queue, so the copies often run at the same time.
        instances_mark_runnable([pk])
        instances_mark_runnable([pk])

    started = time.monotonic()
    clusters = [ws.start_cluster(**BUSY), ws.start_cluster(**BUSY)]

    def unfinished() -> list[int]:
        stopped = list(
            Instance.objects.filter(pk__in=ids, status__in=STOPPED).values_list("pk", flat=True)
        )
        if stopped:  # nothing here may need an operator: fail now, not at the timeout
            raise AssertionError(
                f"{len(stopped)} instances stopped\n" + "\n".join(dump(pk) for pk in stopped[:3])
            )
        return list(
            Instance.objects.filter(pk__in=ids)
            .exclude(status=InstanceStatus.COMPLETED)
            .values_list("pk", flat=True)
        )

    def explain() -> str:
        ws.watch(*unfinished()[:3])
        return ws.report(limit=3)

    wait_for(
        lambda: not unfinished(),
        timeout=180,
        interval=0.5,
        what=f"all {INSTANCES} instances to complete",
        explain=explain,
    )
    elapsed = time.monotonic() - started
    # Let every duplicate delivery run before counting what happened.
    wait_queue_drained(ws, timeout=120)
    drained = time.monotonic() - started
    assert all(c.alive() for c in clusters), ws.report()

    # 0 lost instances, 0 duplicate transitions: per instance exactly one token per node
    # (reaching the end node completes the instance without a token), each completed
    # once, at distinct ordinals.
    nodes = ["start", *STEPS]
    tokens: dict[int, list[tuple]] = defaultdict(list)
    for row in (
        Token.objects.filter(instance_id__in=ids)
        .order_by("instance_id", "ordinal")
        .values_list("instance_id", "ordinal", "node_id", "state")
    ):
        tokens[row[0]].append(row[1:])
    bad = [
        pk
        for pk in ids
        if [n for _, n, _ in tokens[pk]] != nodes
        or {s for _, _, s in tokens[pk]} != {TokenState.COMPLETED}
        or len({o for o, _, _ in tokens[pk]}) != len(nodes)
    ]
    assert not bad, f"{len(bad)} instances with wrong tokens\n" + "\n".join(
        dump(pk) for pk in bad[:3]
    )

    # Each step has exactly one ledger operation, and it succeeded.
    operations = Counter(
        Operation.objects.filter(
            subject_type=SUBJECT_TYPE, subject_id__in=[str(pk) for pk in ids]
        ).values_list("subject_id", "step_id", "state")
    )
    expected = Counter(
        {(str(pk), step, OperationState.SUCCEEDED): 1 for pk in ids for step in STEPS}
    )
    extra = operations - expected
    missing = expected - operations
    assert not extra and not missing, (
        f"unexpected operations: {list(extra.items())[:5]}; missing: "
        f"{list(missing.items())[:5]}\n"
        + "\n".join(dump(int(k[0])) for k in list((extra + missing).keys())[:3])
    )

    # Every chain verifies.
    broken = [str(v) for v in (chain_verify(subject_of(pk)) for pk in ids) if not v.ok]
    assert not broken, broken[:5]

    # The external store saw exactly one effect per (instance, step), under the key the
    # engine gave the step, called exactly once (no redelivery reached the provider).
    keys = dict(
        Token.objects.filter(instance_id__in=ids, node_id__in=STEPS).values_list(
            "idempotency_key", "instance_id"
        )
    )
    assert len(keys) == INSTANCES * len(STEPS)
    store = store_rows("SELECT key, data, calls FROM effects")
    assert len(store) == INSTANCES * len(STEPS), len(store)
    assert {key for key, _, _ in store} == set(keys)
    assert all(calls == 1 for _, _, calls in store), [r for r in store if r[2] != 1][:5]
    values = dict(Instance.objects.filter(pk__in=ids).values_list("pk", "variables__value"))
    assert all(f'"value": "{values[keys[key]]}"' in data for key, data, _ in store)
    assert store_rows("SELECT COUNT(*) FROM calls") == [(INSTANCES * len(STEPS),)]

    assert failed_tasks() == []

    # Both clusters took part, and the duplicate deliveries were turned away or found
    # nothing left to do.
    per_cluster = [c.tasks_processed(ADVANCE) for c in clusters]
    assert all(n > 0 for n in per_cluster), per_cluster
    # Instance runs store no success row (their task says save=False): the logs say how
    # many deliveries found the instance lease held by the other cluster.
    held = sum(
        c.log_path.read_text(errors="replace").count("lease held by another worker")
        for c in clusters
    )
    print(
        f"\n[{INSTANCES} instances x {len(STEPS)} steps completed in {elapsed:.1f} s, queue "
        f"drained in {drained:.1f} s; advance tasks per cluster {per_cluster}; {held} "
        "found the lease held by the other cluster]"
    )
