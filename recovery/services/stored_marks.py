"""Sealed marks: a run's verified mark kept for its subject's next run (ADR 0066).

:func:`chain_mark_store` is called by the owner in the commit that ends a run whose
subject goes on (an instance left waiting for a timer, a message or a person). The next
run's first dispatch reads the seal with the chain (``chain.load_sealed``, one statement)
and verifies only what follows it (:func:`sealed_head`); a run whose first ledger write is
a success (a poll's answer) verifies from the seal too (:func:`sealed_success_reads`).
"""

from __future__ import annotations

import logging

from django.db import connection

from .. import chain
from ..db import dialect
from ..models import StoredMark
from ..subjects import Subject
from ._ledger import Head, verified_head
from .leases import Fence

__all__ = [
    "STORE_AFTER",
    "chain_mark_store",
    "seal_wanted",
    "sealed_head",
    "sealed_success_reads",
]

log = logging.getLogger(__name__)

STORE_AFTER = 32
"""Checkpoints a run's mark must have gone past the subject's seal before it is sealed
again: below that, the next run reads a few more checkpoints rather than this run writing
a row at every end."""

_TABLE = StoredMark._meta.db_table
_UPSERT = (
    f"INSERT INTO {_TABLE} "
    "(subject_type, subject_id, seq, link, ops, key_id, mac, written_at) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s, {now}) "
    "ON CONFLICT (subject_type, subject_id) DO UPDATE SET seq = excluded.seq, "
    "link = excluded.link, ops = excluded.ops, key_id = excluded.key_id, mac = excluded.mac, "
    "written_at = excluded.written_at"
)


def chain_mark_store(*, fence: Fence) -> bool:
    """Seal the verified mark of the run holding ``fence`` for its subject's next run, in
    the caller's transaction, when it has gone :data:`STORE_AFTER` checkpoints past the
    subject's seal; True when it was written.

    Needs no fence check: a seal states what the run verified (checkpoint ``seq`` carried
    ``link``, the open operations stood so), which stays true whoever holds the lease now.
    It replaces the subject's seal whatever that says: a later run that read a seal that
    does not verify (a forged one, even one claiming a position past the chain's end) has
    no mark from it and so seals again, and a stale run's older seal only means the next
    run reads a few more checkpoints.
    """
    mark = chain.mark_peek(fence)
    if mark is None or mark.seq - mark.stored < STORE_AFTER:
        return False
    sealed = chain.seal(mark)
    subject = mark.subject
    with connection.cursor() as cursor:
        cursor.execute(
            _UPSERT.format(now=dialect().now),
            [subject.type, subject.id, sealed.seq, sealed.link, sealed.ops, sealed.key_id,
             sealed.mac],
        )  # fmt: skip
    mark.stored = mark.seq
    return True


def sealed_head(cursor, subject: Subject, fence: Fence) -> Head:
    """Verify ``subject``'s chain for the first dispatch of the run holding ``fence``:
    from the subject's seal on when it holds, else whole; keep the run's mark at the
    head. Raises :class:`~recovery.errors.ChainBroken` as :func:`verified_head` does.

    A seal that does not verify (not written with the chain key, another subject's, a
    retired key) is ignored, with a warning: the whole chain is read and verified.
    """
    row, checkpoints, operations = chain.load_sealed(cursor, subject)
    if row is None:  # no seal: the rows are the whole chain's
        return verified_head(cursor, subject, operations, checkpoints=checkpoints, fence=fence)
    mark = _unsealed(subject, row, fence)
    if mark is None:
        return verified_head(cursor, subject, None, fence=fence)
    return verified_head(
        cursor, subject, operations, checkpoints=checkpoints, fence=fence, since=mark.seq
    )


def seal_wanted(fence: Fence) -> bool:
    """Whether a success of the run holding ``fence`` reads its chain from its subject's
    seal (ADR 0066 amended): the run has no mark (not even one at #0, a fresh chain it
    wrote: ADR 0040) and its owner did not ask for a whole verification
    (``chain_mark_drop``: the commit that ends an instance, ADR 0038)."""
    return chain.mark_peek(fence) is None and not chain.whole_asked(fence)


def sealed_success_reads(cursor, key: str, fence: Fence):
    """A success's reads for a run with no mark (:func:`seal_wanted`), where a step is one
    call (PostgreSQL): its run's first ledger write is this success, the answer of a poll.

    One statement, as without a seal (``step_parts._load_for_success(sealed=True)``): the
    operation, and its subject's chain and operations from the subject's sealed mark on,
    or whole when it has none. A seal that holds is kept as the run's mark, and the success
    verifies only what follows it, as after a mark of its own run (ADR 0034); one that
    does not hold is ignored, with a warning, and the chain is read again whole. Returns
    ``(row, subject rows, checkpoints, since)`` for ``verified_head``.
    """
    from .step_parts import _load_for_success  # step_parts builds on this package's modules

    row, subject_rows, checkpoints, sealed = _load_for_success(cursor, key, sealed=True)
    if sealed is None:  # no seal: the rows are the whole chain's
        return row, subject_rows, checkpoints, None
    mark = _unsealed(Subject(row["subject_type"], row["subject_id"]), sealed, fence)
    if mark is None:
        return row, None, None, None  # verified_head reads the whole chain
    return row, subject_rows, checkpoints, mark.seq


def _unsealed(subject: Subject, row, fence: Fence) -> chain.Mark | None:
    """The mark a seal's ``row`` holds, kept as the run's; None, with a warning, when the
    seal does not verify (not written with the chain key, another subject's, a retired
    key): the whole chain is read and verified instead."""
    mark = chain.unseal(subject, chain.Seal.of_row(row))
    if mark is None:
        log.warning(
            "The sealed chain mark of %s does not verify with the chain keys; it is ignored "
            "and the whole chain is verified.",
            subject,
        )
        return None
    chain.mark_keep(fence, mark)
    return mark
