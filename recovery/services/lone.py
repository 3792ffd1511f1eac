"""A standalone ledger call as one statement, its own implicit transaction (ADR 0040).

A caller outside any transaction (a standalone worker, ``bench/ledger.py``) that records an
operation and then observes its success makes two commits. Sent as Django transactions,
each is ``BEGIN``, a read, the write and ``COMMIT``: the dispatch write reads the chain's
head (the next link is keyed in Python, so the previous link must be known first), the
success reads its operation, the subject's operations and the chain after the run's mark
and verifies them (I7, ADR 0034). Here, on PostgreSQL's one-call path, each commit is one
statement in autocommit — one round trip, one server transaction — because the process
already knows what those reads would return:

1. **The head is the run's own last write** (``chain.mark_wrote``): the dispatch write is
   conditional on it (the checkpoint at that position still has that link, none follows).
   A run's first write on a subject assumes the empty chain, on the condition that the
   subject has no checkpoint and no operation.
2. **The success checks the tail inside its write.** Everything the run wrote after its
   verified mark is known row for row; the success's ``UPDATE`` and checkpoint are made only
   if the mark's checkpoint still has its link, each written checkpoint is stored exactly as
   written, none follows, and the subject's operation rows past the mark are exactly the
   ones the written tail touched, with the replayed values. That is what reading those rows
   and replaying them would verify (``verify_tail``). For a run whose writes make the whole
   chain (it began empty), it is the whole chain's verification.

Any condition that fails writes nothing and the call goes the transaction path
(``operations.py``): it reads, verifies and raises the same errors as before, or succeeds
where only this process's knowledge was out of date. The same happens when the checkpoint
insert loses the (subject, seq) compare-and-swap: the unique constraint's error aborts the
statement, operation and all.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from django.db import DEFAULT_DB_ALIAS, IntegrityError, connection, connections

from .. import chain
from ..chain import Head
from ..db import dialect, lone_calls
from ..states import can_transition
from ..subjects import Subject
from ._ledger import INCIDENT_TABLE, OP_TABLE, RecordedOperation
from .dispatch_write import _insert_sql
from .leases import Fence, fence_condition

_CP = chain.CHECKPOINT_TABLE
_SUBJECT = "subject_type = %s AND subject_id = %s"


def alone() -> bool:
    """Whether a ledger call here may be one autocommit statement: PostgreSQL's one-call
    path (not inside ``multi_statement`` or ``transactions_only``), outside any transaction."""
    if not lone_calls():
        return False
    db = connections[DEFAULT_DB_ALIAS]  # one look-up through the thread-local proxy, not two
    return not db.in_atomic_block and db.get_autocommit()


def _run(sql: str, params: list[Any]) -> bool:
    """Run one write; False when its conditions matched nothing (nothing was written) or
    its checkpoint lost the compare-and-swap (the whole statement rolled back)."""
    try:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return bool(cursor.fetchone()[0])
    except IntegrityError:
        return False


def _head_condition(subject: Subject, head: Head, fresh: bool) -> tuple[str, list[Any]]:
    """The chain still ends at ``head``; ``fresh``: and the subject has no operation yet."""
    sql = (
        f"(%s = 0 OR EXISTS (SELECT 1 FROM {_CP} WHERE {_SUBJECT} AND seq = %s AND link = %s)) "
        f"AND NOT EXISTS (SELECT 1 FROM {_CP} WHERE {_SUBJECT} AND seq > %s)"
    )
    params: list[Any] = [head.seq, subject.type, subject.id, head.seq, head.link]
    params += [subject.type, subject.id, head.seq]
    if fresh:
        sql += f" AND NOT EXISTS (SELECT 1 FROM {OP_TABLE} WHERE {_SUBJECT})"
        params += [subject.type, subject.id]
    return sql, params


def _checkpoint_insert() -> str:
    return (
        f"INSERT INTO {_CP} ({chain.CHECKPOINT_COLUMNS}, recorded_at) "
        f"SELECT %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, {dialect().now}"
    )


def record_alone(
    key: str,
    row: dict,
    fact: dict[str, Any],
    *,
    subject: Subject,
    fence: Fence,
    ordinal: int,
    state: str,
    projection_fp: str,
) -> RecordedOperation | None:
    """:func:`operation_record`'s write as one statement after the run's known head; None
    when it wrote nothing (the caller takes the transaction path)."""
    mark = chain.mark_peek(fence)
    fresh = mark is None or mark.subject != subject
    head = chain.EMPTY if fresh else Head(*mark.head)
    checkpoint = chain.prepare(subject, head, "operation.recorded", fact, projection_fp)
    insert, params = _insert_sql(key, subject, row, fence, ordinal, state, checkpoint.seq)
    condition, head_params = _head_condition(subject, head, fresh)
    sql = (
        f"WITH ok AS (SELECT {condition} AS ok), "
        f"op AS ({insert} AND (SELECT ok FROM ok) ON CONFLICT (key) DO NOTHING RETURNING 1), "
        f"cp AS ({_checkpoint_insert()} WHERE EXISTS (SELECT 1 FROM op) RETURNING 1) "
        "SELECT EXISTS (SELECT 1 FROM op) AND EXISTS (SELECT 1 FROM cp)"
    )
    if not _run(sql, [*head_params, *params, *checkpoint.row()]):
        chain.mark_forget_written(fence)
        return None
    chain.mark_wrote(fence, checkpoint, fact, fresh=fresh)
    return RecordedOperation(
        key=key, subject=subject, state=state, revision=1, chain_seq=checkpoint.seq
    )


def observe_alone(
    key: str,
    state: str,
    fence: Fence,
    *,
    result_fp: str,
    input_fp: str | None,
    fact_extra: dict[str, Any],
    projection_fp: str,
) -> RecordedOperation | None:
    """A success as one statement, verified inside its write against what the run wrote
    after its mark; None when that is not known or the write matched nothing."""
    mark = chain.mark_peek(fence)
    op = None if mark is None else mark.touched.get(key)
    if (
        op is None
        or op["lease"] != fence.key
        or (input_fp is not None and input_fp != op["input_fp"])
        or op["state"] == state
        or not can_transition(op["state"], state)
    ):
        return None
    subject, revision = mark.subject, op["revision"] + 1
    fact = {"operation": key, "state": state, "revision": revision, "result_fp": result_fp}
    fact |= fact_extra
    checkpoint = chain.prepare(subject, Head(*mark.head), "operation.observed", fact, projection_fp)
    fenced, fenced_params = fence_condition(fence)
    params = [*_tail_params(mark), state, revision, result_fp, checkpoint.seq, key]
    params += [op["state"], op["revision"], *fenced_params, subject.type, subject.id]
    sql = _success_sql(fenced)
    if not _run(sql, [*params, *checkpoint.row()]):
        chain.mark_forget_written(fence)
        return None
    chain.mark_verified_through(fence, mark)
    chain.mark_wrote(fence, checkpoint, fact)
    return RecordedOperation(key, subject, state, revision, checkpoint.seq, result_fp)


def _tail_params(mark) -> list[Any]:
    """The parameters of :func:`_success_sql`'s tail condition, in its order: the mark's
    checkpoint, then every checkpoint and every operation row past the mark as the run
    wrote them (each row an array of texts, in the order the statement aggregates them),
    each list sent as one JSON text: one parameter the driver passes through as it is,
    where a ``text[]`` of arrays is dumped element by element in Python."""
    subject = mark.subject
    cps = [[str(c.seq), *c.row()[3:]] for c in mark.written]
    ops = [
        [key, *(str(mark.touched[key][field]) for _, field in chain.COMPARED)]
        for key in sorted(mark.touched)
    ]
    params: list[Any] = [mark.seq, subject.type, subject.id, mark.seq, mark.link]
    params += [subject.type, subject.id, mark.seq, _json(cps)]
    params += [subject.type, subject.id, mark.seq, _json(ops)]
    return params


_json = json.JSONEncoder(separators=(",", ":")).encode
"""JSON text of a list of lists of strings (C-encoded; ASCII, so any text survives)."""

_CP_TEXT = ", ".join(f"c.{c.strip()}::text" for c in chain.CHECKPOINT_COLUMNS.split(",")[2:])
_OP_TEXT = ", ".join(f"o.{column}::text" for column in chain.OP_COLUMNS)
# Each aggregate compared as jsonb: equal when every row has the same texts in the same
# order (jsonb compares arrays element by element and strings exactly); no rows is NULL,
# never equal to what a run wrote (it always wrote something past its mark).


@functools.lru_cache(maxsize=4)
def _success_sql(fenced: str) -> str:
    """The success's one statement: the tail condition, the compare-and-swap, the checkpoint.

    The tail condition: the mark's checkpoint still has its link, and the checkpoints and
    the operation rows past the mark, aggregated in order, equal what the run wrote — so
    none is missing, changed or added."""
    tail = (
        f"(%s = 0 OR EXISTS (SELECT 1 FROM {_CP} WHERE {_SUBJECT} AND seq = %s AND link = %s)) "
        f"AND (SELECT jsonb_agg(jsonb_build_array({_CP_TEXT}) ORDER BY c.seq) FROM {_CP} c "
        "WHERE c.subject_type = %s AND c.subject_id = %s AND c.seq > %s) = %s::jsonb "
        f'AND (SELECT jsonb_agg(jsonb_build_array({_OP_TEXT}) ORDER BY o.key COLLATE "C") '
        f"FROM {OP_TABLE} o "
        "WHERE o.subject_type = %s AND o.subject_id = %s AND o.chain_seq > %s) = %s::jsonb"
    )
    return (
        f"WITH ok AS (SELECT {tail} AS ok), "
        f"up AS (UPDATE {OP_TABLE} SET state = %s, revision = %s, result_fp = %s, "
        f"chain_seq = %s, updated_at = {dialect().now} WHERE key = %s AND state = %s "
        f"AND revision = %s AND {fenced} AND NOT EXISTS (SELECT 1 FROM {INCIDENT_TABLE} "
        f"WHERE {_SUBJECT} AND status = 'open') AND (SELECT ok FROM ok) RETURNING 1), "
        f"cp AS ({_checkpoint_insert()} WHERE EXISTS (SELECT 1 FROM up) RETURNING 1) "
        "SELECT EXISTS (SELECT 1 FROM up) AND EXISTS (SELECT 1 FROM cp)"
    )
