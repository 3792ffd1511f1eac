"""Observations: what a provider said about an operation, kept as chained evidence.

Three kinds (``ObservationKind``): the answer of a provider's ``reconcile`` hook, the
finding of an automatic verification check, and a *late* answer — one that arrived after
the step was already ``outcome_unknown`` or decided, or under a fence that had lapsed.
Each is one row and one ``operation.observation`` checkpoint, in one commit. None of them
moves the operation: the host decides what, if anything, follows (a reconcile whose
action says the provider's word settles the step is applied through the ledger's own
moves, :func:`~recovery.services.operations.operation_observe`).

A late answer that contradicts what the ledger already holds (the provider says it failed
after the effect was confirmed, or succeeded after it was recorded absent or failed) opens
an integrity incident on the subject: two accounts of one effect cannot both be true.
"""

from __future__ import annotations

from typing import Any

from django.db import connection
from django.db.models.functions import Now

from .. import chain
from ..canonical import FingerprintKind, fingerprint_value, input_guard
from ..db import atomic
from ..errors import CanonicalError, ChainConflict, RecoveryValidationError
from ..models import Observation, ObservationKind, Operation
from ..states import OperationState
from ..subjects import Subject
from ._ledger import check_input

__all__ = ["OUTCOMES", "observation_record"]

S = OperationState
OUTCOMES = ("succeeded", "failed", "pending", "unknown", "finding")
"""What an observation says: a result's kind, or ``finding`` (a check's plain words)."""

VALUES_MAX_BYTES = 256 * 1024
APPEND_ATTEMPTS = 3

# A late answer contradicts the ledger when the ledger already holds the other account.
_CONTRADICTS = {
    "succeeded": {S.FAILED, S.EFFECT_ABSENT},
    "failed": {S.SUCCEEDED, S.EFFECT_CONFIRMED},
}


def observation_record(
    *,
    key: str,
    kind: str,
    source: str,
    outcome: str,
    values: Any = None,
    reason: str = "",
    input: Any = None,
    asked_by=None,
    applied: bool = False,
) -> Observation:
    """Keep what a provider said about operation ``key`` (its own commit, or the caller's).

    ``values`` are the output values the provider returned (or ``{"finding": …}``);
    ``reason`` its words when it failed or could not say. When ``input`` is given, its
    fingerprint must equal the recorded one (:class:`InputFingerprintMismatch`: nothing
    is recorded). ``applied`` marks a reconcile the host settles the step with. Raises
    :class:`ChainConflict` inside a caller's transaction when another writer appended
    first; on its own it tries again. A contradictory late answer opens an integrity
    incident in the same commit: the evidence and the incident it raises stand together.
    """
    fields = _admitted(kind, source, outcome, values, reason)
    input_fp = None if input is None else fingerprint_value(FingerprintKind.INPUT, input)
    outermost = not connection.in_atomic_block
    for attempt in range(1, APPEND_ATTEMPTS + 1):
        try:
            return _record(key, fields, input_fp, asked_by, applied)
        except ChainConflict:
            if not outermost or attempt == APPEND_ATTEMPTS:
                raise
    raise AssertionError("unreachable")


def _admitted(kind, source, outcome, values, reason) -> dict[str, Any]:
    if kind not in ObservationKind.values:
        raise RecoveryValidationError(
            f"Unknown observation kind {kind!r}; use one of {', '.join(ObservationKind.values)}."
        )
    if outcome not in OUTCOMES:
        raise RecoveryValidationError(
            f"Unknown outcome {outcome!r}; use one of {', '.join(OUTCOMES)}."
        )
    source = str(source or "")[:100]
    if not source:
        raise RecoveryValidationError("An observation names its source (reconcile, a check id).")
    values = {} if values is None else values
    if not isinstance(values, dict):
        raise RecoveryValidationError("An observation's values are a JSON object.")
    reason = str(reason or "")[:2000]
    try:
        input_guard({"values": values, "reason": reason}, max_bytes=VALUES_MAX_BYTES)
    except CanonicalError as exc:
        raise RecoveryValidationError(
            f"The provider's answer cannot be kept as it is: {exc}. Nothing was recorded."
        ) from None
    fp = fingerprint_value(
        FingerprintKind.RESULT, {"outcome": outcome, "values": values, "reason": reason}
    )
    return {
        "kind": str(kind),
        "source": source,
        "outcome": outcome,
        "values": values,
        "reason": reason,
        "values_fp": fp,
    }


def _record(key, fields, input_fp, asked_by, applied) -> Observation:
    with atomic():
        operation = Operation.objects.filter(key=key).first()
        if operation is None:
            raise RecoveryValidationError(f"No ledger operation has key {key!r}.")
        check_input({"key": key, "input_fp": operation.input_fp}, input_fp)
        subject = Subject(operation.subject_type, operation.subject_id)
        with connection.cursor() as cursor:
            head = chain.read_head(cursor, subject)
            observation = Observation.objects.create(
                operation=operation,
                input_fp=operation.input_fp if input_fp else "",
                asked_by=asked_by,
                applied=applied,
                chain_seq=head.seq + 1,
                observed_at=Now(),
                **fields,
            )
            fact = {
                "operation": key,
                "observation": observation.pk,
                "kind": fields["kind"],
                "source": fields["source"],
                "outcome": fields["outcome"],
                "answer_fp": fields["values_fp"],
                "input_fp": observation.input_fp,
                "by": "provider",
                "asked_by": getattr(asked_by, "pk", None),
                "applied": bool(applied),
                "ledger_state": operation.state,
            }
            chain.append(cursor, subject, head, "operation.observation", fact)
        if fields["kind"] == ObservationKind.LATE and operation.state in _CONTRADICTS.get(
            fields["outcome"], ()
        ):
            _contradiction_report(observation, operation.state)
    return observation


def _contradiction_report(observation: Observation, state: str) -> None:
    from .incidents import incident_report

    operation = observation.operation
    incident_report(
        subject=Subject(operation.subject_type, operation.subject_id),
        position=observation.chain_seq,
        reason=(
            f"A late answer of the provider ({observation.source}: {observation.outcome}) "
            f"contradicts operation {operation.key}, which the ledger holds as {state}. "
            "Two accounts of one effect cannot both be true: find out which is right "
            "(the provider's records, the decision's evidence) before anything moves on."
        ),
    )
