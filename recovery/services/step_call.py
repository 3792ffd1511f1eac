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

A run's later chained steps skip step 1's read (ADR 0051): once a chained step's commit
is made, the run's mark remembers the two checkpoints it wrote (``step_parts._remember``),
and the next call is ``recovery_tail_observe_record`` (migration 0018), which first checks
that the stored rows past the mark are exactly the ones the run wrote — what reading and
replaying them would verify — and otherwise writes nothing of the ledger's and answers
``'tail'``: the step then reads and verifies as above, in the same transaction. When the
caller writes nothing after the call (``last``) and nothing was sent in its transaction
before it, that statement is sent alone in autocommit as the whole commit, its refusals
aborting it (``recovery_all_written``); a refusal there is made again in the transaction,
where it is explained as always.

Every error raised by :func:`operation_observe_record` carries ``ledger_write``:
``"observe"`` when step k's observation was refused, ``"record"`` when only step k+1's
dispatch was. Elsewhere (SQLite, or inside :func:`recovery.db.multi_statement`) it is
:func:`operation_observe` then :func:`operation_record`: the rows, fingerprints and links
are the same (``tests/integration/test_step_call.py`` proves it on random step sequences).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import chain
from ..chain import Head
from ..db import atomic, one_call_steps, untouched
from ..errors import RecoveryError, RecoveryValidationError
from ..kept import default_db
from ..states import OBSERVABLE, can_transition
from ..subjects import Subject
from ._ledger import (
    SUCCESS,
    RecordedOperation,
    _require_own_lease,
    check_target,
    load_row,
    marked_since,
    opening_incidents,
    require_live,
    verified_head,
)
from .first_writes import FirstWrites, RowWrite, WithParts
from .leases import Fence, lease_release
from .lone import json_text, tail_joined
from .operations import (
    _success_reads,
    _unchanged,
    observed_extra,
    operation_observe,
    operation_record,
    result_fingerprint,
)
from .step_parts import (
    _execute,
    _explained,
    _next_prepared,
    _observed_fact,
    _recorded_arguments,
    _remember,
    _tagged,
)
from .tail_observe import observe_in_tail

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

    def write(self, first: FirstWrites | None = None) -> RecordedOperation:
        """Write it alone (:func:`operation_observe`; needs nothing of the caller's).

        ``first``: the caller's rows, written first in the same transaction — in front of
        the observation's call when it is one (a success whose run knows its tail, ADR
        0076), else as a statement of their own."""
        if first is not None:
            done, first = self._in_tail(first)
            if done is not None:
                return done
            if first is not None:
                first.write(self.fence)
        return operation_observe(
            key=self.key,
            state=self.state,
            fence=self.fence,
            result=self.result,
            projection_fp=self.projection_fp,
            by=self.by,
        )

    def write_and_release(
        self, first: FirstWrites | None = None, parts: tuple | None = None
    ) -> RecordedOperation:
        """Write it as :meth:`write` does, then release the lease (``lease_release``, with
        the caller's ``parts`` in its statement): the commit that ends a run.

        When the caller's transaction has sent nothing yet and the observation is a
        success whose run knows its rows (ADR 0076), everything is one statement sent
        alone — the caller's rows, its parts, the success with its check, the release —
        and the caller's commit is that statement. Else, or when that statement is refused
        (it then wrote nothing), the same writes in the caller's transaction."""
        if untouched():
            extra, params = parts or ((), ())
            done, _ = self._in_tail(WithParts(first, extra, params), release=True)
            if done is not None:
                return done
        done = self.write(first=first)
        lease_release(fence=self.fence, with_parts=parts)
        return done

    def _in_tail(self, first: FirstWrites, release: bool = False):
        """``tail_observe.observe_in_tail`` of this observation, ``first`` in front."""
        return observe_in_tail(
            self.key,
            self.state,
            self.fence,
            result_fp=result_fingerprint(self.result),
            input_fp=None,
            fact_extra=observed_extra(self.fence, self.by),
            projection_fp=self.projection_fp,
            first=first,
            release=release,
        )


def operation_observe_record(
    *,
    observation: Observation,
    record: dict[str, Any],
    projection_fp: str = "",
    first: FirstWrites | None = None,
    last: bool = False,
) -> tuple[RecordedOperation, RecordedOperation]:
    """Observe one operation and record the next in the caller's transaction.

    ``record`` holds :func:`operation_record`'s keyword arguments; ``projection_fp`` is the
    one its checkpoint carries; ``first``, writes of the caller's own made before them
    (the engine's step going ``executing``, or its step rows with the next step inserted
    ``executing``: :class:`FirstWrites`). Equivalent to ``first.write(fence)``,
    ``observation.write()`` and ``operation_record(**record, projection_fp=projection_fp)``
    one after the other, all or nothing, with the same errors (the ledger's tagged with
    ``ledger_write``); on PostgreSQL the writes are one server call.

    ``last``: the caller's transaction writes nothing after this call. When it has sent
    nothing before it either and the call needs no read, the call is sent alone in
    autocommit (ADR 0051): the caller's commit is then this one statement.
    """
    joinable = record["fence"] == observation.fence and not record.get("compensation")
    if not (one_call_steps() and joinable):
        return _separately(observation, record, projection_fp, first)
    with opening_incidents(), atomic(), default_db().cursor() as cursor:
        known = _tail_known(observation, record)
        if known is not None:
            alone = last and untouched()
            done, first = _call_tail(
                cursor, observation, known, record, projection_fp, first, alone=alone
            )
            if done is not None:
                return done
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
    result_fp = result_fingerprint(result)
    since = marked_since(observation.fence) if state in SUCCESS else None
    if state in SUCCESS:
        row, subject_rows, checkpoints, since = _success_reads(
            cursor, observation.key, observation.fence, since
        )
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
    fact = _observed_fact(observation, state, row["revision"] + 1, result_fp)
    prepared = chain.prepare(subject, head, "operation.observed", fact, observation.projection_fp)
    return row, prepared, (state, result_fp, fact)


_CALL = (
    "SELECT recovery_observe_record(%s, %s, %s::bigint, %s, %s, %s, %s::bigint, %s::bigint, "
    "%s, %s::integer, %s, %s, %s::boolean, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s::integer, "
    "%s, %s::text[], %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
)


def _call(cursor, observation, loaded, record, projection_fp, first):
    """Step k+1's operation and checkpoint prepared, then the one call (needs the
    caller's transaction: a refused write is explained, then rolled back with it)."""
    row, observed, (state, result_fp, observed_fact) = loaded
    fence: Fence = observation.fence
    subject: Subject = observed.subject
    key, values, fact, recorded = _next_prepared(record, fence, observed, projection_fp)
    observe = [row["id"], row["state"], row["revision"], state, result_fp, state in SUCCESS]
    arguments = [
        *(subject.type, subject.id, observed.seq - 1, observed.prev_link),
        *(fence.key, fence.holder, fence.fence),
        *observe,
        *_recorded_arguments(record, key, values, observed, recorded),
    ]
    refused = _execute(cursor, _CALL, arguments, first, fence)
    if refused == "row":  # nothing refused, one part merely matched no row: as alone
        return _call(cursor, observation, loaded, record, projection_fp, None)
    if refused:
        raise _explained(cursor, refused, row, state, observed, (key, values), fence)
    _remember(fence, None, [(observed, observed_fact), (recorded, fact)])
    return (
        RecordedOperation(row["key"], subject, state, row["revision"] + 1, observed.seq, result_fp),
        RecordedOperation(key, subject, values["state"], 1, recorded.seq),
    )


def _tail_known(observation: Observation, record: dict[str, Any]):
    """The run's mark and step k's operation as the run wrote them, when the call may
    check the tail instead of reading it (ADR 0051): the run wrote step k's operation after
    its mark, under this lease, and the observation is a move it allows. Else None."""
    mark = chain.mark_peek(observation.fence)
    if mark is None or not mark.written or mark.subject != record["subject"]:
        return None
    if chain.whole_asked(observation.fence):  # the whole chain is read instead (ADR 0076)
        return None
    op = mark.touched.get(observation.key)
    state = observation.state
    if (
        op is None
        or state not in OBSERVABLE
        or op["lease"] != observation.fence.key
        or op["state"] == state
        or not can_transition(op["state"], state)
    ):
        return None
    return mark, op


_CALL_TAIL = (
    "SELECT recovery_tail_observe_record(%s, %s, %s::bigint, %s, %s, %s, %s, %s, %s::bigint, "
    "%s, %s, %s::text[], %s, %s, %s, %s, %s, %s, %s::boolean)"
)
"""19 parameters (migrations 0018, 0021, 0022, 0028): with the engine's step rows in
front, a statement of 48, under psycopg's 50, so its conversion is cached. The last says
whether the caller's rows in front checked the lease (migration 0028)."""


def _call_tail(cursor, observation, known, record, projection_fp, first, *, alone=False):
    """The one call without reading the chain: it checks that the stored rows past the
    run's mark are the ones the run wrote (migration 0018, ADR 0051), then writes as
    :func:`_call`. Returns the two operations and None, or None and the caller's rows
    still to write (``first``, or None once they are written) when the tail was not as
    written: the caller then reads and verifies as before, in the same transaction.

    ``alone``: sent in autocommit, as the caller's whole commit (:func:`_execute`). A
    refusal there wrote nothing: the tail not as written goes to the read with the
    caller's rows still to write, any other refusal is made again in the transaction,
    where it is explained as always."""
    mark, op = known
    fence: Fence = observation.fence
    subject: Subject = mark.subject
    state = str(observation.state)
    result = observation.result
    result_fp = result_fingerprint(result)
    revision = op["revision"] + 1
    observed_fact = _observed_fact(observation, state, revision, result_fp)
    observed = chain.prepare(
        subject, Head(*mark.head), "operation.observed", observed_fact, observation.projection_fp
    )
    key, values, fact, recorded = _next_prepared(record, fence, observed, projection_fp)
    tail = tail_joined(mark)
    if tail is None:  # a field the server's joined text cannot tell apart: read instead
        return None, first
    success = "true" if state in SUCCESS else "false"
    arguments = [
        *tail,
        *(fence.key, fence.holder, fence.fence),
        json_text(
            [
                *(observation.key, op["state"], str(op["revision"]), state, result_fp, success),
                # The head the links were computed from (migration 0022).
                *(str(observed.seq - 1), observed.prev_link),
            ]
        ),
        *_recorded_arguments(record, key, values, observed, recorded, packed=True),
        first is not None,  # its rows in front check the lease, and lock it (0028)
    ]
    refused = _execute(cursor, _CALL_TAIL, arguments, first, fence, alone)
    if alone and refused:
        if refused == "tail":
            chain.mark_forget_written(fence)  # not as written: read and verify instead
            return None, first
        return _call_tail(cursor, observation, known, record, projection_fp, first)
    if refused in ("tail", "row"):
        if refused == "tail":
            chain.mark_forget_written(fence)  # not as written: read and verify instead
        return None, None
    if refused:
        row = {"key": observation.key, "state": op["state"], "revision": op["revision"]}
        raise _explained(cursor, refused, row, state, observed, (key, values), fence)
    _remember(fence, mark, [(observed, observed_fact), (recorded, fact)])
    return (
        RecordedOperation(observation.key, subject, state, revision, observed.seq, result_fp),
        RecordedOperation(key, subject, values["state"], 1, recorded.seq),
    ), None
