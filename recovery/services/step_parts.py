"""What a chained step's ledger call is made of (ADR 0031, 0051), for ``step_call``.

Computed in Python before the call — the next operation's values and fact, the two
checkpoints' facts, the call's arguments — and around it: the statement with the caller's
rows in front of it and, sent alone, its refusal raised (``_execute``); what the run
remembers once the commit is made (``_remember``); the read a success needs when the
run's written tail is not known (``_load_for_success``); and a refusal explained by the
same questions the separate writes ask (``_explained``).
"""

from __future__ import annotations

from typing import Any

from django.db import DatabaseError, transaction

from .. import chain
from ..db import sent_alone
from ..errors import OperationNotFound, RecoveryError
from ..keys import operation_key
from ..shared_commits import lone_statement
from ..states import OperationState
from ..subjects import LEDGER_WATERMARK
from ._ledger import OP_TABLE, ROW, _why_not, subject_of
from .dispatch_write import _RECORDED, BLOCKING_ARRAY
from .dispatch_write import why_not_recorded as _why_not_recorded
from .leases import Fence
from .lone import json_text
from .operations import _check_record, _recorded_fact, observed_extra


def _tagged(exc: BaseException, part: str) -> BaseException:
    if isinstance(exc, RecoveryError) and not hasattr(exc, "ledger_write"):
        exc.ledger_write = part  # type: ignore[attr-defined]
    return exc


def _observed_fact(observation, state: str, revision: int, result_fp: str) -> dict:
    """The ``operation.observed`` fact of ``observation`` (as ``operation_observe`` writes it)."""
    return {
        "operation": observation.key,
        "state": state,
        "revision": revision,
        "result_fp": result_fp,
        **observed_extra(observation.fence, observation.by),
    }


def _next_prepared(record, fence, observed, projection_fp):
    """Step k+1's operation, fact and checkpoint after ``observed``, checked (no database)."""
    try:
        key, values, fact = _record_prepared(record, fence)
    except RecoveryError as exc:
        raise _tagged(exc, "record") from None
    recorded = chain.prepare(
        observed.subject, observed.head, "operation.recorded", fact, projection_fp
    )
    return key, values, fact, recorded


def _recorded_arguments(record, key, values, observed, recorded, packed=False) -> list[Any]:
    """The call's arguments after step k's: step k+1's operation, both checkpoints; with
    ``packed``, the operation as one JSON array of texts, the checkpoints' kinds,
    fingerprints, links and projections as another, then their two facts as plain texts
    (migrations 0018, 0021: a fact is JSON itself, and inside a JSON text every quote of it
    would be escaped and unescaped again)."""
    operation = [key, *(values[c] for c in _RECORDED), record["ordinal"], values["state"]]
    constants = [BLOCKING_ARRAY, LEDGER_WATERMARK.type, LEDGER_WATERMARK.id, observed.key_id]
    if packed:
        operation[-2] = str(operation[-2])
        links = [
            *(observed.kind, observed.fact_fp, observed.link, observed.projection_fp),
            *(recorded.kind, recorded.fact_fp, recorded.link, recorded.projection_fp),
        ]
        return [json_text(operation), *constants, json_text(links), observed.fact, recorded.fact]
    links = [
        *observed.row()[3:6],
        *(observed.link, observed.projection_fp),
        *recorded.row()[3:6],
        *(recorded.link, recorded.projection_fp),
    ]
    return [*operation, *constants, *links]


def _execute(cursor, call: str, arguments: list[Any], first, fence: Fence, alone=False) -> str:
    """Send the call, with the caller's rows in front of it (``first``): the call runs
    only if they all matched; what each matched comes back beside the call's answer, and
    a part that matched nothing is raised as its write alone would raise it. Returns the
    call's answer ('' when everything was written), or 'row' when a part merely matched
    no row and the call did not run.

    With ``alone`` the statement goes in autocommit and any answer but '' aborts it
    (``recovery_all_written``, migration 0018): the answer is returned and nothing of the
    statement, the caller's rows included, was written. Where commits are shared (ADR
    0062) it may commit with other threads' lone statements; its answer is the same."""
    answer = call.removeprefix("SELECT ")
    params: list[Any] = []
    results: list[str] = []
    if first is not None:
        parts, params, results, matched = first.parts(fence)
        answer = f"CASE WHEN {matched} THEN ({answer}) ELSE 'row' END"
    if alone:
        answer = f"recovery_all_written({answer})"
    sql = f"SELECT {', '.join([answer, *results])}"
    if first is not None:
        sql = f"WITH {', '.join(parts)} {sql}"
    if not alone:
        cursor.execute(sql, [*params, *arguments])
        row = cursor.fetchone()
    else:
        try:
            with sent_alone():
                row = lone_statement(cursor, sql, [*params, *arguments])
        except DatabaseError as exc:
            cause = exc.__cause__
            if getattr(cause, "sqlstate", None) != REFUSED:
                raise
            return cause.diag.message_detail
    refused, *took = row
    if first is not None:
        first.took(fence, took)
    return refused


REFUSED = "GF001"
"""The SQLSTATE of ``recovery_all_written``: a call sent alone refused, nothing written."""


def _remember(fence: Fence, mark, written) -> None:
    """Once the caller's transaction commits, the run's mark knows the checkpoints this
    call wrote (ADR 0040, 0051): the next chained step checks them inside its call instead
    of reading them back. With ``mark``, the call found the stored rows past it as the run
    had written them: the mark moves over them first. Rolled back, nothing is remembered."""
    expected = None if mark is None else list(mark.written)

    def committed() -> None:
        if mark is not None:
            if chain.mark_peek(fence) is not mark or mark.written != expected:
                chain.mark_forget_written(fence)  # another write of the run's came between
                return
            chain.mark_verified_through(fence, mark)
        for checkpoint, fact in written:
            chain.mark_wrote(fence, checkpoint, fact)

    transaction.on_commit(committed)


def _explained(cursor, refused, row, state, observed, dispatched, fence) -> Exception:
    """Why the call wrote nothing (failure path only): the separate writes' own answers."""
    subject = observed.subject
    if refused == "record":
        key, values = dispatched
        why = _why_not_recorded(cursor, key, subject, values["idempotency_fp"], fence)
        return _tagged(why, "record")
    if refused == "observe":
        return _tagged(_why_not(cursor, row, state, fence, subject), "observe")
    # 'head' or 'chain': someone appended to the chain first
    return _tagged(chain.conflict(subject, observed.seq), "observe")


def _record_prepared(record: dict[str, Any], fence: Fence):
    """What :func:`operation_record` checks and derives before its insert (no database)."""
    fps = {name: record[name] for name in _RECORDED if name.endswith("_fp")}
    state = str(record.get("state", OperationState.DISPATCHED))
    mode = str(record["recovery_mode"])
    _check_record(fps, mode, state, record["ordinal"])
    key = operation_key(
        definition_fp=record["definition_fp"],
        step_id=record["step_id"],
        action=record["action"],
        input_fp=record["input_fp"],
        nonce=record["nonce"],
    )
    values = {
        "step_id": record["step_id"],
        "action": record["action"],
        "recovery_mode": mode,
        **fps,
        "state": state,
    }
    return key, values, _recorded_fact(key, state, values, fence, record["ordinal"])


_CHECKPOINT_READ = (
    "seq",
    "kind",
    "fact",
    "fact_fp",
    "prev_link",
    "link",
    "key_id",
    "projection_fp",
)


def _load_for_success(cursor, key: str, since: int | None = None, *, sealed: bool = False):
    """The operation, its subject's operations and its subject's chain: one statement.

    What ``load_with_subject`` and ``load_checkpoints`` read for a success's verification,
    in one round trip: checkpoints first (in ``seq`` order), then operations, padded with
    NULLs to one row shape. With ``since`` (the run's verified mark, ADR 0034): the
    checkpoints from it on, the operations past it and the operation itself.

    ``sealed`` (a run with no mark, ADR 0066): from the position of the subject's sealed
    mark, whose row comes last (as ``chain.load_sealed`` returns it), or whole when the
    subject has none. Returns the seal's row as a fourth value then (None: no seal).
    """
    mine = [f"k.{c}" for c in ROW]
    ops = [f"o.{c}" for c in chain.OP_COLUMNS]
    width = len(_CHECKPOINT_READ)
    nulls = ", ".join("NULL" for _ in range(len(ops) + len(mine)))
    blanks = ", ".join("NULL" for _ in range(width))
    # Without a seal, -1: every checkpoint and operation (both start at 0 or later).
    start = "(SELECT coalesce(max(seq), -1) FROM sealed)" if sealed else "%s"
    tail = "" if since is None and not sealed else f" AND c.seq >= {start}"
    sql = (
        f"SELECT 0 AS part, {', '.join(f'c.{c}' for c in _CHECKPOINT_READ)}, {nulls} "
        f"FROM {chain.CHECKPOINT_TABLE} c WHERE {subject_of('c')}{tail} "
        f"UNION ALL SELECT 1, {blanks}, {', '.join(ops + mine)} "
        f"FROM {OP_TABLE} o, {OP_TABLE} k WHERE {subject_of('o')} AND k.key = %s"
    )
    params = [key, key, key]
    if since is not None or sealed:
        # Past the mark by the (subject, chain_seq) index, and the operation itself: two
        # parts, so neither reads the subject's older operations.
        k_ops = [f"k.{c}" for c in chain.OP_COLUMNS]
        sql += (
            f" AND o.chain_seq > {start} UNION ALL SELECT 1, {blanks}, "
            f"{', '.join(k_ops + mine)} FROM {OP_TABLE} k WHERE k.key = %s "
            f"AND k.chain_seq <= {start}"
        )
        params = [key, key, key, key] if sealed else [key, since, key, key, since, key, since]
    if sealed:
        sql = (
            f"WITH sealed AS (SELECT m.seq, m.link, m.ops, m.key_id, m.mac FROM "
            f"{chain.MARK_TABLE} m WHERE {subject_of('m')}) {sql} UNION ALL SELECT 2, "
            f"{chain.SEAL_AS_CHECKPOINT}, {nulls} FROM sealed"
        )
        params = [key, *params]
    cursor.execute(f"{sql} ORDER BY 1, 2", params)
    rows = cursor.fetchall()
    checkpoints = [r[1 : 1 + width] for r in rows if r[0] == 0]
    operations = [r[1 + width :] for r in rows if r[0] == 1]
    n = len(chain.OP_COLUMNS)
    row = next((r for r in operations if r[0] == key), None)
    if row is None:
        raise OperationNotFound(f"No ledger operation has key {key!r}.")
    found = dict(zip(ROW, row[n:], strict=True)), [r[:n] for r in operations], checkpoints
    if sealed:
        return *found, next((r[1 : 1 + width] for r in rows if r[0] == 2), None)
    return found
