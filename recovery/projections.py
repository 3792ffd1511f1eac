"""Projections under the chain: the owner's rows, fingerprinted and checkpointed.

The recovery core keeps the ledger; the application that owns a subject (the engine, for
an instance) keeps its own rows — variables, step states — which are a *projection* of what
the ledger decided. To bring those rows under the chain, the owner:

1. passes the fingerprint of its projection with every ledger write it makes
   (``projection_fp=``), or records one with :func:`projection_record` when a commit of its
   own changed the projection without a ledger write; and
2. registers a reader for its subject type with :func:`projection_register`, which
   recomputes that fingerprint from the stored rows.

:func:`recovery.chain.chain_verify` then compares the stored projection with the newest
one the chain recorded: a row edited behind the chain's back is a broken chain. The
recovery core never learns what the projection contains.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import connection

from . import chain
from .canonical import FingerprintKind, fingerprint_value
from .errors import RecoveryValidationError, StaleFence
from .models import Checkpoint, IntegrityIncident
from .subjects import Subject

__all__ = [
    "incident_open_sql",
    "projection_fingerprint",
    "projection_head_sql",
    "projection_read",
    "projection_record",
    "projection_register",
    "projection_start_statement",
]

Reader = Callable[[str], str]
_readers: dict[str, Reader] = {}
_CP = Checkpoint._meta.db_table
_INC = IntegrityIncident._meta.db_table


def projection_register(subject_type: str, reader: Reader) -> None:
    """Register ``reader(subject_id) -> fingerprint`` for a subject type (at app ready).

    The reader returns :func:`projection_fingerprint` of the stored rows, or ``""`` when the
    subject's owner row no longer exists (which is itself a mismatch).
    """
    existing = _readers.get(subject_type)
    if existing is not None and existing is not reader:
        raise RecoveryValidationError(
            f"A projection reader for {subject_type!r} is already registered."
        )
    _readers[subject_type] = reader


def projection_read(subject: Subject) -> str | None:
    """The subject's current projection fingerprint, or None when nobody registered one."""
    reader = _readers.get(subject.type)
    return None if reader is None else reader(subject.id)


def projection_fingerprint(value: Any) -> str:
    """The fingerprint of a projection value (canonical JSON, domain-separated)."""
    return fingerprint_value(FingerprintKind.PROJECTION, value)


def projection_record(
    *, subject: Subject, projection_fp: str, fence=None, new: bool = False
) -> int:
    """Append a ``projection`` checkpoint: the owner's rows changed without a ledger write.

    Joins the caller's transaction (the commit that changed the rows). With ``fence``, the
    append is refused with :class:`StaleFence` unless the fence is still live. With
    ``new`` the subject was created in this transaction (an instance's start): its chain
    starts here, after nothing, without reading a head; a chain already there for it is
    refused as a :class:`ChainConflict`, never appended to. Returns the checkpoint's
    sequence number.
    """
    from .services.leases import fence_condition

    with connection.cursor() as cursor:
        if fence is not None:
            sql, params = fence_condition(fence)
            cursor.execute(f"SELECT {sql}", params)
            if not cursor.fetchone()[0]:
                raise StaleFence(
                    f"{fence} is no longer the live lease; the projection of {subject} "
                    "was not recorded."
                )
        head = chain.EMPTY if new else chain.read_head(cursor, subject)
        fact: dict[str, Any] = {"fence": fence.fence} if fence is not None else {}
        return chain.append(cursor, subject, head, "projection", fact, projection_fp).seq


@dataclass(frozen=True)
class ChainStart:
    """:func:`projection_record` ``(new=True)``'s ``INSERT``, not run (``sql``, ``params``).

    For an owner that creates the subject and starts its chain in one statement of its own
    (the engine's instance start on PostgreSQL: a part of its ``WITH``). The checkpoint is
    the same row, link included. A chain already there for the subject makes the statement
    fail on the chain's (subject, seq) constraint: :meth:`conflict` turns that failure into
    the :class:`ChainConflict` ``projection_record`` raises.
    """

    subject: Subject
    sql: str
    params: list[Any]

    def conflict(self, exc: Exception) -> Exception | None:
        """The :class:`ChainConflict` an ``IntegrityError`` of the statement holding this
        insert stands for, or None when another of its constraints failed."""
        return chain.conflict_of(exc, self.subject, chain.EMPTY.seq + 1)


def projection_start_statement(subject: Subject, projection_fp: str) -> ChainStart:
    """The first checkpoint of a new subject's chain as :class:`ChainStart`, not written."""
    checkpoint = chain.prepare(subject, chain.EMPTY, "projection", {}, projection_fp)
    return ChainStart(subject, *chain.insert_statement(checkpoint))


def projection_head_sql(subject: Subject) -> tuple[str, list[Any]]:
    """A scalar subquery: the newest projection fingerprint the subject's chain recorded.

    For owners that read it in the same statement as their own rows (no extra round trip).
    NULL when the chain recorded none.
    """
    return (
        f"(SELECT projection_fp FROM {_CP} WHERE subject_type = %s AND subject_id = %s "
        "AND projection_fp <> '' ORDER BY seq DESC LIMIT 1)",
        [subject.type, subject.id],
    )


def incident_open_sql(subject: Subject) -> tuple[str, list[Any]]:
    """A scalar subquery: the id of the subject's open integrity incident, or NULL."""
    return (
        f"(SELECT id FROM {_INC} WHERE subject_type = %s AND subject_id = %s AND status = 'open')",
        [subject.type, subject.id],
    )
