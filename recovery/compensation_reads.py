"""Reads of compensation intents (selectors): what the engine and the desk show and queue.

Writes are :mod:`recovery.services.compensations`; import both through ``recovery.api``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from django.db.models import Q

from .compensations import Compensation
from .db import CompiledAt
from .states import CompensationApproval, OperationState
from .subjects import Subject

__all__ = [
    "CompensationView",
    "compensation_subjects_due",
    "compensation_view",
    "compensations_of",
    "compensations_waiting",
]


@dataclass(frozen=True)
class CompensationView:
    """One intent as its owner reads it: the compensation's state is its operation's."""

    key: str
    original_key: str
    original_action: str
    step_id: str
    action: str
    state: str
    position: int
    tenant: str
    trigger: str
    approval: str
    input_fp: str
    preview_fp: str
    idempotency_fp: str
    decision_id: int | None
    bound_revision: int | None
    polls: int = 0
    """How many times its provider was polled after answering pending."""
    not_before: Any = None
    """While it is pending: when it is next polled (database time)."""

    @property
    def approved(self) -> bool:
        """Whether an approval is bound to it now (voided ones are not)."""
        return self.decision_id is not None

    @property
    def awaiting_approval(self) -> bool:
        return (
            self.state == OperationState.PREPARED
            and self.approval == CompensationApproval.OPERATOR
            and not self.approved
        )


_HALTED = [OperationState.FAILED, OperationState.OUTCOME_UNKNOWN, OperationState.EFFECT_ABSENT]
"""Where a compensation stops its saga for a person."""


def compensations_of(subject: Subject) -> list[CompensationView]:
    """The compensation intents of ``subject``, in the order they run (highest position
    first)."""
    intents = (
        Compensation.objects.filter(subject_type=subject.type, subject_id=subject.id)
        .select_related("original", "operation")
        .order_by("-position", "-pk")
    )
    return [compensation_view(intent) for intent in intents]


def compensation_view(intent: Compensation) -> CompensationView:
    operation = intent.operation
    return CompensationView(
        key=operation.key,
        original_key=intent.original.key,
        original_action=intent.original.action,
        step_id=operation.step_id,
        action=operation.action,
        state=operation.state,
        position=intent.position,
        tenant=intent.tenant,
        trigger=intent.trigger,
        approval=intent.approval,
        input_fp=operation.input_fp,
        preview_fp=operation.preview_fp,
        idempotency_fp=operation.idempotency_fp,
        decision_id=intent.decision_id,
        bound_revision=intent.bound_revision,
        polls=operation.ordinal,
        not_before=intent.not_before,
    )


def compensation_subjects_due(*, subject_type: str, now, limit: int = 500) -> list[str]:
    """The ids of subjects with a compensation that a run must take up now (reads).

    One dispatched and never answered (its holder died: a run records it unknown), one
    pending whose next poll is due (``now``, the database clock), or one prepared that may
    run (automatic, or with its approval bound), unless the subject's saga stopped at a
    failed or uncertain compensation (a person's turn). A subject's owner
    queues them again when no live lease holds them (the engine's sweep).
    """
    return _subjects_due(subject_type, limit)(now)


@functools.lru_cache(maxsize=16)
def _subjects_due(subject_type: str, limit: int) -> CompiledAt:
    """The read of :func:`compensation_subjects_due`, compiled once (the sweep asks it
    every pass)."""

    def build(now):
        mine = Compensation.objects.filter(subject_type=subject_type)
        # A saga that stopped at a failed or uncertain compensation waits for a person.
        halted = mine.filter(
            operation__state__in=[
                OperationState.FAILED,
                OperationState.OUTCOME_UNKNOWN,
                OperationState.EFFECT_ABSENT,
            ]
        ).values("subject_id")
        due = mine.filter(
            Q(operation__state=OperationState.DISPATCHED)
            | Q(operation__state=OperationState.PENDING, not_before__lte=now)
            | Q(operation__state=OperationState.PREPARED)
            & (Q(approval=CompensationApproval.AUTOMATIC) | Q(decision__isnull=False))
        ).exclude(subject_id__in=halted)
        return due.values_list("subject_id", flat=True).distinct()[:limit]

    return CompiledAt(build)


def compensations_waiting(*, subject_type: str):
    """Compensations that wait for a person, oldest first (a queryset; reads): failed,
    of unknown outcome, decided absent, or awaiting an approval."""
    return (
        Compensation.objects.filter(subject_type=subject_type)
        .filter(
            Q(
                operation__state__in=[
                    OperationState.FAILED,
                    OperationState.OUTCOME_UNKNOWN,
                    OperationState.EFFECT_ABSENT,
                ]
            )
            | Q(
                operation__state=OperationState.PREPARED,
                approval=CompensationApproval.OPERATOR,
                decision__isnull=True,
            )
        )
        .select_related("operation")
        .order_by("operation__updated_at", "pk")
    )
