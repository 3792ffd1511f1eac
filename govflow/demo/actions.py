"""The demo module's actions: a building-permit procedure, one action per recovery mode.

========================================  ==================  ===============================
action                                    recovery mode       effect
========================================  ==================  ===============================
``demo.register_application``             non_atomic          municipal registry (own file)
``demo.collect_fee``                      non_atomic, pending payment request, paid later
``demo.record_decision_note``             atomic              a row in the engine's database
``demo.restore_parcel_snapshot``          snapshot_restore    registry, needs ``backup_ref``
``demo.issue_permit``                     irreversible        registry, needs ``approval_ref``
``demo.refund_fee``                       non_atomic          refund (compensates the fee)
========================================  ==================  ===============================

The fee action lives in :mod:`.fees` and its refund in :mod:`.refunds`; ``ALL`` lists all six.
Providers import :mod:`govflow.engine.provider` only; the registry is :mod:`.store`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from govflow.engine.provider import (
    ActionContext,
    ActionDefinition,
    Failed,
    Result,
    Succeeded,
    Unknown,
    VerificationCheck,
)

from . import schemas, store
from .fees import collect_fee
from .refunds import refund_fee
from .schemas import NOTE_KINDS, TEXT, object_schema

_schema = object_schema


# -- demo.register_application (non_atomic) --------------------------------------------


def _register_preview(data: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "summary": (
            f"Register the building-permit application of {data['applicant_name']} "
            f"for parcel {data['parcel_id']} ({data['address']}) in the municipal "
            "registry."
        ),
        "system": "municipal registry (demo)",
        "writes": {
            "table": "applications",
            "applicant": data["applicant_name"],
            "parcel_id": data["parcel_id"],
            "project": data["project"],
            "floor_area_m2": data["floor_area_m2"],
        },
        "if_repeated": "the registry returns the first registration; nothing is duplicated",
    }


def _register_execute(context: ActionContext) -> Result:
    data = dict(context.input)
    record = store.application_register(
        key=context.idempotency_key,
        applicant=data["applicant_name"],
        parcel_id=data["parcel_id"],
        data=data,
    )
    return _registered(record)


def _registered(record: Mapping[str, Any]) -> Succeeded:
    return Succeeded(
        {"application_id": record["application_id"], "registered_at": record["registered_at"]}
    )


def _register_reconcile(context: ActionContext) -> Result:
    record = store.application_find(context.idempotency_key)
    if record is None:
        return Unknown("the registry holds no application under this idempotency key")
    return _registered(record)


register_application = ActionDefinition(
    name="demo.register_application",
    recovery_mode="non_atomic",
    title="Register the application in the municipal registry",
    input_schema=_schema(
        {
            "applicant_name": TEXT,
            "applicant_email": TEXT,
            "parcel_id": TEXT,
            "address": TEXT,
            "project": {"type": "string", "minLength": 1, "maxLength": 1000},
            "floor_area_m2": {"type": "integer", "minimum": 1, "maximum": 100000},
        }
    ),
    output_schema=schemas.REGISTERED,
    preview=_register_preview,
    execute=_register_execute,
    reconcile=_register_reconcile,
    checks=(
        VerificationCheck(
            "registry-search",
            "Search the municipal registry for the applicant's parcel and today's date. An "
            "application registered by this step names the applicant and the parcel shown "
            "in the preview.",
            automatic=lambda c: store.finding(
                store.application_find(c.idempotency_key),
                "Found {application_id}, registered at {registered_at}, under this step's key.",
                "No application in the registry carries this step's idempotency key.",
            ),
        ),
        VerificationCheck(
            "no-duplicate",
            "Make sure the parcel has no second application from the same applicant on the "
            "same day: if it has, record which registration number this step produced.",
        ),
    ),
    retry_budget=3,
    retry_backoff=2.0,
)


# -- demo.record_decision_note (atomic) ------------------------------------------------


def _note_preview(data: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "summary": f"Add a '{data['kind']}' note to the case file of {data['subject']}.",
        "system": "GovFlow database (same transaction as the step)",
        "writes": {
            "table": "govflow_demo_decisionnote",
            "subject": data["subject"],
            "kind": data["kind"],
            "text": data["text"],
        },
    }


def _note_execute(context: ActionContext) -> Result:
    from .models import DecisionNote

    note, _ = DecisionNote.objects.get_or_create(
        idempotency_key=context.idempotency_key,
        defaults={
            "instance_id": context.instance_id,
            "step_id": context.step_id,
            "subject": context.input["subject"],
            "kind": context.input["kind"],
            "text": context.input["text"],
        },
    )
    return Succeeded({"note_id": note.pk, "kind": note.kind})


record_decision_note = ActionDefinition(
    name="demo.record_decision_note",
    recovery_mode="atomic",
    title="Record a note in the case file",
    input_schema=_schema(
        {
            "subject": TEXT,
            "kind": {"enum": NOTE_KINDS},
            "text": {"type": "string", "minLength": 1, "maxLength": 4000},
        }
    ),
    output_schema=schemas.NOTED,
    preview=_note_preview,
    execute=_note_execute,
)


# -- demo.restore_parcel_snapshot (snapshot_restore) -----------------------------------


def _restore_preview(data: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "summary": (
            f"Restore the registry record of parcel {data['parcel_id']} from the "
            f"pinned snapshot, because: {data['reason']}"
        ),
        "system": "municipal registry (demo)",
        "writes": {"table": "parcel_restorations", "parcel_id": data["parcel_id"]},
        "overwrites": "every change to the parcel record made after the snapshot",
    }


def _restore_execute(context: ActionContext) -> Result:
    if not context.backup_ref:
        return Failed(
            "no backup reference is pinned on this step; nothing was restored", permanent=True
        )
    record = store.parcel_restore(
        key=context.idempotency_key,
        parcel_id=context.input["parcel_id"],
        backup_ref=context.backup_ref,
        reason=context.input["reason"],
    )
    return _restored(record)


def _restored(record: Mapping[str, Any]) -> Succeeded:
    return Succeeded(
        {
            "parcel_id": record["parcel_id"],
            "restored_from": record["backup_ref"],
            "restored_at": record["restored_at"],
        }
    )


def _restore_reconcile(context: ActionContext) -> Result:
    record = store.restoration_find(context.idempotency_key)
    return (
        _restored(record)
        if record
        else Unknown("the registry holds no restoration under this idempotency key")
    )


restore_parcel_snapshot = ActionDefinition(
    name="demo.restore_parcel_snapshot",
    recovery_mode="snapshot_restore",
    title="Restore a parcel record from a registry snapshot",
    input_schema=_schema(
        {"parcel_id": TEXT, "reason": {"type": "string", "minLength": 1, "maxLength": 1000}}
    ),
    output_schema=schemas.RESTORED,
    preview=_restore_preview,
    execute=_restore_execute,
    reconcile=_restore_reconcile,
    checks=(
        VerificationCheck(
            "parcel-history",
            "Open the parcel's history in the municipal registry and check whether its "
            "latest entry is a restoration from the snapshot this step pins.",
            automatic=lambda c: store.finding(
                store.restoration_find(c.idempotency_key),
                "Parcel {parcel_id} was restored from {backup_ref} at {restored_at}.",
                "No restoration carries this step's idempotency key.",
            ),
        ),
    ),
)


# -- demo.issue_permit (irreversible) --------------------------------------------------


def _permit_preview(data: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "summary": (
            f"Issue the building permit for application {data['application_id']} to "
            f"{data['holder']} (parcel {data['parcel_id']}), approved by "
            f"{data['approved_by']}. A permit cannot be withdrawn by the system."
        ),
        "system": "municipal registry (demo)",
        "writes": {
            "table": "permits",
            "application_id": data["application_id"],
            "holder": data["holder"],
            "parcel_id": data["parcel_id"],
        },
        "irreversible": True,
    }


def _permit_execute(context: ActionContext) -> Result:
    if not context.approval_ref:
        return Failed(
            "no approval reference is pinned on this step; no permit was issued", permanent=True
        )
    data = context.input
    record = store.permit_issue(
        key=context.idempotency_key,
        application_id=data["application_id"],
        holder=data["holder"],
        parcel_id=data["parcel_id"],
        approval_ref=context.approval_ref,
        approved_by=data["approved_by"],
    )
    return _issued(record)


def _issued(record: Mapping[str, Any]) -> Succeeded:
    return Succeeded({"permit_number": record["permit_number"], "issued_at": record["issued_at"]})


def _permit_reconcile(context: ActionContext) -> Result:
    record = store.permit_find(context.idempotency_key)
    return (
        _issued(record)
        if record
        else Unknown("the registry holds no permit under this idempotency key")
    )


issue_permit = ActionDefinition(
    name="demo.issue_permit",
    recovery_mode="irreversible",
    title="Issue the building permit",
    input_schema=_schema(
        {"application_id": TEXT, "holder": TEXT, "parcel_id": TEXT, "approved_by": TEXT}
    ),
    output_schema=schemas.ISSUED,
    preview=_permit_preview,
    execute=_permit_execute,
    reconcile=_permit_reconcile,
    checks=(
        VerificationCheck(
            "permit-register",
            "Search the permit register for the application number; an issued permit has a "
            "number starting with PERMIT- and names the holder in the preview.",
            automatic=lambda c: store.finding(
                store.permit_find(c.idempotency_key),
                "Permit {permit_number} was issued at {issued_at} under this step's key.",
                "No permit carries this step's idempotency key.",
            ),
        ),
    ),
)

ALL = (
    register_application,
    collect_fee,
    record_decision_note,
    restore_parcel_snapshot,
    issue_permit,
    refund_fee,
)
