"""Reads of the recovery core's records, for the host application's pages and services.

Querysets and small dataclasses, never writes (HackSoft-style selectors). A host — the
engine, its operator pages, a provider's tools — reads the ledger through these, exported
by ``recovery.api``, and never through ``recovery.models``: the models are free to change
behind this door. Querysets come ordered, oldest first unless said otherwise, and with the
related rows a page shows already joined.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.db import connection
from django.db.models import BooleanField, Exists, F, OuterRef, QuerySet
from django.db.models.expressions import RawSQL
from django.db.models.functions import Now

from .models import (
    Checkpoint,
    Decision,
    EvidenceFile,
    IntegrityIncident,
    Lease,
    Observation,
    ObservationKind,
    Operation,
)
from .services.leases import Fence, fence_condition
from .states import DecisionState, IncidentStatus
from .subjects import Subject

__all__ = [
    "LeaseView",
    "OperationStanding",
    "OperationView",
    "checkpoints_of",
    "decision_awaiting_exists",
    "decision_evidence",
    "decision_get",
    "decisions_awaiting",
    "decisions_of",
    "decisions_open_of",
    "evidence_files",
    "incidents_of",
    "lease_current",
    "lease_is_live",
    "leases_held",
    "leases_live",
    "observations_of",
    "operation_get",
    "operations_of",
    "provider_findings",
]


def operations_of(subject: Subject) -> QuerySet[Operation]:
    """Every ledger operation of ``subject``, in the order they were recorded."""
    return Operation.objects.filter(subject_type=subject.type, subject_id=subject.id).order_by(
        "recorded_at", "pk"
    )


@dataclass(frozen=True)
class OperationView:
    """One ledger operation as its readers need it: where it stands, and what it was for."""

    key: str
    subject: Subject
    step_id: str
    state: str
    input_fp: str
    idempotency_fp: str


def operation_get(*, key: str) -> OperationView | None:
    """The operation with ``key``, or None when the ledger has none.

    One statement by the unique key, no model instance: the engine asks on its own paths
    (rehydration, a poll or retry of a step).
    """
    if not key:
        return None
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT key, subject_type, subject_id, step_id, state, input_fp, idempotency_fp "
            f"FROM {Operation._meta.db_table} WHERE key = %s",
            [key],
        )
        row = cursor.fetchone()
    if row is None:
        return None
    key, subject_type, subject_id, step_id, state, input_fp, idempotency_fp = row
    return OperationView(
        key=key,
        subject=Subject(subject_type, subject_id),
        step_id=step_id,
        state=state,
        input_fp=input_fp,
        idempotency_fp=idempotency_fp,
    )


def decisions_of(subject: Subject) -> QuerySet[Decision]:
    """Every decision on an operation of ``subject``, oldest first, with who and evidence."""
    return (
        Decision.objects.filter(
            operation__subject_type=subject.type, operation__subject_id=subject.id
        )
        .select_related("operation", "requested_by", "decided_by")
        .prefetch_related("evidence")
        .order_by("requested_at", "pk")
    )


def decisions_open_of(subject: Subject) -> dict[str, Decision]:
    """The decisions of ``subject`` awaiting approval, by the key of their operation."""
    open_ = decisions_of(subject).filter(state=DecisionState.REQUESTED)
    return {decision.operation.key: decision for decision in open_}


def decisions_awaiting(*, operation_keys: list[str]) -> dict[str, Decision]:
    """The decision awaiting approval of each of these operations, by operation key."""
    if not operation_keys:
        return {}
    found = Decision.objects.filter(
        operation__key__in=operation_keys, state=DecisionState.REQUESTED
    ).select_related("operation")
    return {decision.operation.key: decision for decision in found}


def decisions_requested() -> QuerySet[Decision]:
    """Every decision awaiting approval, oldest first, with its operation and requester (for
    a host's work queue, which narrows it to its own subjects)."""
    return (
        Decision.objects.filter(state=DecisionState.REQUESTED)
        .select_related("operation", "requested_by")
        .order_by("requested_at", "pk")
    )


def operation_keys_of_action(action: str) -> QuerySet[Operation]:
    """The keys of the operations of ``action``, as a subquery (``.values("key")``)."""
    return Operation.objects.filter(action=action).values("key")


@dataclass(frozen=True)
class OperationStanding:
    """Where one operation stands now: what a batch preview binds itself to."""

    key: str
    action: str
    state: str
    revision: int
    awaiting_decision: bool


def operations_standing(keys: Iterable[str]) -> dict[str, OperationStanding]:
    """The state and ledger revision of each operation in ``keys``, by key (one query);
    keys the ledger does not have are left out."""
    rows = (
        Operation.objects.filter(key__in=list(keys))
        .annotate(awaiting=decision_awaiting_exists(OuterRef("key")))
        .values_list("key", "action", "state", "revision", "awaiting")
    )
    return {row[0]: OperationStanding(*row) for row in rows}


def decision_awaiting_exists(operation_key: Any) -> Exists:
    """A subquery expression: a decision awaits approval for ``operation_key`` (an
    ``OuterRef`` or a value), for filtering the caller's own querysets."""
    return Exists(
        Decision.objects.filter(operation__key=operation_key, state=DecisionState.REQUESTED)
    )


def decision_get(*, decision_id: int, subject: Subject | None = None) -> Decision | None:
    """The decision ``decision_id`` with its operation, or None.

    With ``subject``, a decision on another subject's operation is None too: a page of one
    subject never acts on another's decision.
    """
    decisions = Decision.objects.select_related("operation").filter(pk=decision_id)
    if subject is not None:
        decisions = decisions.filter(
            operation__subject_type=subject.type, operation__subject_id=subject.id
        )
    return decisions.first()


def decision_evidence(decision: Decision) -> list[EvidenceFile]:
    """The evidence files of ``decision``, in the order they were stored."""
    return sorted(decision.evidence.all(), key=lambda f: f.pk)


def evidence_files(*, ids) -> QuerySet[EvidenceFile]:
    """The evidence files with these ids (for an owner that keeps their ids), by id."""
    return EvidenceFile.objects.filter(pk__in=list(ids)).order_by("pk")


def incidents_of(subject: Subject, *, open_only: bool = False) -> QuerySet[IntegrityIncident]:
    """The integrity incidents of ``subject``, newest first (open ones only, if asked)."""
    incidents = IntegrityIncident.objects.filter(
        subject_type=subject.type, subject_id=subject.id
    ).order_by("-detected_at", "-pk")
    return incidents.filter(status=IncidentStatus.OPEN) if open_only else incidents


def incidents_open() -> QuerySet[IntegrityIncident]:
    """Every open integrity incident, oldest first."""
    return IntegrityIncident.objects.filter(status=IncidentStatus.OPEN).order_by(
        "detected_at", "pk"
    )


def checkpoints_of(subject: Subject) -> QuerySet[Checkpoint]:
    """The checkpoints of ``subject``'s chain, in chain order, for display.

    Reading them proves nothing: ``chain_verify`` checks the links with the chain key.
    """
    return Checkpoint.objects.filter(subject_type=subject.type, subject_id=subject.id).order_by(
        "seq"
    )


def leases_held() -> QuerySet[Lease]:
    """Leases that have a holder (not released), live or expired."""
    return Lease.objects.filter(holder__isnull=False)


def leases_live() -> QuerySet[Lease]:
    """Leases whose holder may act now: held, and not expired by the database clock."""
    return leases_held().filter(expires_at__gt=Now())


def leases_stale() -> QuerySet[Lease]:
    """Leases still held but expired by the database clock (a holder that stopped), oldest
    expiry first."""
    return leases_held().filter(expires_at__lte=Now()).order_by("expires_at", "key")


def lease_is_live(fence: Fence) -> bool:
    """Whether ``fence`` is still the live lease of its key (by the database clock)."""
    sql, params = fence_condition(fence)
    return Lease.objects.filter(RawSQL(sql, params, output_field=BooleanField())).exists()


@dataclass(frozen=True)
class LeaseView:
    """A live lease as a reader sees it: who holds it, its fence, and time left."""

    fence: Fence
    left: dt.timedelta


def lease_current(key: str) -> LeaseView | None:
    """The live lease of ``key``, or None when nobody holds it now."""
    row = (
        leases_live()
        .filter(key=key)
        .annotate(left=F("expires_at") - Now())
        .values_list("left", "holder", "fence")
        .first()
    )
    if row is None:
        return None
    return LeaseView(fence=Fence(key=key, holder=row[1], fence=row[2]), left=row[0])


def provider_findings(operation_key: str) -> list[Observation]:
    """What the provider's reconcile and the automatic checks found about one operation.

    Newest first, with who asked (an operator's "ask now", or the engine when empty).
    Late answers are not findings: :func:`observations_of` reads every kind.
    """
    return list(
        Observation.objects.filter(
            operation__key=operation_key,
            kind__in=[ObservationKind.RECONCILE, ObservationKind.CHECK],
        )
        .select_related("asked_by")
        .order_by("-observed_at", "-pk")
    )


def observations_of(subject: Subject, *, kind: str | None = None) -> QuerySet[Observation]:
    """Every observation kept on ``subject``'s operations (of ``kind``), oldest first."""
    rows = Observation.objects.filter(
        operation__subject_type=subject.type, operation__subject_id=subject.id
    )
    if kind is not None:
        rows = rows.filter(kind=kind)
    return rows.select_related("operation", "asked_by").order_by("observed_at", "pk")
