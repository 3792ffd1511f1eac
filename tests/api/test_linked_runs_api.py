"""The REST API describes a linked run by its descriptor, not only in words."""

from __future__ import annotations

import pytest

from govflow.demo.dataflow import services as dataflow
from govflow.demo.dataflow.models import DataflowRun
from tests.flows import drive, start
from tests.integration.test_linked_runs import linked_doc, look

pytestmark = pytest.mark.django_db


def linked_instance(tenant: str = "north"):
    return drive(start(linked_doc(), {"dataset": "Parking 2026", "rows": 12}, tenant=tenant))


def test_an_instance_shows_its_linked_run_descriptor_and_outputs_once_concluded(key_client):
    dataflow.fault_set("hold")
    instance = look(linked_instance())
    [running] = key_client.get(f"/api/v1/instances/{instance.pk}/").json()["linked_runs"]
    run = DataflowRun.objects.get()
    assert running["node"] == "publish"
    assert running["module"] == "dataflow.publication"
    assert running["run_reference"] == run.reference
    assert (running["state"], running["conclusive"], running["outputs"]) == (
        "running",
        False,
        None,
    )
    assert running["looks"] == 1 and running["last_looked_at"] is not None

    dataflow.run_publish(run_id=run.pk)
    instance = look(instance)
    detail = key_client.get(f"/api/v1/instances/{instance.pk}/").json()
    assert detail["status"] == "completed"
    [done] = detail["linked_runs"]
    assert (done["state"], done["conclusive"]) == ("succeeded", True)
    assert done["outputs"] == {"catalogue_id": f"CAT-{run.pk:05d}", "rows": 12}
    steps = {s["id"]: s for s in detail["steps"]}
    assert steps[done["watch_step"]]["node"] == "publish"
    assert steps[done["start_step"]]["state"] == "completed"


def test_an_instance_without_linked_runs_has_an_empty_list(key_client):
    from tests.flows import action, linear

    instance = drive(start(linear(action("a")), tenant="north"))
    assert key_client.get(f"/api/v1/instances/{instance.pk}/").json()["linked_runs"] == []


def test_another_tenants_linked_run_is_not_shown(keys):
    instance = linked_instance(tenant="south")
    response = keys(tenant="north").get(f"/api/v1/instances/{instance.pk}/")
    assert response.status_code == 404
    assert "run_reference" not in response.content.decode()


def test_the_schema_describes_the_linked_run_descriptor(key_client):
    schema = key_client.get("/api/v1/schema/", HTTP_ACCEPT="application/json").json()
    descriptor = schema["components"]["schemas"]["LinkedRunDescriptor"]
    assert {"module", "run_reference", "state", "outputs", "last_looked_at"} <= set(
        descriptor["properties"]
    )
    detail = schema["components"]["schemas"]["InstanceDetail"]
    assert "linked_runs" in detail["required"]
