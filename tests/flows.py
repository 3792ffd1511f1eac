"""Definition builders and drivers shared by engine tests."""

from __future__ import annotations

import itertools
from typing import Any

from govflow.engine.models import Instance
from govflow.engine.services.definitions import definition_publish
from govflow.engine.services.instances import instance_start
from govflow.engine.services.runtime import instance_run
from recovery import api
from recovery.models import IntegrityIncident

_versions = itertools.count(1)


def linear(
    *nodes: dict[str, Any],
    key: str = "tests.linear",
    version: int | None = None,
    variables_schema: dict | None = None,
) -> dict[str, Any]:
    """A start → nodes… → end definition."""
    all_nodes = [{"id": "start", "type": "start"}, *nodes, {"id": "end", "type": "end"}]
    ids = [n["id"] for n in all_nodes]
    document = {
        "key": key,
        "version": version or next(_versions),
        "title": "Test flow",
        "nodes": all_nodes,
        "transitions": [{"from": a, "to": b} for a, b in itertools.pairwise(ids)],
    }
    if variables_schema:
        document["variables"] = variables_schema
    return document


def action(node_id: str, name: str = "alpha.write", value: str = "value", **extra) -> dict:
    return {"id": node_id, "type": "action", "action": name, "input": {"value": value}, **extra}


def start(document: dict, variables: dict | None = None, **kwargs) -> Instance:
    definition = definition_publish(document=document)
    return instance_start(definition=definition, variables=variables or {"value": "v1"}, **kwargs)


def drive(instance: Instance, *, rounds: int = 20) -> Instance:
    """Run the instance until it stops making progress (what workers would do)."""
    for _ in range(rounds):
        report = instance_run(instance_id=instance.pk, worker="test-worker")
        if report.steps == 0 and not report.more:
            break
    instance.refresh_from_db()
    _projection_recorded(instance)
    return instance


def _projection_recorded(instance: Instance) -> None:
    """Every engine commit leaves its projection in the chain (invariant I12).

    Checked after every driven instance, so a commit path that forgets to record it fails
    the test that takes it, not a later verification in production. Tests that edit rows
    on purpose find an open integrity incident instead.
    """
    subject = api.Subject("govflow.instance", str(instance.pk))
    result = api.chain_verify(subject)
    if result.ok or "projection of" not in result.reason:
        return
    if IntegrityIncident.objects.filter(
        subject_type=subject.type, subject_id=subject.id, status="open"
    ).exists():
        return
    raise AssertionError(f"The engine left its projection unrecorded: {result}")
