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

from django.db import connection, transaction

from .. import chain
from ..canonical import FingerprintKind, fingerprint_value
from ..db import atomic, one_call_steps
from ..errors import RecoveryValidationError
from ..kept import default_db
from ..keys import operation_key
from ..states import INITIAL, OBSERVABLE, RECOVERY_MODES, OperationState, RecoveryMode
from ..subjects import Subject
from ._ledger import (
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
from .dispatch_write import _RECORDED, SETTLED_FOR_A_NEW_ATTEMPT, insert_recorded
from .first_writes import FirstWrites
from .leases import Fence
from .lone import alone, observe_alone, record_alone
from .stored_marks import seal_wanted, sealed_head, sealed_success_reads

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
_OP = OP_TABLE
_HEX64 = re.compile(r"^[0-9a-f]{64}\Z")


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
    follow: bool = False,
    first: FirstWrites | None = None,
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
    ``projection_fp`` is carried into the checkpoint (:mod:`recovery.projections`);
    ``follow``: see :func:`_head`; ``first``: the caller's rows, see ``insert_recorded``.
    """
    fps = dict(definition_fp=definition_fp, input_fp=input_fp, preview_fp=preview_fp)
    fps |= dict(access_fp=access_fp, idempotency_fp=idempotency_fp)
    _check_record(fps, recovery_mode, state, ordinal)
    state, recovery_mode = str(state), str(recovery_mode)
    key = operation_key(
        definition_fp=definition_fp, step_id=step_id, action=action, input_fp=input_fp,
        nonce=nonce, compensation=compensation,
    )  # fmt: skip
    row = {"step_id": step_id, "action": action, "recovery_mode": recovery_mode, **fps}
    fact = _recorded_fact(key, state, row, fence, ordinal)
    outermost = alone() and first is None
    if outermost:  # one statement after the run's own last write (ADR 0040)
        done = record_alone(
            key, row, fact, subject=subject, fence=fence, ordinal=ordinal, state=state,
            projection_fp=projection_fp,
        )  # fmt: skip
        if done is not None:
            return done
    with atomic(), default_db().cursor() as cursor:
        head, mark = _head(cursor, subject, fence, follow and not outermost)
        checkpoint = chain.prepare(subject, head, "operation.recorded", fact, projection_fp)
        insert_recorded(
            cursor, key, row, checkpoint, fence=fence, ordinal=ordinal, state=state, first=first
        )
    _remembered(fence, outermost, mark, checkpoint, fact)
    return RecordedOperation(key, subject, state, 1, checkpoint.seq)


def _head(cursor, subject: Subject, fence: Fence, follow: bool):
    """The head a recording links to, and the mark reading the chain left, or None.

    ``follow``: the caller's run goes on to observe this operation in a later commit of
    its own (a chained step). Inside the caller's transaction, when the run has verified
    nothing yet, the chain is read and verified in place of the head — from the subject's
    sealed mark on when it holds (ADR 0066), else whole (one statement either way; a
    broken one raises :class:`ChainBroken`, refusing the dispatch), and once
    the commit is made the run's mark covers the chain through this write, so that
    observation need not read it (ADR 0052). The mark is kept off the run until then: it
    may vouch for rows this transaction wrote."""
    if not follow or chain.mark_peek(fence) is not None:
        return chain.read_head(cursor, subject), None
    head = sealed_head(cursor, subject, fence)  # from the subject's seal on (ADR 0066)
    return head, chain.mark_drop(fence)


def _remembered(fence: Fence, outermost: bool, mark, checkpoint, fact: dict[str, Any]) -> None:
    """What the run's mark knows of the recording once it is committed (ADR 0040, 0052).

    Written alone (``outermost``), it is committed: the run's next call may follow it
    without reading. Inside the caller's transaction with ``mark`` (:func:`_head`): once
    the caller's commit is made, the run's mark is ``mark`` with ``checkpoint`` written
    after it, unless the run has a mark again by then; rolled back, the run keeps no mark,
    and its next success reads and verifies as before."""
    if outermost:
        chain.mark_wrote(fence, checkpoint, fact)
    if outermost or mark is None:
        return

    def committed() -> None:
        if chain.mark_peek(fence) is None:
            chain.mark_keep(fence, mark)
            chain.mark_wrote(fence, checkpoint, fact)

    transaction.on_commit(committed)


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
    if recovery_mode not in RECOVERY_MODES:
        raise RecoveryValidationError(
            f"Unknown recovery mode {recovery_mode!r}; use one of {', '.join(RecoveryMode.values)}."
        )
    if state not in INITIAL:
        raise RecoveryValidationError(
            f"An operation is recorded as 'prepared' or 'dispatched', not {state!r}."
        )
    if not isinstance(ordinal, int) or ordinal < 0:
        raise RecoveryValidationError("ordinal must be a non-negative integer.")


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
    if state not in OBSERVABLE:
        raise RecoveryValidationError(
            f"{state!r} is not an observable state; use succeeded, failed, pending or "
            "outcome_unknown."
        )
    state = str(state)
    result_fp = result_fingerprint(result)
    input_fp = None if input is None else fingerprint_value(FingerprintKind.INPUT, input)
    extra = observed_extra(fence, by)
    outermost = alone()
    if outermost and state in SUCCESS:  # one statement, the tail checked in it (ADR 0040)
        done = observe_alone(
            key, state, fence, result_fp=result_fp, input_fp=input_fp, fact_extra=extra,
            projection_fp=projection_fp,
        )  # fmt: skip
        if done is not None:
            return done
    elif state in SUCCESS:  # in the caller's transaction: one call, the tail checked in it
        # (ADR 0076); imported here because tail_observe builds on this module's callers.
        from .tail_observe import observe_in_tail

        done, _ = observe_in_tail(
            key, state, fence, result_fp=result_fp, input_fp=input_fp, fact_extra=extra,
            projection_fp=projection_fp,
        )  # fmt: skip
        if done is not None:
            return done
    done = _observe(key, state, fence, result_fp, input_fp, extra, projection_fp)
    if outermost and done.written is not None:  # committed: the run remembers it
        head, kind, fact, projection = done.written
        checkpoint = chain.prepare(done.subject, head, kind, fact, projection)
        chain.mark_wrote(fence, checkpoint, fact)
    return done


def result_fingerprint(result: Any) -> str:
    """The fingerprint an observation stores of a provider's answer ('' for none)."""
    return "" if result is None else fingerprint_value(FingerprintKind.RESULT, result)


def observed_extra(fence: Fence, by: str = "") -> dict[str, Any]:
    """What an observation's fact carries besides the move: its fence, and its authority."""
    return {"by_fence": fence.fence, **({"by": by} if by else {})}


def _observe(key, state, fence, result_fp, input_fp, extra, projection_fp) -> RecordedOperation:
    """:func:`operation_observe` in a transaction: read, check, verify a success, write."""
    with opening_incidents(), atomic(), default_db().cursor() as cursor:
        since = marked_since(fence) if state in SUCCESS else None
        checkpoints = None
        if state in SUCCESS:
            row, subject_rows, checkpoints, since = _success_reads(cursor, key, fence, since)
        else:
            row, subject_rows = load_row(cursor, key), None
        subject = Subject(row["subject_type"], row["subject_id"])
        check_input(row, input_fp)
        if not check_target(row, state, result_fp):
            require_live(cursor, row, fence)
            return _unchanged(row)
        if state in SUCCESS:
            head = verified_head(
                cursor, subject, subject_rows, checkpoints=checkpoints, fence=fence, since=since
            )
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


def _success_reads(cursor, key: str, fence: Fence, since: int | None):
    """What a success verifies: the operation, its subject's operations, and its chain
    (None: ``verified_head`` reads it) — one statement where a step is one call (ADR 0035),
    else the operations here and the chain in ``verified_head``. With ``since`` (the run's
    verified mark, ADR 0034) only the tail after it; where a step is one call and the run
    has no mark, from its subject's seal (ADR 0070). Returns the rows and the position
    ``verified_head`` verifies from (``since``, or the seal's)."""
    if one_call_steps():
        if since is None and seal_wanted(fence):
            return sealed_success_reads(cursor, key, fence)
        # The one-call step's own read (ADR 0031), shared; imported here because
        # step_call builds on this module.
        from .step_parts import _load_for_success

        return (*_load_for_success(cursor, key, since), since)
    row, subject_rows = load_with_subject(cursor, key, since=since)
    return row, subject_rows, None, since


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
    with atomic(), default_db().cursor() as cursor:
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
