"""A compensation whose provider answered ``Pending``: polled, like any effect.

A pending operation never moves again (``states.TRANSITIONS``): the provider owns the
outcome, and each poll is a *new* operation carrying the same idempotency-key hash. For a
compensation that means:

1. :func:`compensation_pending` — in one commit, the compensation's dispatched operation
   is observed ``pending`` and the intent is given the time its next poll is due
   (``not_before``, by the database clock).
2. :func:`compensation_poll` — in one commit, the next poll crosses the dispatch boundary:
   a new ``cmp-`` operation (same fingerprints, the next ordinal, recorded ``dispatched``)
   and the intent moved to it. The caller then asks the provider outside any transaction
   and observes its answer on the new operation like any other (``operation_observe``):
   pending again, succeeded, failed or outcome unknown.

The intent's state is always its current operation's; an approval is not asked again for
a poll (it asks about the effect already approved and dispatched, it makes none).
"""

from __future__ import annotations

from django.db.models.expressions import RawSQL

from ..compensations import Compensation
from ..db import atomic, dialect
from ..errors import OperationNotFound, RecoveryValidationError
from ..models import Operation
from ..states import OperationState
from ..subjects import Subject
from .leases import Fence
from .operations import RecordedOperation, operation_observe, operation_record

__all__ = ["compensation_pending", "compensation_poll"]

S = OperationState


def _intent(key: str) -> Compensation:
    intent = (
        Compensation.objects.select_for_update()
        .select_related("operation", "original")
        .filter(operation__key=key)
        .first()
    )
    if intent is None:
        raise OperationNotFound(f"No compensation has operation key {key!r}.")
    return intent


def compensation_pending(
    *, key: str, fence: Fence, poll_after: float, projection_fp: str = ""
) -> RecordedOperation:
    """Observe the compensation ``key`` pending and due to be polled in ``poll_after``
    seconds (database clock), on the caller's live fence (the caller's transaction or its
    own). Raises what :func:`operation_observe` raises."""
    with atomic():
        intent = _intent(key)
        observed = operation_observe(
            key=key, state=S.PENDING, fence=fence, projection_fp=projection_fp
        )
        d = dialect()
        due = RawSQL(d.plus_seconds, [d.seconds_param(max(0.0, float(poll_after)))])
        Compensation.objects.filter(pk=intent.pk).update(not_before=due)
    return observed


def compensation_poll(*, key: str, fence: Fence, projection_fp: str = "") -> RecordedOperation:
    """Record the next poll of the pending compensation ``key`` (``dispatched``, its own
    ``cmp-`` key, the same fingerprints and idempotency-key hash, the next ordinal) and
    move the intent to it, on the caller's live fence (the caller's transaction or its
    own). Refused unless the intent's operation is ``pending``."""
    with atomic():
        intent = _intent(key)
        current = intent.operation
        if current.state != S.PENDING:
            raise RecoveryValidationError(
                f"Compensation {key} is {current.state}, not pending: only a pending "
                "compensation is polled."
            )
        ordinal = current.ordinal + 1
        recorded = operation_record(
            subject=Subject(intent.subject_type, intent.subject_id),
            step_id=current.step_id,
            action=current.action,
            recovery_mode=current.recovery_mode,
            definition_fp=current.definition_fp,
            input_fp=current.input_fp,
            preview_fp=current.preview_fp,
            access_fp=current.access_fp,
            idempotency_fp=current.idempotency_fp,
            nonce=f"compensation:{intent.original.key}:poll:{ordinal}",
            ordinal=ordinal,
            fence=fence,
            state=S.DISPATCHED,
            compensation=True,
            projection_fp=projection_fp,
        )
        Compensation.objects.filter(pk=intent.pk).update(
            operation=Operation.objects.get(key=recorded.key), not_before=None
        )
    return recorded
