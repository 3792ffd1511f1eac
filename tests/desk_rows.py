"""Rows of every kind the operator's desk lists, made directly (no engine run): fast
enough to make hundreds, for the work queue's counts, its query bound and the URL walk."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from django.utils import timezone

from govflow.engine.external_tasks import ExternalTask, TaskState
from govflow.engine.models import Definition, Incident, Instance, Timer, Token, TriggerDelivery
from govflow.engine.services.definitions import definition_publish
from recovery.models import Decision, EvidenceFile, IntegrityIncident, Lease, Operation
from tests.flows import action, linear

FP = "0" * 64
ACTION = "alpha.write"


def definitions() -> tuple[Definition, Definition]:
    """A definition calling an action, and one waiting for a permit-style approval."""
    acting = definition_publish(document=linear(action("write"), key="desk.acting", version=1))
    approving = definition_publish(
        document=linear(
            {"id": "sign", "type": "approval", "permission": "engine.operate_instance"},
            key="desk.approving",
            version=1,
        )
    )
    return acting, approving


@dataclass
class Made:
    instances: list[Instance] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)


def make_rows(tenant: str, n: int, *, requester, age: dt.timedelta = dt.timedelta(hours=2)):
    """``n`` of each: a blocked instance with a step of unknown outcome whose decision
    ``requester`` asked for, an open engine and integrity incident, a stale lease and a
    dead-lettered task; and ``n`` instances waiting for an approval. All ``age`` old."""
    acting = Definition.objects.get(key="desk.acting")
    approving = Definition.objects.get(key="desk.approving")
    at = timezone.now() - age
    stamps = {"created_at": at, "updated_at": at}
    blocked = Instance.objects.bulk_create(
        Instance(
            definition=acting,
            definition_fp=acting.fingerprint,
            tenant=tenant,
            status="blocked",
            **stamps,
        )
        for _ in range(n)
    )
    waiting = Instance.objects.bulk_create(
        Instance(
            definition=approving,
            definition_fp=approving.fingerprint,
            tenant=tenant,
            status="waiting",
            **stamps,
        )
        for _ in range(n)
    )
    unknown = Token.objects.bulk_create(
        Token(
            instance=i,
            node_id="write",
            ordinal=1,
            state="outcome_unknown",
            operation_key=f"op-{i.pk}",
            **stamps,
        )
        for i in blocked
    )
    Token.objects.bulk_create(
        Token(
            instance=i, node_id="sign", ordinal=1, state="waiting", wait_kind="approval", **stamps
        )
        for i in waiting
    )
    operations = Operation.objects.bulk_create(
        Operation(
            key=f"op-{i.pk}",
            subject_type="govflow.instance",
            subject_id=str(i.pk),
            step_id="write",
            action=ACTION,
            recovery_mode="non_atomic",
            definition_fp=FP,
            input_fp=FP,
            preview_fp=FP,
            access_fp=FP,
            idempotency_fp=FP,
            lease_key=f"instance:{i.pk}",
            fence=1,
            ordinal=1,
            state="dispatched",
            revision=1,
            chain_seq=1,
            recorded_at=at,
            updated_at=at,
        )
        for i in blocked
    )
    decisions = Decision.objects.bulk_create(
        Decision(
            operation=op,
            kind="effect_confirmed",
            rationale="Seen in the registry.",
            state="requested",
            requested_by=requester,
            requested_at=at,
        )
        for op in operations
    )
    Incident.objects.bulk_create(
        Incident(instance=i, token=t, kind="outcome_unknown", message="No answer.", created_at=at)
        for i, t in zip(blocked, unknown, strict=True)
    )
    IntegrityIncident.objects.bulk_create(
        IntegrityIncident(
            subject_type="govflow.instance",
            subject_id=str(i.pk),
            reason="A fact contradicts the chain.",
            detected_at=at,
        )
        for i in blocked
    )
    Lease.objects.bulk_create(
        Lease(
            key=f"instance:{i.pk}",
            holder="worker-gone",
            fence=1,
            acquired_at=at,
            expires_at=at + dt.timedelta(seconds=30),
        )
        for i in blocked
    )
    ExternalTask.objects.bulk_create(
        ExternalTask(
            instance=i,
            token=t,
            node_id="write",
            tenant=tenant,
            topic="desk.topic",
            state=TaskState.DEAD,
            fetchable_at=at,
            created_at=at,
            ended_at=at,
            last_error="Out of retries.",
        )
        for i, t in zip(blocked, unknown, strict=True)
    )
    return Made(instances=[*blocked, *waiting], decisions=decisions)


def detail_objects(tenant: str, *, requester) -> dict[str, int]:
    """One row of every model the admin shows a page of, for ``tenant``, by model name."""
    made = make_rows(tenant, 1, requester=requester)
    instance = made.instances[0]
    token = instance.tokens.get()
    at = timezone.now()
    timer = Timer.objects.create(instance=instance, token=token, due_at=at)
    delivery = TriggerDelivery.objects.create(
        delivery_id=f"d-{tenant}",
        tenant=tenant,
        message="m",
        correlation="c",
        received_at=at,
    )
    decision = made.decisions[0]
    evidence = EvidenceFile.objects.create(
        decision=decision,
        file="evidence/none.txt",
        fingerprint=FP,
        size=1,
        content_type="text/plain",
        name="none.txt",
        uploaded_at=at,
    )
    return {
        "instance": instance.pk,
        "token": token.pk,
        "timer": timer.pk,
        "triggerdelivery": delivery.pk,
        "incident": Incident.objects.get(instance=instance).pk,
        "operation": decision.operation_id,
        "decision": decision.pk,
        "integrityincident": IntegrityIncident.objects.get(subject_id=str(instance.pk)).pk,
        "checkpoint": None,
        "lease": f"instance:{instance.pk}",
        "evidence": evidence.pk,
    }
