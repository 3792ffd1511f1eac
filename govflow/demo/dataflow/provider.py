"""Dataflow as a run provider: what a ``linked_run`` node starts, describes and cancels."""

from __future__ import annotations

from govflow.engine.provider import RunDescriptor, RunProvider, VerificationCheck

from . import services
from .models import DataflowRun, RunState

INPUT_SCHEMA = {
    "type": "object",
    "properties": {
        "dataset": {"type": "string", "minLength": 1, "maxLength": 200},
        "rows": {"type": "integer", "minimum": 0},
    },
    "required": ["dataset"],
    "additionalProperties": False,
}


def preview(data):
    return {"says": f"Publish the dataset {data['dataset']} in the open-data catalogue"}


def start(context) -> str:
    run = services.run_start(
        idempotency_key=context.idempotency_key,
        dataset=context.input["dataset"],
        rows=int(context.input.get("rows", 0)),
    )
    return run.reference


def _run(ref: str) -> DataflowRun:
    return DataflowRun.objects.get(pk=int(ref.removeprefix("DF-")))


def describe(ref: str) -> RunDescriptor:
    run = _run(ref)
    if run.state == RunState.PUBLISHED:
        outputs = {"catalogue_id": run.publication.catalogue_id, "rows": run.rows}
        return RunDescriptor("succeeded", outputs=outputs)
    if run.state in (RunState.FAILED, RunState.CANCELLED):
        return RunDescriptor("failed", reason_code=run.reason_code or run.state)
    if run.state == RunState.UNKNOWN_PUBLICATION:
        return RunDescriptor(
            "unknown_publication",
            note="the catalogue's answer was lost; Dataflow's reconcile will look it up",
        )
    return RunDescriptor("running")


def cancel(ref: str) -> None:
    services.run_cancel(run_id=_run(ref).pk)


def find(context) -> str | None:
    run = DataflowRun.objects.filter(idempotency_key=context.idempotency_key).first()
    return run.reference if run else None


PUBLICATION = RunProvider(
    name="dataflow.publication",
    title="Publish a dataset (Dataflow)",
    input_schema=INPUT_SCHEMA,
    preview=preview,
    start=start,
    describe=describe,
    cancel=cancel,
    find=find,
    checks=(
        VerificationCheck(
            "dataflow-runs",
            "Open Dataflow's runs and look for a run with this step's idempotency key; "
            "note its reference (DF-…) if it exists.",
        ),
    ),
    poll_backoff=2.0,
    poll_max_delay=60.0,
    poll_budget=100,
)
