"""Dataflow's services: start a run, publish it (its own ledger boundary), reconcile it.

The publication is an effect of this module, recorded in GovFlow's recovery ledger the
way any module provider would record one (``recovery.api`` only): a lease on the run, the
operation recorded ``dispatched`` before the catalogue is written, then the observation.
When the answer is lost, the operation is ``outcome_unknown`` and the run reports
``unknown_publication``: only :func:`run_reconcile`, which looks the catalogue up, settles
it — the workflow that linked to the run cannot.
"""

from __future__ import annotations

import logging

from django.db import transaction

from recovery import api
from recovery.api import FingerprintKind as FK
from recovery.api import OperationState as S

from .models import DataflowRun, FaultMode, FaultSwitch, Publication, RunState

__all__ = ["fault_set", "run_cancel", "run_publish", "run_reconcile", "run_start"]

log = logging.getLogger("govflow.demo.dataflow")

STEP = "publish"
ACTION = "dataflow.publish"
HOLDER = "dataflow"


class LostAnswer(Exception):
    """The demo's fault: the catalogue's answer (or the request) was lost."""


def fault_set(mode: str) -> None:
    """Set what goes wrong with the next publications ('' for nothing)."""
    if mode not in FaultMode.values:
        raise ValueError(f"unknown fault {mode!r}; use one of {FaultMode.values}")
    FaultSwitch.objects.update_or_create(pk=1, defaults={"mode": mode})


def _fault() -> str:
    switch = FaultSwitch.objects.filter(pk=1).first()
    return switch.mode if switch else ""


def run_start(*, idempotency_key: str, dataset: str, rows: int) -> DataflowRun:
    """The run for ``idempotency_key``: the existing one, or a new one published now
    (unless the fault switch holds it)."""
    run, created = DataflowRun.objects.get_or_create(
        idempotency_key=idempotency_key, defaults={"dataset": dataset, "rows": rows}
    )
    if created and _fault() != FaultMode.HOLD:
        run_publish(run_id=run.pk)
    return DataflowRun.objects.get(pk=run.pk)


def _subject(run: DataflowRun) -> api.Subject:
    return api.Subject("dataflow.run", str(run.pk))


def _record(run: DataflowRun, fence: api.Fence) -> api.RecordedOperation:
    """The publication's dispatch boundary (its own commit)."""
    payload = {"dataset": run.dataset, "rows": run.rows}
    definition_fp = api.fingerprint_value(FK.DEFINITION, {"module": "dataflow", "step": STEP})
    input_fp = api.fingerprint_value(FK.INPUT, payload)
    return api.operation_record(
        subject=_subject(run),
        step_id=STEP,
        action=ACTION,
        recovery_mode=api.RecoveryMode.NON_ATOMIC,
        definition_fp=definition_fp,
        input_fp=input_fp,
        preview_fp=api.fingerprint_value(FK.PREVIEW, {"says": f"Publish {run.dataset}"}),
        access_fp=api.fingerprint_value(FK.ACCESS_CONTEXT, {"module": "dataflow"}),
        # Its own effect, its own key: not the caller's key for the run as a whole.
        idempotency_fp=api.fingerprint_value(FK.IDEMPOTENCY_KEY, f"dataflow:{run.pk}:{STEP}"),
        nonce=f"{run.pk}:{STEP}",
        ordinal=1,
        fence=fence,
    )


def _publish_effect(run: DataflowRun, fault: str) -> Publication:
    """Write the catalogue entry (its own commit: the effect)."""
    if fault == FaultMode.LOST_REQUEST:
        raise LostAnswer("the request never reached the catalogue")
    publication, _ = Publication.objects.get_or_create(
        run=run, defaults={"catalogue_id": f"CAT-{run.pk:05d}"}
    )
    if fault == FaultMode.LOST_ANSWER:
        raise LostAnswer("the catalogue's answer was lost")
    return publication


def run_publish(*, run_id: int) -> DataflowRun:
    """Publish a running run: ledger first, then the catalogue, then the observation."""
    run = DataflowRun.objects.get(pk=run_id)
    if run.state != RunState.RUNNING:
        return run
    fence = api.lease_acquire(key=f"dataflow:run:{run.pk}", holder=HOLDER, ttl=30)
    try:
        op = _record(run, fence)
        DataflowRun.objects.filter(pk=run.pk).update(operation_key=op.key)
        fault = _fault()
        if fault == FaultMode.REJECT:
            api.operation_observe(
                key=op.key, state=S.FAILED, fence=fence, result={"code": "rejected"}
            )
            return _set(run, RunState.FAILED, "rejected")
        try:
            publication = _publish_effect(run, fault)
        except LostAnswer as exc:
            log.warning("dataflow run %s: %s; outcome unknown", run.pk, exc)
            api.operation_observe(key=op.key, state=S.OUTCOME_UNKNOWN, fence=fence)
            return _set(run, RunState.UNKNOWN_PUBLICATION, "")
        api.operation_observe(
            key=op.key, state=S.SUCCEEDED, fence=fence, result={"id": publication.catalogue_id}
        )
        return _set(run, RunState.PUBLISHED, "")
    finally:
        api.lease_release_if_held(fence=fence)


def run_reconcile(*, run_id: int) -> DataflowRun:
    """Settle an unknown publication by looking the catalogue up: this module's authority."""
    run = DataflowRun.objects.get(pk=run_id)
    if run.state != RunState.UNKNOWN_PUBLICATION:
        return run
    fence = api.lease_acquire(key=f"dataflow:run:{run.pk}", holder=HOLDER, ttl=30)
    try:
        publication = Publication.objects.filter(run=run).first()
        with transaction.atomic():
            if publication is not None:
                api.operation_observe(
                    key=run.operation_key,
                    state=S.EFFECT_CONFIRMED,
                    fence=fence,
                    result={"id": publication.catalogue_id},
                    by="dataflow.reconcile",
                )
                return _set(run, RunState.PUBLISHED, "")
            api.operation_observe(
                key=run.operation_key, state=S.EFFECT_ABSENT, fence=fence, by="dataflow.reconcile"
            )
            return _set(run, RunState.FAILED, "not_published")
    finally:
        api.lease_release_if_held(fence=fence)


def run_cancel(*, run_id: int) -> DataflowRun:
    """Stop a run that has not published; an unknown or finished one is not changed."""
    DataflowRun.objects.filter(pk=run_id, state=RunState.RUNNING).update(
        state=RunState.CANCELLED, reason_code="cancelled"
    )
    return DataflowRun.objects.get(pk=run_id)


def _set(run: DataflowRun, state: str, reason_code: str) -> DataflowRun:
    DataflowRun.objects.filter(pk=run.pk).update(state=state, reason_code=reason_code)
    run.refresh_from_db()
    return run
