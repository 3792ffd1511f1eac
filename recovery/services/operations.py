"""Ledger operations: record before the effect, observe after it.

A non-atomic lifecycle is two commits:

1. :func:`operation_record` (state ``dispatched``) — the **dispatch boundary**. The
   operation row with all fingerprints and the fence, and its ``operation.recorded``
   checkpoint, commit together *before* the provider is called.
2. :func:`operation_observe` — the terminal state and its ``operation.observed``
   checkpoint commit together. A success verifies the subject's chain first (ADR 0034).

Both are conditional writes on the caller's fence. Inside a surrounding transaction they
run in a savepoint and commit with it, so the engine can commit its own projection in the
same commit; a refused write rolls back only its savepoint.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, connection

from .. import chain
from ..canonical import FingerprintKind, fingerprint_value
from ..db import atomic, dialect
from ..errors import (
    IntegrityIncidentOpen,
    LedgerDisagrees,
    OperationExists,
    RecoveryValidationError,
    StaleFence,
)
from ..keys import operation_key
from ..states import INITIAL, OperationState, RecoveryMode
from ..subjects import LEDGER_WATERMARK as LEDGER_WIDE
from ..subjects import Subject
from ._ledger import (
    INCIDENT_TABLE,
    OP_TABLE,
    SUCCESS,
    RecordedOperation,
    check_input,
    check_target,
    load_row,
    load_with_subject,
    marked_since,
    opening_incidents,
    require_live,
    transition,
    verified_head,
)
from .leases import Fence, fence_condition

__all__ = [
    "EffectOperation",
    "RecordedOperation",
    "operation_check_input",
    "operation_dispatch",
    "operation_observe",
    "operation_record",
    "operations_for_effect",
]

S = OperationState
SETTLED_FOR_A_NEW_ATTEMPT = frozenset({S.PENDING, S.FAILED, S.EFFECT_ABSENT})
"""The states an effect's earlier operations may be in when a new one is recorded for it.

Each poll of a pending provider and each retry is a new operation with the same
idempotency key; anything else — in flight, of unknown outcome, or succeeded — means a new
dispatch would guess, and the ledger refuses it (invariant I12)."""
_BLOCKING = tuple(sorted(str(s) for s in S.values if s not in SETTLED_FOR_A_NEW_ATTEMPT))
_OP = OP_TABLE
_INC = INCIDENT_TABLE
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def _require_fp(name: str, value: str, *, blank: bool = False) -> None:
    if blank and value == "":
        return
    if not isinstance(value, str) or not _HEX64.match(value):
        raise RecoveryValidationError(
            f"{name} must be a 64-character lowercase hex BLAKE3 fingerprint "
            "(use recovery.canonical.fingerprint_value); raw values are never stored."
        )


def operation_record(
    *,
    subject: Subject,
    step_id: str,
    action: str,
    recovery_mode: str,
    definition_fp: str,
    input_fp: str,
    preview_fp: str,
    access_fp: str,
    idempotency_fp: str,
    nonce: str,
    ordinal: int,
    fence: Fence,
    state: str = S.DISPATCHED,
    compensation: bool = False,
    projection_fp: str = "",
) -> RecordedOperation:
    """Record one invocation boundary, with its checkpoint, on the caller's live fence.

    ``state`` is ``dispatched`` (the default: this commit is the dispatch boundary) or
    ``prepared`` (held before the boundary, e.g. behind a gate). The key is derived from
    the fingerprints and ``nonce``.

    The insert itself checks, like the fence, that the subject has no open integrity
    incident and that no earlier operation with the same idempotency key is in flight, of
    unknown outcome or succeeded — so no caller can forget either check. Raises
    :class:`OperationExists` for a key already recorded, :class:`IntegrityIncidentOpen`,
    :class:`LedgerDisagrees`, or :class:`StaleFence` when the fence is no longer live.
    ``projection_fp`` is carried into the checkpoint (see :mod:`recovery.projections`).
    """
    fps = {
        "definition_fp": definition_fp,
        "input_fp": input_fp,
        "preview_fp": preview_fp,
        "access_fp": access_fp,
        "idempotency_fp": idempotency_fp,
    }
    _check_record(fps, recovery_mode, state, ordinal)
    state, recovery_mode = str(state), str(recovery_mode)
    key = operation_key(
        definition_fp=definition_fp,
        step_id=step_id,
        action=action,
        input_fp=input_fp,
        nonce=nonce,
        compensation=compensation,
    )
    row = {"step_id": step_id, "action": action, "recovery_mode": recovery_mode, **fps}
    with atomic(), connection.cursor() as cursor:
        head = chain.read_head(cursor, subject)
        seq = head.seq + 1
        _insert(cursor, key, subject, row, fence=fence, ordinal=ordinal, state=state, seq=seq)
        fact = _recorded_fact(key, state, row, fence, ordinal)
        chain.append(cursor, subject, head, "operation.recorded", fact, projection_fp)
    return RecordedOperation(key=key, subject=subject, state=state, revision=1, chain_seq=seq)


def _recorded_fact(key: str, state: str, row: dict, fence: Fence, ordinal: int) -> dict:
    """The ``operation.recorded`` fact: the row as recorded, fingerprints only."""
    return {
        "operation": key,
        "state": state,
        "revision": 1,
        "step": row["step_id"],
        "action": row["action"],
        "mode": row["recovery_mode"],
        **{name: row[name] for name in _RECORDED if name.endswith("_fp")},
        "result_fp": "",
        "lease": fence.key,
        "fence": fence.fence,
        "ordinal": ordinal,
    }


def _check_record(fps: dict[str, str], recovery_mode: str, state: str, ordinal: int) -> None:
    for name, value in fps.items():
        _require_fp(name, value)
    if recovery_mode not in RecoveryMode.values:
        raise RecoveryValidationError(
            f"Unknown recovery mode {recovery_mode!r}; use one of {', '.join(RecoveryMode.values)}."
        )
    if state not in INITIAL:
        raise RecoveryValidationError(
            f"An operation is recorded as 'prepared' or 'dispatched', not {state!r}."
        )
    if not isinstance(ordinal, int) or ordinal < 0:
        raise RecoveryValidationError("ordinal must be a non-negative integer.")


_RECORDED = (
    "step_id",
    "action",
    "recovery_mode",
    "definition_fp",
    "input_fp",
    "preview_fp",
    "access_fp",
    "idempotency_fp",
)


def _insert(cursor, key: str, subject: Subject, row: dict, *, fence, ordinal, state, seq) -> None:
    """The dispatch write: one INSERT, conditional on the fence, no open incident and no
    earlier operation of the same effect that blocks a new one (internal)."""
    d = dialect()
    fenced_sql, fenced_params = fence_condition(fence)
    try:
        cursor.execute(
            f"INSERT INTO {_OP} (key, subject_type, subject_id, {', '.join(_RECORDED)}, "
            "result_fp, lease_key, fence, ordinal, state, revision, chain_seq, recorded_at, "
            "updated_at) "
            "SELECT %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, '', %s, %s, %s, %s, 1, %s, "
            f"{d.now}, {d.now} WHERE {fenced_sql} AND NOT EXISTS (SELECT 1 FROM {_INC} "
            "WHERE status = 'open' AND ((subject_type = %s AND subject_id = %s) OR "
            "(subject_type = %s AND subject_id = %s))) "
            f"AND NOT EXISTS (SELECT 1 FROM {_OP} WHERE idempotency_fp = %s AND state IN "
            f"({', '.join('%s' for _ in _BLOCKING)}))",
            [
                key,
                subject.type,
                subject.id,
                *(row[column] for column in _RECORDED),
                fence.key,
                fence.fence,
                ordinal,
                state,
                seq,
                *fenced_params,
                subject.type,
                subject.id,
                LEDGER_WIDE.type,
                LEDGER_WIDE.id,
                row["idempotency_fp"],
                *_BLOCKING,
            ],
        )
    except IntegrityError as exc:
        raise _exists(key) from exc
    if cursor.rowcount != 1:
        raise _why_not_recorded(cursor, key, subject, row["idempotency_fp"], fence)


def _exists(key: str) -> OperationExists:
    return OperationExists(
        f"Operation {key} is already recorded (same definition, step, action, input "
        "and nonce). A retry needs a new attempt ordinal in its nonce."
    )


def _why_not_recorded(cursor, key, subject, idempotency_fp, fence) -> Exception:
    """Explain a refused dispatch write (failure path only)."""
    cursor.execute(f"SELECT 1 FROM {_OP} WHERE key = %s", [key])
    if cursor.fetchone() is not None:
        return _exists(key)
    for blocked in (subject, LEDGER_WIDE):
        cursor.execute(
            f"SELECT id FROM {_INC} WHERE subject_type = %s AND subject_id = %s "
            "AND status = 'open'",
            [blocked.type, blocked.id],
        )
        incident = cursor.fetchone()
        if incident is not None:
            whose = "" if blocked == subject else " on the whole ledger (rolled back or restored)"
            return IntegrityIncidentOpen(
                f"{subject} cannot dispatch: integrity incident #{incident[0]} is open{whose}; "
                "no new effect is dispatched until it is resolved. Nothing was recorded.",
                incident_id=incident[0],
                ledger_wide=blocked != subject,
            )
    cursor.execute(
        f"SELECT key, state FROM {_OP} WHERE idempotency_fp = %s AND state IN "
        f"({', '.join('%s' for _ in _BLOCKING)}) ORDER BY id DESC",
        [idempotency_fp, *_BLOCKING],
    )
    blocking = cursor.fetchone()
    if blocking is not None:
        return LedgerDisagrees(
            f"The ledger already has operation {blocking[0]} for this effect (same "
            f"idempotency key), and it is {blocking[1]}: a new dispatch would guess. "
            "Nothing was recorded. If the step's row says otherwise, it was changed behind "
            "the ledger's back.",
            operation=blocking[0],
            state=blocking[1],
        )
    return StaleFence(
        f"Cannot record operation for {subject}: {fence} is no longer the live lease. "
        "Nothing was recorded and nothing may be dispatched."
    )


def operation_observe(
    *,
    key: str,
    state: str,
    fence: Fence,
    result: Any = None,
    input: Any = None,
    projection_fp: str = "",
    by: str = "",
) -> RecordedOperation:
    """Record what was observed about a dispatched operation, on the caller's live fence.

    ``state`` is ``succeeded``, ``failed``, ``pending`` or ``outcome_unknown`` (or, from a
    conclusive reconcile, ``effect_confirmed`` / ``effect_absent``: then ``by`` names the
    authority, e.g. ``"provider"``, and the fact records it). ``result`` is the provider's
    output or failure reason; only its fingerprint is stored. When ``input`` is given, its
    fingerprint must equal the recorded one (:class:`InputFingerprintMismatch`).

    Repeating the identical terminal observation is a no-op (``changed`` is False); a
    contradictory one raises :class:`ContradictoryObservation`. A success verifies the
    subject's chain first (after the fence's verified mark, ADR 0034): a broken chain raises
    :class:`ChainBroken` and, owning the transaction, opens an integrity incident."""
    if state not in OperationState.values or state in INITIAL:
        raise RecoveryValidationError(
            f"{state!r} is not an observable state; use succeeded, failed, pending or "
            "outcome_unknown."
        )
    state = str(state)
    result_fp = "" if result is None else fingerprint_value(FingerprintKind.RESULT, result)
    input_fp = None if input is None else fingerprint_value(FingerprintKind.INPUT, input)
    extra: dict[str, Any] = {"by_fence": fence.fence, **({"by": by} if by else {})}
    with opening_incidents(), atomic(), connection.cursor() as cursor:
        since = marked_since(fence) if state in SUCCESS else None
        if state in SUCCESS:
            row, subject_rows = load_with_subject(cursor, key, since=since)
        else:
            row, subject_rows = load_row(cursor, key), None
        subject = Subject(row["subject_type"], row["subject_id"])
        check_input(row, input_fp)
        if not check_target(row, state, result_fp):
            require_live(cursor, row, fence)
            return _unchanged(row)
        if state in SUCCESS:
            head = verified_head(cursor, subject, subject_rows, fence=fence, since=since)
        else:
            head = chain.read_head(cursor, subject)
        return transition(
            cursor,
            row,
            state,
            head=head,
            kind="operation.observed",
            fact_extra=extra,
            result_fp=result_fp,
            fence=fence,
            projection_fp=projection_fp,
        )


def _unchanged(row: dict[str, Any]) -> RecordedOperation:
    """What an idempotent repeat returns: the operation as it stands, ``changed`` False."""
    return RecordedOperation(
        key=row["key"],
        subject=Subject(row["subject_type"], row["subject_id"]),
        state=row["state"],
        revision=row["revision"],
        chain_seq=row["chain_seq"],
        result_fp=row["result_fp"],
        changed=False,
    )


def operation_check_input(*, key: str, input: Any) -> None:
    """Fail closed with :class:`InputFingerprintMismatch` unless ``input`` is the recorded one."""
    with connection.cursor() as cursor:
        row = load_row(cursor, key)
    check_input(row, fingerprint_value(FingerprintKind.INPUT, input))


def operation_dispatch(*, key: str, fence: Fence) -> RecordedOperation:
    """Move a ``prepared`` operation across the dispatch boundary (its own commit)."""
    with atomic(), connection.cursor() as cursor:
        row = load_row(cursor, key)
        if not check_target(row, S.DISPATCHED, ""):
            require_live(cursor, row, fence)
            return _unchanged(row)
        head = chain.read_head(cursor, Subject(row["subject_type"], row["subject_id"]))
        return transition(
            cursor,
            row,
            S.DISPATCHED,
            head=head,
            kind="operation.dispatched",
            fact_extra={"by_fence": fence.fence},
            fence=fence,
        )


@dataclass(frozen=True)
class EffectOperation:
    """One operation of an effect, as :func:`operations_for_effect` reads it."""

    key: str
    state: str
    step_id: str

    @property
    def retryable(self) -> bool:
        """Whether a new operation may follow this one for the same effect."""
        return self.state in SETTLED_FOR_A_NEW_ATTEMPT


def operations_for_effect(*, idempotency_fp: str) -> list[EffectOperation]:
    """Every operation recorded for one effect (one idempotency key), oldest first."""
    _require_fp("idempotency_fp", idempotency_fp)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT key, state, step_id FROM {_OP} WHERE idempotency_fp = %s ORDER BY id",
            [idempotency_fp],
        )
        return [EffectOperation(*row) for row in cursor.fetchall()]
