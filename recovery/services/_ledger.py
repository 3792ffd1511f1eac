"""The ledger's internal moves: load an operation, move it, verify the chain before a success.

Private to the recovery core (the leading underscore of the module says so): the public
services in :mod:`recovery.services.operations` and :mod:`recovery.services.decisions` are
built on these, and callers outside the core use ``recovery.api`` only. Every function here
expects the caller's open transaction and cursor.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from django.db import IntegrityError

from .. import chain
from ..chain import Head
from ..db import dialect, one_call_steps
from ..errors import (
    ChainBroken,
    ContradictoryObservation,
    InputFingerprintMismatch,
    IntegrityIncidentOpen,
    InvalidTransition,
    OperationNotFound,
    StaleFence,
)
from ..kept import default_db
from ..models import IntegrityIncident, Operation
from ..states import TERMINAL, TRANSITIONS, OperationState, can_transition
from ..subjects import Subject
from .leases import Fence, fence_condition

S = OperationState
SUCCESS = frozenset({S.SUCCEEDED, S.EFFECT_CONFIRMED})
OP_TABLE = Operation._meta.db_table
INCIDENT_TABLE = IntegrityIncident._meta.db_table
ROW = (
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
    written: tuple[chain.Head, str, dict[str, Any], str] | None = field(
        default=None, compare=False, repr=False
    )
    """What the checkpoint this call appended was prepared from: head, kind, fact and
    projection (internal: a standalone caller's run remembers it once the write
    committed, ADR 0040)."""


def load_row(cursor, key: str) -> dict[str, Any]:
    cursor.execute(f"SELECT {', '.join(ROW)} FROM {OP_TABLE} WHERE key = %s", [key])
    row = cursor.fetchone()
    if row is None:
        raise OperationNotFound(f"No ledger operation has key {key!r}.")
    return dict(zip(ROW, row, strict=True))


def subject_of(alias: str) -> str:
    """A condition: ``alias``'s row belongs to the subject of the operation whose key is
    the next parameter.

    The subject is read first, once (a sub-select PostgreSQL runs before the scan), so the
    rows are found by their table's ``(subject, …)`` index whatever its statistics say.
    Written as a join on the subject, the planner could scan that whole index and look the
    key up once per row — it did on tables whose statistics were taken when they were
    small: every subject's chain read at each verification (ADR 0065).
    """
    return (
        f"({alias}.subject_type, {alias}.subject_id) = "
        f"(SELECT subject_type, subject_id FROM {OP_TABLE} WHERE key = %s)"
    )


def load_with_subject(cursor, key: str, *, since: int | None = None) -> tuple[dict[str, Any], list]:
    """Load the operation and every operation of its subject, in one statement.

    With ``since`` (a verified mark's position, ADR 0034), only the operations whose latest
    checkpoint is past it, and the operation itself.
    """
    columns = ", ".join(f"o.{c}" for c in chain.OP_COLUMNS)
    extra = ", ".join(f"o.{c}" for c in ROW)
    sql = f"SELECT {columns}, {extra} FROM {OP_TABLE} o WHERE {subject_of('o')}"
    params: list[Any] = [key]
    if since is not None:
        # Past the mark by the (subject, chain_seq) index, and the operation itself.
        sql += (
            f" AND o.chain_seq > %s UNION ALL SELECT {columns}, {extra} FROM {OP_TABLE} o "
            "WHERE o.key = %s AND o.chain_seq <= %s"
        )
        params += [since, key, since]
    cursor.execute(sql, params)
    rows = cursor.fetchall()
    width = len(chain.OP_COLUMNS)
    mine = next((r for r in rows if r[0] == key), None)
    if mine is None:
        raise OperationNotFound(f"No ledger operation has key {key!r}.")
    return dict(zip(ROW, mine[width:], strict=True)), [r[:width] for r in rows]


def check_target(row: dict[str, Any], target: str, result_fp: str) -> bool:
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
    """Move one loaded operation to ``target`` and append its checkpoint.

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
    seq = head.seq + 1
    revision = row["revision"] + 1
    fact = {
        "operation": row["key"],
        "state": target,
        "revision": revision,
        "result_fp": result_fp,
        **fact_extra,
    }
    swap = _swap_sql(row, target, revision, result_fp, seq, fence, subject)
    if one_call_steps():
        # PostgreSQL: the compare-and-swap and its checkpoint in one statement (ADR 0050).
        checkpoint = chain.prepare(subject, head, kind, fact, projection_fp)
        if not _swap_and_append(cursor, swap, checkpoint):
            raise _why_not(cursor, row, target, fence, subject)
    else:
        cursor.execute(*swap)
        if cursor.rowcount != 1:
            raise _why_not(cursor, row, target, fence, subject)
        chain.append(cursor, subject, head, kind, fact, projection_fp)
    return RecordedOperation(
        key=row["key"],
        subject=subject,
        state=target,
        revision=revision,
        chain_seq=seq,
        result_fp=result_fp,
        written=(head, kind, fact, projection_fp),
    )


def _swap_sql(row, target, revision, result_fp, seq, fence, subject) -> tuple[str, list[Any]]:
    """The one conditional UPDATE of :func:`transition` (the compare-and-swap on state and
    revision, the fence when given, no open incident for a success), not run."""
    conditions = ["id = %s", "state = %s", "revision = %s"]
    params: list[Any] = [target, revision, result_fp, seq, row["id"], row["state"], row["revision"]]
    if fence is not None:
        fenced_sql, fenced_params = fence_condition(fence)
        conditions.append(fenced_sql)
        params += fenced_params
    if target in SUCCESS:
        conditions.append(
            f"NOT EXISTS (SELECT 1 FROM {INCIDENT_TABLE} WHERE subject_type = %s AND "
            "subject_id = %s AND status = 'open')"
        )
        params += [subject.type, subject.id]
    sql = (
        f"UPDATE {OP_TABLE} SET state = %s, revision = %s, result_fp = %s, chain_seq = %s, "
        f"updated_at = {dialect().now} WHERE {' AND '.join(conditions)}"
    )
    return sql, params


def _swap_and_append(cursor, swap: tuple[str, list[Any]], checkpoint: chain.Prepared) -> bool:
    """The compare-and-swap and the checkpoint after it as one statement; False when the
    swap matched nothing (nothing written: the caller explains it as alone). A checkpoint
    that lost its (subject, seq) position aborts the statement, swap and all, as
    :class:`ChainConflict` (what :func:`chain.append` raises)."""
    sql, params = swap
    try:
        cursor.execute(
            f"WITH up AS ({sql} RETURNING 1), cp AS (INSERT INTO {chain.CHECKPOINT_TABLE} "
            f"({chain.CHECKPOINT_COLUMNS}, recorded_at) SELECT %s, %s, %s, %s, %s, %s, %s, %s, "
            f"%s, %s, {dialect().now} WHERE EXISTS (SELECT 1 FROM up) RETURNING 1) "
            "SELECT count(*) FROM up",
            [*params, *checkpoint.row()],
        )
    except IntegrityError as exc:
        raise chain.conflict(checkpoint.subject, checkpoint.seq) from exc
    return cursor.fetchone()[0] == 1


def _require_own_lease(row: dict[str, Any], fence: Fence) -> None:
    if fence.key != row["lease_key"]:
        raise StaleFence(
            f"Operation {row['key']} is guarded by lease {row['lease_key']!r}, not "
            f"{fence.key!r}; a fence proves authority over its own resource only."
        )


def require_live(cursor, row: dict[str, Any], fence: Fence) -> None:
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
    current = load_row(cursor, row["key"])
    if (current["state"], current["revision"]) != (row["state"], row["revision"]):
        return InvalidTransition(
            f"Operation {row['key']} changed while this change was being made (now "
            f"{current['state']}, revision {current['revision']}); nothing was changed."
        )
    return StaleFence(
        f"Cannot move operation {row['key']} to {target}: {fence} is no longer the live "
        "lease. Nothing was changed; the current holder carries on."
    )


def marked_since(fence: Fence) -> int | None:
    """Where the run holding ``fence`` verified its chain through (ADR 0034), if it did."""
    mark = chain.mark_peek(fence)
    # A mark at #0 (a fresh chain this run wrote, ADR 0040) verified nothing to start from;
    # one kept while a whole verification is asked (ADR 0076) is no place to start from.
    if mark is None or mark.seq == 0 or chain.whole_asked(fence):
        return None
    return mark.seq


def verified_head(
    cursor,
    subject: Subject,
    subject_rows: list | None = None,
    *,
    decisions: list = (),
    checkpoints: list | None = None,
    fence: Fence | None = None,
    since: int | None = None,
) -> Head:
    """Verify the subject's chain before a success; return its head.

    ``decisions`` are (id, result, result fingerprint) rows of decisions whose stored
    results are verified too (``decided.result_mismatch``); ``checkpoints``, the chain's
    rows when the caller read them already. Raises :class:`ChainBroken`;
    :func:`opening_incidents` turns that into an incident.

    With ``fence`` (the run's lease), the run's verified mark is used and kept (ADR 0034):
    the first success of a run verifies the whole chain and keeps a mark; a later one
    verifies only what follows the mark. ``since`` says the caller read the rows for the
    mark at that position (``checkpoints`` from it on, ``subject_rows`` past it and the
    operation moved); without a matching mark, everything is read and verified again.
    """
    mark = None if fence is None else chain.mark_drop(fence)
    verification = None
    if mark is not None and since == mark.seq and mark.subject == subject and not decisions:
        if checkpoints is None:
            checkpoints = chain.load_checkpoints(cursor, subject, since)
        verification = chain.verify_tail(mark, checkpoints, subject_rows or [])
    elif since is not None:
        checkpoints = subject_rows = None  # read for another mark: read everything
    if verification is None:  # no mark, or it no longer holds: the whole chain
        if checkpoints is None or since is not None:
            checkpoints = chain.load_checkpoints(cursor, subject)
        if subject_rows is None or since is not None:
            subject_rows = chain.load_operations(cursor, subject)
        verification, mark = chain.verify_marking(
            subject, checkpoints, subject_rows, results=decisions
        )
    if not verification.ok:
        raise ChainBroken(
            f"Refusing to commit success for {subject}: its checkpoint chain is broken at "
            f"#{verification.position} ({verification.reason}). An integrity incident records "
            "it; investigate before anything moves on.",
            verification,
        )
    if fence is not None and mark is not None:
        mark.forget_written()  # what the run wrote was read and verified with the rest
        chain.mark_keep(fence, mark)
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
    outermost = not default_db().in_atomic_block
    try:
        yield
    except ChainBroken as exc:
        if outermost:
            from .incidents import incident_open

            incident_open(verification=exc.result)
        raise


def check_input(row: dict[str, Any], input_fp: str | None) -> None:
    if input_fp is not None and input_fp != row["input_fp"]:
        raise InputFingerprintMismatch(
            f"The input presented for operation {row['key']} is not the input it was "
            f"recorded with (fingerprint {input_fp[:16]}… ≠ {row['input_fp'][:16]}…). "
            "Nothing was changed: reconcile with the original input, or treat this as a "
            "different effect."
        )
