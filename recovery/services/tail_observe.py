"""A success inside the caller's transaction, its run's tail checked in its write (ADR 0076).

:func:`operation_observe` inside a transaction reads what a success verifies — the
operation, its subject's operations, and the checkpoints after the run's mark (or the
whole chain) — and verifies them in Python before it writes. When the run knows those
rows because it wrote them (``chain.mark_wrote``, ADR 0040), one call of
``recovery_tail_observe`` (migration 0027) instead checks, inside its write, that the
stored rows are exactly the ones the run wrote, as the standalone success does outside any
transaction (``lone.observe_alone``), and writes the move and its checkpoint.

When the run's owner asked for the whole chain (``chain.mark_whole``: the commit that ends
an instance, ADR 0038) and the run's mark knows it from its beginning (``Mark.genesis``),
the comparison is every stored checkpoint and operation row of the subject: the whole
chain's verification, made by the server. Otherwise it is the tail past the mark.

Anything the call finds other than as written writes nothing, and the caller reads and
verifies as before in the same transaction (so every refusal is explained as always): the
answer is None. A checkpoint position taken by another writer after the move raises the
chain conflict the read path raises; the caller's transaction rolls back.
"""

from __future__ import annotations

from typing import Any

from .. import chain
from ..db import one_call_steps
from ..kept import default_db
from ._ledger import SUCCESS, RecordedOperation
from .first_writes import FirstWrites
from .leases import Fence, mark_forget_when_released
from .lone import observed_after, tail_known
from .step_parts import _execute, _remember

_CALL = (
    "SELECT recovery_tail_observe(%s, %s, %s::bigint, %s, %s, %s, %s, %s, %s::bigint, %s, "
    "%s, %s::integer, %s, %s, %s::bigint, %s, %s, %s, %s, %s, %s, %s, %s::boolean)"
)


def observe_in_tail(
    key: str,
    state: str,
    fence: Fence,
    *,
    result_fp: str,
    input_fp: str | None,
    fact_extra: dict[str, Any],
    projection_fp: str,
    first: FirstWrites | None = None,
    release: bool = False,
) -> tuple[RecordedOperation | None, FirstWrites | None]:
    """:func:`operation_observe`'s success in the caller's transaction as one call, its
    run's written tail (or whole chain) checked inside it, with the caller's rows
    (``first``) in front of it in the same statement.

    Returns the observation, or None when the rows are not known or not as written
    (nothing of the ledger's was written: read and verify instead); and ``first`` when the
    caller's rows are still to write, None once they are written. A part of ``first`` that
    matched nothing raises as its write alone would.

    ``release``: the statement also releases the lease after the checkpoint, and is sent
    alone, in autocommit, as the caller's whole commit (the caller's transaction has sent
    nothing: ``recovery.db.untouched``). Any refusal then aborts it whole: None is
    returned with ``first`` still to write, and the lease held."""
    known = None
    if one_call_steps() and state in SUCCESS:
        known = tail_known(key, state, fence, input_fp, whole_allowed=True)
    if known is None:
        return None, first
    mark, op, tail = known
    subject, revision = mark.subject, op["revision"] + 1
    fact, checkpoint = observed_after(
        mark, key, state, revision, result_fp, fact_extra, projection_fp
    )
    params = [*tail, fence.key, fence.holder, fence.fence, key, op["state"], op["revision"]]
    params += [state, result_fp, *checkpoint.row()[2:], release]
    with default_db().cursor() as cursor:
        refused = _execute(cursor, _CALL, params, first, fence, alone=release)
    if release and refused:  # nothing of the statement was written
        if refused == "tail":
            chain.mark_forget_written(fence)  # not as written
        return None, first
    if refused in ("tail", "row"):  # nothing of the ledger's written: read instead
        if refused == "tail":
            chain.mark_forget_written(fence)  # not as written
        return None, None
    if refused:  # 'chain': the move was made, its checkpoint's position was taken
        raise chain.conflict(subject, checkpoint.seq)
    _remember(fence, mark, [(checkpoint, fact)])
    if release:  # committed with the lease's release: the run is over
        mark_forget_when_released(fence)
    return RecordedOperation(key, subject, state, revision, checkpoint.seq, result_fp), None
