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

Each statement is the body of a server function, ``recovery_lone_record`` and
``recovery_lone_success`` (migration 0016, ADR 0049), planned once per session: sent as
prepared statements, the server planned them anew at every execution whenever its
estimates favoured a custom plan, and that planning was half its CPU per lifecycle.
"""

from __future__ import annotations

from json.encoder import encode_basestring_ascii
from typing import Any

from django.db import IntegrityError, connection

from .. import chain
from ..chain import Head
from ..db import lone_calls
from ..kept import default_db
from ..states import can_transition
from ..subjects import LEDGER_WATERMARK, Subject
from ._ledger import RecordedOperation
from .dispatch_write import _RECORDED, BLOCKING_ARRAY
from .leases import Fence


def alone() -> bool:
    """Whether a ledger call here may be one autocommit statement: PostgreSQL's one-call
    path (not inside ``multi_statement`` or ``transactions_only``), outside any transaction."""
    if not lone_calls():
        return False
    db = default_db()
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


_RECORD = (
    "SELECT recovery_lone_record(%s, %s, %s::bigint, %s, %s::boolean, %s, %s, %s, %s, %s, %s, "
    "%s, %s, %s, %s, %s, %s::bigint, %s::integer, %s, %s, %s, %s::text[], %s::bigint, %s, %s, "
    "%s, %s, %s, %s, %s)"
)
_SUCCESS = (
    "SELECT recovery_lone_success(%s, %s, %s::bigint, %s, %s, %s, %s, %s, %s::integer, %s, "
    "%s::integer, %s, %s, %s, %s::bigint, %s::bigint, %s, %s, %s, %s, %s, %s, %s)"
)
"""The two statements of ADR 0040, as functions planned once per session (migration 0016,
ADR 0049): a prepared statement sent from here was planned anew at every execution
whenever the server's estimates favoured custom plans."""


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
    params = [subject.type, subject.id, head.seq, head.link, fresh, key]
    params += [row[column] for column in _RECORDED]
    params += [fence.key, fence.holder, fence.fence, ordinal, state]
    params += [LEDGER_WATERMARK.type, LEDGER_WATERMARK.id, BLOCKING_ARRAY]
    if not _run(_RECORD, [*params, *checkpoint.row()[2:]]):
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
    known = tail_known(key, state, fence, input_fp, whole_allowed=False)
    if known is None:
        return None
    mark, op, tail = known
    subject, revision = mark.subject, op["revision"] + 1
    fact, checkpoint = observed_after(
        mark, key, state, revision, result_fp, fact_extra, projection_fp
    )
    params = [*tail, key, op["state"], op["revision"], state, revision]
    params += [result_fp, fence.key, fence.holder, fence.fence]
    if not _run(_SUCCESS, [*params, *checkpoint.row()[2:]]):
        chain.mark_forget_written(fence)
        return None
    chain.mark_verified_through(fence, mark)
    chain.mark_wrote(fence, checkpoint, fact)
    return RecordedOperation(key, subject, state, revision, checkpoint.seq, result_fp)


def tail_known(key: str, state: str, fence: Fence, input_fp: str | None, *, whole_allowed: bool):
    """The run's mark, operation ``key`` as the run wrote it and the joined rows
    (:func:`tail_joined`), when a success of it may be checked against them instead of
    reading them: the run wrote the operation under this lease, the observation is a move
    it allows, and ``input_fp`` (if given) is the recorded one. While a whole verification
    is asked (``chain.mark_whole``) only with ``whole_allowed`` and a mark that knows its
    whole chain (ADR 0076). Else None: read and verify instead."""
    mark = chain.mark_peek(fence)
    op = None if mark is None else mark.touched.get(key)
    whole = chain.whole_asked(fence)
    if (
        op is None
        or (whole and (not whole_allowed or mark.genesis is None))
        or op["lease"] != fence.key
        or (input_fp is not None and input_fp != op["input_fp"])
        or op["state"] == state
        or not can_transition(op["state"], state)
    ):
        return None
    tail = tail_joined(mark, whole=whole)  # None: a field the server cannot tell apart
    return None if tail is None else (mark, op, tail)


def observed_after(mark, key, state, revision, result_fp, fact_extra, projection_fp):
    """The ``operation.observed`` fact of a success and its checkpoint after the run's
    head (``chain.prepare``)."""
    fact = {"operation": key, "state": state, "revision": revision, "result_fp": result_fp}
    fact |= fact_extra
    head = Head(*mark.head)
    return fact, chain.prepare(mark.subject, head, "operation.observed", fact, projection_fp)


def tail_joined(mark, *, whole: bool = False) -> list[Any] | None:
    """The first parameters of ``recovery_lone_success``, ``recovery_tail_observe_record``
    (migration 0026) and ``recovery_tail_observe`` (migration 0027): the subject, the
    mark's checkpoint, then every checkpoint and every operation row past the mark as the
    run wrote them, as two joined texts (:func:`joined_rows`) that each function compares
    with the stored rows joined the same way. None when either cannot be joined: the
    caller then reads and verifies the tail instead.

    ``whole`` (a mark that knows its chain from the beginning, ``Mark.genesis``; only for
    ``recovery_tail_observe``): every checkpoint and every operation of the subject, after
    a mark at #0 — the whole chain (ADR 0076)."""
    cps, ops = _tail_rows(mark, whole)
    checkpoints, operations = joined_rows(cps), joined_rows(ops)
    if checkpoints is None or operations is None:
        return None
    subject = mark.subject
    seq, link = (0, chain.EMPTY.link) if whole else (mark.seq, mark.link)
    return [subject.type, subject.id, seq, link, checkpoints, operations]


def _tail_rows(mark, whole: bool = False) -> tuple[list[list[str]], list[list[str]]]:
    """The checkpoints and operation rows past the mark as the run wrote them (``whole``:
    all of them since the chain's beginning), each row its columns as texts, in the order
    the server's functions aggregate them."""
    cps = [[str(c.seq), *c.row()[3:]] for c in mark.written]
    if whole:
        cps = [*mark.genesis, *cps]
    touched = mark.ops | mark.touched if whole else mark.touched
    ops = [
        [key, *(str(touched[key][field]) for _, field in chain.COMPARED)] for key in sorted(touched)
    ]
    return cps, ops


FIELD, ROW = "\x1f", "\x1e"
"""What :func:`joined_rows` joins a row's fields and the rows with: the unit and the
record separator, as the server's ``concat_ws`` and ``string_agg`` (migration 0026)."""


def joined_rows(rows: list[list[str]]) -> str | None:
    """Each row's fields joined by :data:`FIELD`, the rows by :data:`ROW`: the server's
    ``string_agg(concat_ws(E'\\x1f', …), E'\\x1e')`` of the same texts. None when a field is
    None or holds a separator: only a text whose separators are all its own boundaries is
    equal to the stored rows' exactly when every field is."""
    try:
        text = ROW.join([FIELD.join(row) for row in rows])
    except TypeError:  # a None, which the run never writes
        return None
    fields = sum(map(len, rows))
    if text.count(FIELD) != fields - len(rows) or text.count(ROW) != max(len(rows) - 1, 0):
        return None
    return text


def json_text(texts: list[str]) -> str:
    """The JSON array of ``texts`` (strings), compact and ASCII: what
    ``json.JSONEncoder(separators=(",", ":")).encode`` writes, each string quoted by the
    encoder's own C function, without the encoder object that ``encode`` builds anew at
    every call (three per chained step)."""
    return "[" + ",".join(map(encode_basestring_ascii, texts)) + "]"
