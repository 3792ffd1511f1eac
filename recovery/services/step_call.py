"""A step's ledger writes in one server call: step k observed, step k+1 recorded (ADR 0031).

When an engine commit records what step k's provider answered and, in the same commit,
the dispatch boundary of step k+1 (ADR 0006), the ledger writes are an observation of one
operation followed by the recording of the next, each with its checkpoint. Sent one by one
that is seven statements (the operation and its subject's rows, the chain, the
compare-and-swap, a checkpoint; the head, the fenced insert, a checkpoint). Here,
where the dialect allows it (PostgreSQL: ``Dialect.step_call``):

1. the reads the observation needs are made in one statement — the operation, its subject's
   operations, and for a success the whole chain, verified in Python (I7);
2. both checkpoints are computed in Python after the verified head (``chain.prepare``:
   canonical fact, fingerprint, keyed link — the chain key never leaves the process);
3. one call of ``recovery_observe_record`` (migration 0011) writes both moves and both
   checkpoints, checking inside it the head the links were computed against, the fence,
   the open incidents and the effect's earlier operations — the same conditions as the
   separate statements;
4. a write that matched nothing is explained with the same questions, and raised as the
   same error (``StaleFence``, ``ChainConflict``, ``IntegrityIncidentOpen``,
   ``LedgerDisagrees``, ``OperationExists``, ``InvalidTransition``).

The caller's own rows may go in front of the call, in its statement (``first``,
:class:`FirstWrites`: data-modifying ``WITH`` parts, each fenced): the call runs only if
every part matched, and a part that matched nothing is raised as its own write alone would
raise it (ADR 0031 for one row, 0047 for the engine's whole step rows).

Every error raised by :func:`operation_observe_record` carries ``ledger_write``:
``"observe"`` when step k's observation was refused, ``"record"`` when only step k+1's
dispatch was. Elsewhere (SQLite, or inside :func:`recovery.db.multi_statement`) it is
:func:`operation_observe` then :func:`operation_record`: the rows, fingerprints and links
are the same (``tests/integration/test_step_call.py`` proves it on random step sequences).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import connection

from .. import chain
from ..canonical import FingerprintKind, fingerprint_value
from ..db import atomic, one_call_steps
from ..errors import OperationNotFound, RecoveryError, RecoveryValidationError
from ..keys import operation_key
from ..states import OBSERVABLE, OperationState
from ..subjects import LEDGER_WATERMARK, Subject
from ._ledger import (
    OP_TABLE,
    ROW,
    SUCCESS,
    RecordedOperation,
    _require_own_lease,
    _why_not,
    check_target,
    load_row,
    marked_since,
    opening_incidents,
    require_live,
    verified_head,
)
from .dispatch_write import _BLOCKING, _RECORDED
from .dispatch_write import why_not_recorded as _why_not_recorded
from .first_writes import FirstWrites, RowWrite
from .leases import Fence
from .operations import (
    _check_record,
    _recorded_fact,
    _unchanged,
    operation_observe,
    operation_record,
)

__all__ = ["FirstWrites", "Observation", "RowWrite", "operation_observe_record"]


@dataclass(frozen=True)
class Observation:
    """What :func:`operation_observe` would be called with, held for a joint write."""

    key: str
    state: str
    fence: Fence
    result: Any = None
    projection_fp: str = ""
    by: str = ""

    def write(self) -> RecordedOperation:
        """Write it alone (:func:`operation_observe`; needs nothing of the caller's)."""
        return operation_observe(
            key=self.key,
            state=self.state,
            fence=self.fence,
            result=self.result,
            projection_fp=self.projection_fp,
            by=self.by,
        )


def _tagged(exc: BaseException, part: str) -> BaseException:
    if isinstance(exc, RecoveryError) and not hasattr(exc, "ledger_write"):
        exc.ledger_write = part  # type: ignore[attr-defined]
    return exc


def operation_observe_record(
    *,
    observation: Observation,
    record: dict[str, Any],
    projection_fp: str = "",
    first: FirstWrites | None = None,
) -> tuple[RecordedOperation, RecordedOperation]:
    """Observe one operation and record the next in the caller's transaction.

    ``record`` holds :func:`operation_record`'s keyword arguments; ``projection_fp`` is the
    one its checkpoint carries; ``first``, writes of the caller's own made before them
    (the engine's step going ``executing``, or its step rows with the next step inserted
    ``executing``: :class:`FirstWrites`). Equivalent to ``first.write(fence)``,
    ``observation.write()`` and ``operation_record(**record, projection_fp=projection_fp)``
    one after the other, all or nothing, with the same errors (the ledger's tagged with
    ``ledger_write``); on PostgreSQL the writes are one server call.
    """
    joinable = record["fence"] == observation.fence and not record.get("compensation")
    if not (one_call_steps() and joinable):
        return _separately(observation, record, projection_fp, first)
    with opening_incidents(), atomic(), connection.cursor() as cursor:
        try:
            loaded = _observation_prepared(cursor, observation)
        except RecoveryError as exc:
            raise _tagged(exc, "observe") from None
        if loaded is None:  # an identical repeat: step k is as observed already
            if first is not None:
                first.write(observation.fence)
            row = load_row(cursor, observation.key)
            return _unchanged(row), _record_alone(record, projection_fp)
        row, observed, target = loaded
        if observed.subject != record["subject"]:
            raise RecoveryValidationError("A joint observe-and-record stays on one chain.")
        return _call(cursor, observation, (row, observed, target), record, projection_fp, first)


def _separately(observation, record, projection_fp, first):
    """The writes one after the other, all or nothing (the caller's transaction, or a
    savepoint of their own)."""
    with opening_incidents(), atomic():
        if first is not None:
            first.write(observation.fence)
        try:
            observed = observation.write()
        except RecoveryError as exc:
            raise _tagged(exc, "observe") from None
        return observed, _record_alone(record, projection_fp)


def _record_alone(record: dict[str, Any], projection_fp: str) -> RecordedOperation:
    try:
        return operation_record(**record, projection_fp=projection_fp)
    except RecoveryError as exc:
        raise _tagged(exc, "record") from None


def _observation_prepared(cursor, observation: Observation):
    """The reads and checks of :func:`operation_observe`, and its checkpoint computed.

    Returns None for an identical repeat (the fence checked, nothing to write), else the
    loaded row, the prepared checkpoint and the target state with its result fingerprint.
    """
    state = observation.state
    if state not in OBSERVABLE:
        raise RecoveryValidationError(
            f"{state!r} is not an observable state; use succeeded, failed, pending or "
            "outcome_unknown."
        )
    state = str(state)
    result = observation.result
    result_fp = "" if result is None else fingerprint_value(FingerprintKind.RESULT, result)
    since = marked_since(observation.fence) if state in SUCCESS else None
    if state in SUCCESS:
        row, subject_rows, checkpoints = _load_for_success(cursor, observation.key, since)
    else:
        row, subject_rows = load_row(cursor, observation.key), None
    subject = Subject(row["subject_type"], row["subject_id"])
    if not check_target(row, state, result_fp):
        require_live(cursor, row, observation.fence)
        return None
    if state in SUCCESS:
        head = verified_head(
            cursor,
            subject,
            subject_rows,
            checkpoints=checkpoints,
            fence=observation.fence,
            since=since,
        )
    else:
        head = chain.read_head(cursor, subject)
    _require_own_lease(row, observation.fence)
    fact = {
        "operation": row["key"],
        "state": state,
        "revision": row["revision"] + 1,
        "result_fp": result_fp,
        "by_fence": observation.fence.fence,
        **({"by": observation.by} if observation.by else {}),
    }
    prepared = chain.prepare(subject, head, "operation.observed", fact, observation.projection_fp)
    return row, prepared, (state, result_fp)


_CALL = (
    "SELECT recovery_observe_record(%s, %s, %s::bigint, %s, %s, %s, %s::bigint, %s::bigint, "
    "%s, %s::integer, %s, %s, %s::boolean, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s::integer, "
    "%s, %s::text[], %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
)


def _call(cursor, observation, loaded, record, projection_fp, first):
    """Step k+1's operation and checkpoint prepared, then the one call (needs the
    caller's transaction: a refused write is explained, then rolled back with it)."""
    row, observed, (state, result_fp) = loaded
    fence: Fence = observation.fence
    subject: Subject = observed.subject
    try:
        key, values, fact = _record_prepared(record, fence)
    except RecoveryError as exc:
        raise _tagged(exc, "record") from None
    recorded = chain.prepare(subject, observed.head, "operation.recorded", fact, projection_fp)
    observe = [row["id"], row["state"], row["revision"], state, result_fp, state in SUCCESS]
    dispatch = [key, *(values[c] for c in _RECORDED), record["ordinal"], values["state"]]
    arguments = [
        *(subject.type, subject.id, observed.seq - 1, observed.prev_link),
        *(fence.key, fence.holder, fence.fence),
        *observe,
        *dispatch,
        *(list(_BLOCKING), LEDGER_WATERMARK.type, LEDGER_WATERMARK.id, observed.key_id),
        *observed.row()[3:6],
        *(observed.link, observed.projection_fp),
        *recorded.row()[3:6],
        *(recorded.link, recorded.projection_fp),
    ]
    sql, params = _CALL, []
    if first is not None:
        # The caller's rows first, in the same statement: the call runs only if they all
        # matched; what each matched comes back beside the call's answer.
        parts, params, results, matched = first.parts(fence)
        sql = (
            f"WITH {', '.join(parts)} SELECT CASE WHEN {matched} THEN "
            f"({_CALL.removeprefix('SELECT ')}) ELSE 'row' END, {', '.join(results)}"
        )
    cursor.execute(sql, [*params, *arguments])
    refused, *took = cursor.fetchone()
    if first is not None:
        first.took(fence, took)  # a part that matched nothing is raised as alone
        if refused == "row":  # nothing refused, one part merely matched no row: as alone
            return _call(cursor, observation, loaded, record, projection_fp, None)
    if refused:
        raise _explained(cursor, refused, row, state, observed, (key, values), fence)
    return (
        RecordedOperation(row["key"], subject, state, row["revision"] + 1, observed.seq, result_fp),
        RecordedOperation(key, subject, values["state"], 1, recorded.seq),
    )


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


def _load_for_success(cursor, key: str, since: int | None = None):
    """The operation, its subject's operations and its subject's chain: one statement.

    What ``load_with_subject`` and ``load_checkpoints`` read for a success's verification,
    in one round trip: checkpoints first (in ``seq`` order), then operations, padded with
    NULLs to one row shape. With ``since`` (the run's verified mark, ADR 0034): the
    checkpoints from it on, the operations past it and the operation itself.
    """
    mine = [f"k.{c}" for c in ROW]
    ops = [f"o.{c}" for c in chain.OP_COLUMNS]
    width = len(_CHECKPOINT_READ)
    nulls = ", ".join("NULL" for _ in range(len(ops) + len(mine)))
    blanks = ", ".join("NULL" for _ in range(width))
    tail = "" if since is None else " AND c.seq >= %s"
    sql = (
        f"SELECT 0 AS part, {', '.join(f'c.{c}' for c in _CHECKPOINT_READ)}, {nulls} "
        f"FROM {chain.CHECKPOINT_TABLE} c JOIN {OP_TABLE} k ON c.subject_type = k.subject_type "
        f"AND c.subject_id = k.subject_id WHERE k.key = %s{tail} "
        f"UNION ALL SELECT 1, {blanks}, {', '.join(ops + mine)} "
        f"FROM {OP_TABLE} o JOIN {OP_TABLE} k ON o.subject_type = k.subject_type "
        f"AND o.subject_id = k.subject_id WHERE k.key = %s"
    )
    params = [key, key]
    if since is not None:
        # Past the mark by the (subject, chain_seq) index, and the operation itself: two
        # parts, so neither reads the subject's older operations.
        k_ops = [f"k.{c}" for c in chain.OP_COLUMNS]
        sql += (
            f" AND o.chain_seq > %s UNION ALL SELECT 1, {blanks}, {', '.join(k_ops + mine)} "
            f"FROM {OP_TABLE} k WHERE k.key = %s AND k.chain_seq <= %s"
        )
        params = [key, since, key, since, key, since]
    cursor.execute(f"{sql} ORDER BY 1, 2", params)
    rows = cursor.fetchall()
    checkpoints = [r[1 : 1 + width] for r in rows if r[0] == 0]
    operations = [r[1 + width :] for r in rows if r[0] == 1]
    n = len(chain.OP_COLUMNS)
    row = next((r for r in operations if r[0] == key), None)
    if row is None:
        raise OperationNotFound(f"No ledger operation has key {key!r}.")
    return dict(zip(ROW, row[n:], strict=True)), [r[:n] for r in operations], checkpoints
