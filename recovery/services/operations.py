"""Ledger operations: record before the effect, observe after it.

A non-atomic lifecycle is two commits:

1. :func:`operation_record` (state ``dispatched``) — the **dispatch boundary**. The
   operation row with all fingerprints and the fence, and its ``operation.recorded``
   checkpoint, commit together *before* the provider is called.
2. :func:`operation_observe` — the terminal state and its ``operation.observed``
   checkpoint commit together. A success verifies the subject's whole chain first.

Both are conditional writes on the caller's fence. Inside a surrounding transaction they
run in a savepoint and commit with it, so the engine can commit its own projection in the
same commit; a refused write rolls back only its savepoint.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, connection

from .. import chain
from ..canonical import FingerprintKind, fingerprint_value
from ..chain import Head
from ..db import atomic, dialect
from ..errors import (
    ChainBroken,
    ContradictoryObservation,
    InputFingerprintMismatch,
    IntegrityIncidentOpen,
    InvalidTransition,
    LedgerDisagrees,
    OperationExists,
    OperationNotFound,
    RecoveryValidationError,
    StaleFence,
)
from ..keys import operation_key
from ..models import IntegrityIncident, Operation
from ..states import INITIAL, TERMINAL, OperationState, RecoveryMode, can_transition
from ..subjects import LEDGER_WATERMARK as LEDGER_WIDE
from ..subjects import Subject
from .leases import Fence, fence_condition

__all__ = [
    "EffectOperation",
    "RecordedOperation",
    "operation_dispatch",
    "operation_observe",
    "operation_record",
    "operations_for_effect",
]

S = OperationState
SUCCESS = frozenset({S.SUCCEEDED, S.EFFECT_CONFIRMED})
SETTLED_FOR_A_NEW_ATTEMPT = frozenset({S.PENDING, S.FAILED, S.EFFECT_ABSENT})
"""The states an effect's earlier operations may be in when a new one is recorded for it.

Each poll of a pending provider and each retry is a new operation with the same
idempotency key; anything else — in flight, of unknown outcome, or succeeded — means a new
dispatch would guess, and the ledger refuses it (invariant I12)."""
_BLOCKING = tuple(sorted(str(s) for s in S.values if s not in SETTLED_FOR_A_NEW_ATTEMPT))
_OP = Operation._meta.db_table
_INC = IntegrityIncident._meta.db_table
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_ROW = (
    "id",
    "key",
    "subject_type",
    "subject_id",
    "state",
    "revision",
    "result_fp",
    "fence",
    "lease_key",
    "chain_seq",
    "input_fp",
)


@dataclass(frozen=True)
class RecordedOperation:
    """What the caller needs after a ledger write: where the operation and its chain stand."""

    key: str
    subject: Subject
    state: str
    revision: int
    chain_seq: int
    result_fp: str = ""
    changed: bool = True
    """False when the call repeated an identical terminal observation (a no-op)."""


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
    for name, value in (
        ("definition_fp", definition_fp),
        ("input_fp", input_fp),
        ("preview_fp", preview_fp),
        ("access_fp", access_fp),
        ("idempotency_fp", idempotency_fp),
    ):
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
    state, recovery_mode = str(state), str(recovery_mode)
    key = operation_key(
        definition_fp=definition_fp,
        step_id=step_id,
        action=action,
        input_fp=input_fp,
        nonce=nonce,
        compensation=compensation,
    )
    d = dialect()
    fenced_sql, fenced_params = fence_condition(fence)
    with atomic(), connection.cursor() as cursor:
        head = chain.read_head(cursor, subject)
        seq = head.seq + 1
        try:
            cursor.execute(
                f"INSERT INTO {_OP} (key, subject_type, subject_id, step_id, action, "
                "recovery_mode, definition_fp, input_fp, preview_fp, access_fp, "
                "idempotency_fp, result_fp, lease_key, fence, ordinal, state, revision, "
                "chain_seq, recorded_at, updated_at) "
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
                    step_id,
                    action,
                    recovery_mode,
                    definition_fp,
                    input_fp,
                    preview_fp,
                    access_fp,
                    idempotency_fp,
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
                    idempotency_fp,
                    *_BLOCKING,
                ],
            )
        except IntegrityError as exc:
            raise _exists(key) from exc
        if cursor.rowcount != 1:
            raise _why_not_recorded(cursor, key, subject, idempotency_fp, fence)
        fact = {
            "operation": key,
            "state": state,
            "revision": 1,
            "step": step_id,
            "action": action,
            "mode": recovery_mode,
            "definition_fp": definition_fp,
            "input_fp": input_fp,
            "preview_fp": preview_fp,
            "access_fp": access_fp,
            "idempotency_fp": idempotency_fp,
            "result_fp": "",
            "lease": fence.key,
            "fence": fence.fence,
            "ordinal": ordinal,
        }
        chain.append(cursor, subject, head, "operation.recorded", fact, projection_fp)
    return RecordedOperation(key=key, subject=subject, state=state, revision=1, chain_seq=seq)


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


def _load(cursor, key: str) -> dict[str, Any]:
    cursor.execute(f"SELECT {', '.join(_ROW)} FROM {_OP} WHERE key = %s", [key])
    row = cursor.fetchone()
    if row is None:
        raise OperationNotFound(f"No ledger operation has key {key!r}.")
    return dict(zip(_ROW, row, strict=True))


def _load_with_subject(cursor, key: str) -> tuple[dict[str, Any], list]:
    """Load the operation and every operation of its subject, in one statement."""
    columns = ", ".join(f"o.{c}" for c in chain.OP_COLUMNS)
    extra = ", ".join(f"o.{c}" for c in _ROW)
    cursor.execute(
        f"SELECT {columns}, {extra} FROM {_OP} o JOIN {_OP} k "
        "ON o.subject_type = k.subject_type AND o.subject_id = k.subject_id WHERE k.key = %s",
        [key],
    )
    rows = cursor.fetchall()
    width = len(chain.OP_COLUMNS)
    mine = next((r for r in rows if r[0] == key), None)
    if mine is None:
        raise OperationNotFound(f"No ledger operation has key {key!r}.")
    return dict(zip(_ROW, mine[width:], strict=True)), [r[:width] for r in rows]


def _check_target(row: dict[str, Any], target: str, result_fp: str) -> bool:
    """Return False for an idempotent repeat; raise for an impossible or contradictory one."""
    current = row["state"]
    if current == target and (current not in TERMINAL or row["result_fp"] == result_fp):
        return False
    if current in TERMINAL:
        raise ContradictoryObservation(
            f"Operation {row['key']} already ended as {current}"
            f"{' with a different result' if current == target else ''}; facts never change, so "
            f"{target} was rejected and nothing was changed. If the effect really differs, "
            "open an integrity incident."
        )
    if not can_transition(current, target):
        raise InvalidTransition(
            f"Operation {row['key']} is {current}; it cannot become {target}. "
            f"Allowed next states: {', '.join(sorted(_next(current))) or 'none'}."
        )
    return True


def _next(state: str) -> frozenset[str]:
    from ..states import TRANSITIONS

    return TRANSITIONS.get(state, frozenset())


def transition(
    cursor,
    row: dict[str, Any],
    target: str,
    *,
    head: Head,
    kind: str,
    fact_extra: dict[str, Any],
    result_fp: str = "",
    fence: Fence | None = None,
    projection_fp: str = "",
) -> RecordedOperation:
    """Move one loaded operation to ``target`` and append its checkpoint (internal).

    A compare-and-swap on (state, revision), plus the fence when given, plus "no open
    integrity incident" for a success.
    """
    subject = Subject(row["subject_type"], row["subject_id"])
    target = str(target)
    if not can_transition(row["state"], target):
        raise InvalidTransition(
            f"Operation {row['key']} is {row['state']}; it cannot become {target}. "
            f"Allowed next states: {', '.join(sorted(_next(row['state']))) or 'none'}."
        )
    if fence is not None:
        _require_own_lease(row, fence)
    d = dialect()
    seq = head.seq + 1
    revision = row["revision"] + 1
    conditions = ["id = %s", "state = %s", "revision = %s"]
    params: list[Any] = [target, revision, result_fp, seq, row["id"], row["state"], row["revision"]]
    if fence is not None:
        fenced_sql, fenced_params = fence_condition(fence)
        conditions.append(fenced_sql)
        params += fenced_params
    if target in SUCCESS:
        conditions.append(
            f"NOT EXISTS (SELECT 1 FROM {_INC} WHERE subject_type = %s AND "
            "subject_id = %s AND status = 'open')"
        )
        params += [subject.type, subject.id]
    cursor.execute(
        f"UPDATE {_OP} SET state = %s, revision = %s, result_fp = %s, chain_seq = %s, "
        f"updated_at = {d.now} WHERE {' AND '.join(conditions)}",
        params,
    )
    if cursor.rowcount != 1:
        raise _why_not(cursor, row, target, fence, subject)
    fact = {
        "operation": row["key"],
        "state": target,
        "revision": revision,
        "result_fp": result_fp,
        **fact_extra,
    }
    chain.append(cursor, subject, head, kind, fact, projection_fp)
    return RecordedOperation(
        key=row["key"],
        subject=subject,
        state=target,
        revision=revision,
        chain_seq=seq,
        result_fp=result_fp,
    )


def _require_own_lease(row: dict[str, Any], fence: Fence) -> None:
    if fence.key != row["lease_key"]:
        raise StaleFence(
            f"Operation {row['key']} is guarded by lease {row['lease_key']!r}, not "
            f"{fence.key!r}; a fence proves authority over its own resource only."
        )


def _require_live(cursor, row: dict[str, Any], fence: Fence) -> None:
    """An idempotent repeat writes nothing, but a stale holder still gets its error."""
    _require_own_lease(row, fence)
    sql, params = fence_condition(fence)
    cursor.execute(f"SELECT {sql}", params)
    if not cursor.fetchone()[0]:
        raise StaleFence(
            f"{fence} is no longer the live lease; nothing was changed for operation {row['key']}."
        )


def _why_not(cursor, row, target, fence, subject) -> Exception:
    """Explain a conditional write that matched no row (failure path only)."""
    if (
        target in SUCCESS
        and IntegrityIncident.objects.filter(
            subject_type=subject.type, subject_id=subject.id, status="open"
        ).exists()
    ):
        return IntegrityIncidentOpen(
            f"{subject} has an open integrity incident; no success can be committed until "
            "it is resolved: once the cause is repaired, one person requests the resolution "
            "and a second approves it (the incident's admin page, or manage.py "
            f"recovery_verify --subject {subject} --resolve --by YOU --rationale TEXT, then "
            "--approve INCIDENT --by ANOTHER)."
        )
    current = _load(cursor, row["key"])
    if (current["state"], current["revision"]) != (row["state"], row["revision"]):
        return InvalidTransition(
            f"Operation {row['key']} changed while this change was being made (now "
            f"{current['state']}, revision {current['revision']}); nothing was changed."
        )
    return StaleFence(
        f"Cannot move operation {row['key']} to {target}: {fence} is no longer the live "
        "lease. Nothing was changed; the current holder carries on."
    )


def operation_observe(
    *,
    key: str,
    state: str,
    fence: Fence,
    result: Any = None,
    input: Any = None,
    projection_fp: str = "",
) -> RecordedOperation:
    """Record what was observed about a dispatched operation, on the caller's live fence.

    ``state`` is ``succeeded``, ``failed``, ``pending`` or ``outcome_unknown`` (or, from a
    conclusive reconcile, ``effect_confirmed`` / ``effect_absent``). ``result`` is the
    provider's output or failure reason; only its fingerprint is stored. When ``input`` is
    given, its fingerprint must equal the recorded one (:class:`InputFingerprintMismatch`).

    Repeating the identical terminal observation is a no-op (``changed`` is False); a
    contradictory one raises :class:`ContradictoryObservation`. A success verifies the
    subject's chain first: a broken chain raises :class:`ChainBroken` and, when this call
    owns the transaction, opens an integrity incident. ``projection_fp`` is carried into
    the checkpoint (see :mod:`recovery.projections`).
    """
    if state not in OperationState.values or state in INITIAL:
        raise RecoveryValidationError(
            f"{state!r} is not an observable state; use succeeded, failed, pending or "
            "outcome_unknown."
        )
    state = str(state)
    result_fp = "" if result is None else fingerprint_value(FingerprintKind.RESULT, result)
    input_fp = None if input is None else fingerprint_value(FingerprintKind.INPUT, input)
    with opening_incidents(), atomic(), connection.cursor() as cursor:
        if state in SUCCESS:
            row, subject_rows = _load_with_subject(cursor, key)
        else:
            row, subject_rows = _load(cursor, key), None
        subject = Subject(row["subject_type"], row["subject_id"])
        _check_input(row, input_fp)
        if not _check_target(row, state, result_fp):
            _require_live(cursor, row, fence)
            return RecordedOperation(
                key=key,
                subject=subject,
                state=row["state"],
                revision=row["revision"],
                chain_seq=row["chain_seq"],
                result_fp=row["result_fp"],
                changed=False,
            )
        if state in SUCCESS:
            head = verified_head(cursor, subject, subject_rows)
        else:
            head = chain.read_head(cursor, subject)
        return transition(
            cursor,
            row,
            state,
            head=head,
            kind="operation.observed",
            fact_extra={"by_fence": fence.fence},
            result_fp=result_fp,
            fence=fence,
            projection_fp=projection_fp,
        )


def verified_head(cursor, subject: Subject, subject_rows: list | None = None) -> Head:
    """Verify the subject's whole chain before a success; return its head (internal).

    Raises :class:`ChainBroken`; :func:`opening_incidents` turns that into an incident.
    """
    checkpoints = chain.load_checkpoints(cursor, subject)
    if subject_rows is None:
        subject_rows = chain.load_operations(cursor, subject)
    verification = chain.verify_rows(subject, checkpoints, subject_rows)
    if not verification.ok:
        raise ChainBroken(
            f"Refusing to commit success for {subject}: its checkpoint chain is broken at "
            f"#{verification.position} ({verification.reason}). An integrity incident records "
            "it; investigate before anything moves on.",
            verification,
        )
    if not checkpoints:
        return chain.EMPTY
    last = checkpoints[-1]
    return Head(last[0], last[5])


@contextmanager
def opening_incidents():
    """Open an integrity incident when a success is refused for a broken chain.

    The incident is written after the refused transaction rolled back, so it survives. When
    the caller holds an outer transaction, that caller must open it (``incident_open``)
    after its own rollback: nothing written inside a rolled-back transaction survives.
    """
    outermost = not connection.in_atomic_block
    try:
        yield
    except ChainBroken as exc:
        if outermost:
            from .incidents import incident_open

            incident_open(verification=exc.result)
        raise


def _check_input(row: dict[str, Any], input_fp: str | None) -> None:
    if input_fp is not None and input_fp != row["input_fp"]:
        raise InputFingerprintMismatch(
            f"The input presented for operation {row['key']} is not the input it was "
            f"recorded with (fingerprint {input_fp[:16]}… ≠ {row['input_fp'][:16]}…). "
            "Nothing was changed: reconcile with the original input, or treat this as a "
            "different effect."
        )


def operation_check_input(*, key: str, input: Any) -> None:
    """Fail closed with :class:`InputFingerprintMismatch` unless ``input`` is the recorded one."""
    with connection.cursor() as cursor:
        row = _load(cursor, key)
    _check_input(row, fingerprint_value(FingerprintKind.INPUT, input))


def operation_dispatch(*, key: str, fence: Fence) -> RecordedOperation:
    """Move a ``prepared`` operation across the dispatch boundary (its own commit)."""
    with atomic(), connection.cursor() as cursor:
        row = _load(cursor, key)
        if not _check_target(row, S.DISPATCHED, ""):
            _require_live(cursor, row, fence)
            return RecordedOperation(
                key=key,
                subject=Subject(row["subject_type"], row["subject_id"]),
                state=row["state"],
                revision=row["revision"],
                chain_seq=row["chain_seq"],
                changed=False,
            )
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
