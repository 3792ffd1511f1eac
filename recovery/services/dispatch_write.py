"""The dispatch write: an operation row and its ``operation.recorded`` checkpoint.

Internal to :func:`recovery.services.operations.operation_record` (and the refusals of the
one-call step, ADR 0031). The operation's INSERT is conditional on the fence, on no open
integrity incident (the subject's or the whole ledger's) and on no earlier operation of the
same effect that blocks a new one; the checkpoint's INSERT takes position ``seq`` of the
chain, whose unique (subject, seq) constraint is the compare-and-swap (ADR 0002).

Where the dialect allows it (PostgreSQL, ``one_call_steps``) both INSERTs are one
statement, a data-modifying ``WITH`` (ADR 0035): the checkpoint is inserted only if the
operation was, and the statement answers which of the two matched; the operation's values
go as one JSON parameter there (ADR 0060). Elsewhere (SQLite, or inside
``multi_statement``) they are two statements. A refusal is explained with the same
questions on both paths and raised as the same error: :class:`OperationExists`,
:class:`IntegrityIncidentOpen`, :class:`LedgerDisagrees`, :class:`StaleFence` for the
operation, :class:`ChainConflict` for the checkpoint.
"""

from __future__ import annotations

import json
from typing import Any

from django.db import IntegrityError

from .. import chain
from ..db import dialect, one_call_steps
from ..errors import IntegrityIncidentOpen, LedgerDisagrees, OperationExists, StaleFence
from ..states import OperationState
from ..subjects import LEDGER_WATERMARK as LEDGER_WIDE
from ..subjects import Subject
from ._ledger import INCIDENT_TABLE, OP_TABLE
from .first_writes import FirstWrites
from .leases import Fence, fence_condition

S = OperationState
SETTLED_FOR_A_NEW_ATTEMPT = frozenset({S.PENDING, S.FAILED, S.EFFECT_ABSENT})
"""The states an effect's earlier operations may be in when a new one is recorded for it.

Each poll of a pending provider and each retry is a new operation with the same
idempotency key; anything else — in flight, of unknown outcome, or succeeded — means a new
dispatch would guess, and the ledger refuses it (invariant I12)."""
_BLOCKING = tuple(sorted(str(s) for s in S.values if s not in SETTLED_FOR_A_NEW_ATTEMPT))
BLOCKING_ARRAY = "{" + ",".join(_BLOCKING) + "}"
"""The blocking states as one array literal, for a ``%s::text[]`` parameter: a text the
driver passes as it is, where a list is dumped element by element in Python at every call
(the states are plain words: nothing in them needs quoting)."""
_OP = OP_TABLE
_INC = INCIDENT_TABLE
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


def insert_recorded(
    cursor,
    key: str,
    row: dict,
    checkpoint: chain.Prepared,
    *,
    fence: Fence,
    ordinal,
    state,
    first: FirstWrites | None = None,
) -> None:
    """Insert the operation (``chain_seq`` = the checkpoint's) and then its checkpoint.

    ``checkpoint`` was prepared after the head the caller read. Raises the refusal's
    error; the caller's transaction (or savepoint) rolls back whatever was written.
    ``first``: the caller's own rows, written before (ADR 0053): on PostgreSQL in front of
    the inserts, in their statement, which insert only if every part matched; a part that
    matched nothing is raised as its write alone would raise it.
    """
    subject = checkpoint.subject
    if not one_call_steps():
        sql, params = _insert_sql(key, subject, row, fence, ordinal, state, checkpoint.seq)
        if first is not None:
            first.write(fence)
        try:
            cursor.execute(sql, params)
        except IntegrityError as exc:
            raise _exists(key) from exc
        if cursor.rowcount != 1:
            raise why_not_recorded(cursor, key, subject, row["idempotency_fp"], fence)
        chain.insert_prepared(cursor, checkpoint)
        return
    sql, params = _insert_sql_packed(key, subject, row, fence, ordinal, state, checkpoint.seq)
    parts, first_params, results, matched = [], [], [], "TRUE"
    if first is not None:
        parts, first_params, results, matched = first.parts(fence)
    cursor.execute(
        f"WITH {''.join(part + ', ' for part in parts)}"
        f"op AS ({sql} AND {matched} ON CONFLICT (key) DO NOTHING RETURNING 1), "
        f"cp AS (INSERT INTO {chain.CHECKPOINT_TABLE} ({chain.CHECKPOINT_COLUMNS}, "
        f"recorded_at) SELECT %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, {dialect().now} "
        "WHERE EXISTS (SELECT 1 FROM op) "
        "ON CONFLICT (subject_type, subject_id, seq) DO NOTHING RETURNING 1) "
        f"SELECT EXISTS (SELECT 1 FROM op), EXISTS (SELECT 1 FROM cp), {matched}"
        f"{''.join(', ' + result for result in results)}",
        [*first_params, *params, *checkpoint.row()],
    )
    recorded, chained, took, *values = cursor.fetchone()
    if first is not None:
        first.took(fence, values)
        if not took:  # nothing refused; a part merely matched no row: as if alone
            insert_recorded(cursor, key, row, checkpoint, fence=fence, ordinal=ordinal, state=state)
            return
    if not recorded:
        raise why_not_recorded(cursor, key, subject, row["idempotency_fp"], fence)
    if not chained:
        raise chain.conflict(subject, checkpoint.seq)


_INSERT_INTO = (
    f"INSERT INTO {_OP} (key, subject_type, subject_id, {', '.join(_RECORDED)}, result_fp, "
    "lease_key, fence, ordinal, state, revision, chain_seq, recorded_at, updated_at)"
)
"""The recorded operation's columns, in the order both statements below select them."""


def _insert_sql(key, subject: Subject, row: dict, fence: Fence, ordinal, state, seq):
    """The operation's conditional INSERT … SELECT … WHERE, and its parameters."""
    d = dialect()
    fenced_sql, fenced_params = fence_condition(fence)
    sql = (
        f"{_INSERT_INTO} "
        "SELECT %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, '', %s, %s, %s, %s, 1, %s, "
        f"{d.now}, {d.now} WHERE {fenced_sql} AND NOT EXISTS (SELECT 1 FROM {_INC} "
        "WHERE status = 'open' AND ((subject_type = %s AND subject_id = %s) OR "
        "(subject_type = %s AND subject_id = %s))) "
        f"AND NOT EXISTS (SELECT 1 FROM {_OP} WHERE idempotency_fp = %s AND state IN "
        f"({', '.join('%s' for _ in _BLOCKING)}))"
    )
    params: list[Any] = [
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
    ]
    return sql, params


_PACKED = (
    "key text, subject_type text, subject_id text, "
    + "".join(f"{column} text, " for column in _RECORDED)
    + "lease_key text, fence bigint, ordinal integer, state text, chain_seq bigint"
)


def _literal(value: str) -> str:
    """A constant of this module written into the SQL (never a caller's value)."""
    return "'" + value.replace("'", "''") + "'"


def _insert_sql_packed(key, subject: Subject, row: dict, fence: Fence, ordinal, state, seq):
    """:func:`_insert_sql` on PostgreSQL: the row's values as one JSON parameter, which its
    conditions read again, and the ledger's constants written into the SQL — 4 parameters,
    not 29, so the statement it joins stays within the 50 whose conversion psycopg caches
    (a step's first dispatch: ADR 0053, 0060).

    Each ``NOT EXISTS`` reads the row's values, so ``OFFSET 0`` keeps it a look-up made
    with them (PostgreSQL does not turn such a sub-select into a join): by the index on
    the idempotency fingerprint, and on the open incidents, whatever the tables'
    statistics say. As an anti-join, on statistics taken when the table was small, the
    planner scanned every operation at each dispatch (ADR 0065)."""
    fenced_sql, fenced_params = fence_condition(fence)
    sql = (
        f"{_INSERT_INTO} "
        f"SELECT v.key, v.subject_type, v.subject_id, "
        f"{', '.join(f'v.{column}' for column in _RECORDED)}, '', v.lease_key, v.fence, "
        f"v.ordinal, v.state, 1, v.chain_seq, {dialect().now}, {dialect().now} "
        f"FROM json_to_record(%s::json) AS v({_PACKED}) "
        f"WHERE {fenced_sql} AND NOT EXISTS (SELECT 1 FROM {_INC} "
        "WHERE status = 'open' AND ((subject_type = v.subject_type AND "
        "subject_id = v.subject_id) OR "
        f"(subject_type = {_literal(LEDGER_WIDE.type)} AND "
        f"subject_id = {_literal(LEDGER_WIDE.id)})) OFFSET 0) "
        f"AND NOT EXISTS (SELECT 1 FROM {_OP} o WHERE o.idempotency_fp = v.idempotency_fp "
        f"AND o.state IN ({', '.join(_literal(state) for state in _BLOCKING)}) OFFSET 0)"
    )
    return sql, [packed_values(key, subject, row, fence, ordinal, state, seq), *fenced_params]


def packed_values(key, subject: Subject, row: dict, fence: Fence, ordinal, state, seq) -> str:
    """The JSON parameter of :func:`_insert_sql_packed`: the operation row's values."""
    return json.dumps(
        {
            "key": key,
            "subject_type": subject.type,
            "subject_id": subject.id,
            **{column: row[column] for column in _RECORDED},
            "lease_key": fence.key,
            "fence": fence.fence,
            "ordinal": ordinal,
            "state": state,
            "chain_seq": seq,
        }
    )


def _exists(key: str) -> OperationExists:
    return OperationExists(
        f"Operation {key} is already recorded (same definition, step, action, input "
        "and nonce). A retry needs a new attempt ordinal in its nonce."
    )


def why_not_recorded(cursor, key, subject, idempotency_fp, fence) -> Exception:
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
