"""Verifying a subject's chain as stored, and the subject's revision."""

from __future__ import annotations

from django.db import connection

from ..decided import load_results
from ..errors import ChainConflict, RevisionRollback
from ..subjects import Subject
from .links import load_checkpoints, load_operations, read_head
from .replay import Verification, verify_rows

VERIFY_ATTEMPTS = 5


def chain_verify(subject: Subject, *, watermark: int | None = None) -> Verification:
    """Recompute ``subject``'s chain and compare it with its rows and its projection.

    The operation rows are compared with the replayed chain; the projection (the rows of
    the subject's owner, read by the reader registered for its type with
    :func:`recovery.projections.projection_register`) is compared with the newest
    projection fingerprint the chain recorded. Checkpoints, operation rows and projection are
    read optimistically by separate statements: if the chain moved while they were read (a
    live instance's step committed between them), they are read again, so a commit landing
    in between is never mistaken for tampering; a chain that never stands still concludes
    nothing (:class:`ChainConflict`).

    Returns a :class:`Verification`: ok, or the first broken position and why. This is a
    read; opening an incident is :func:`recovery.services.incidents.subject_verify`.
    """
    from ..projections import projection_read

    for _ in range(VERIFY_ATTEMPTS):
        with connection.cursor() as cursor:
            before = read_head(cursor, subject)
            result = verify_rows(
                subject,
                load_checkpoints(cursor, subject),
                load_operations(cursor, subject),
                watermark,
                load_results(subject),
            )
            if not result.ok:
                if read_head(cursor, subject) != before:
                    continue  # a step committed between the reads: not a verdict, read again
                return result
            if not result.projection:
                return result
            current = projection_read(subject)
            if read_head(cursor, subject) != before:
                continue  # a commit landed meanwhile: read both again
        if current is None or current == result.projection:
            return result
        return Verification(
            subject,
            False,
            result.length,
            result.projection_seq,
            f"the projection of {subject} (its variables or step states) differs from the "
            f"one checkpoint #{result.projection_seq} recorded: changed behind the chain's back",
        )
    raise ChainConflict(
        f"{subject} kept changing while it was verified ({VERIFY_ATTEMPTS} attempts); "
        "nothing was concluded: verify it again when it is quiet."
    )


def subject_revision(subject: Subject) -> int:
    """Return the subject's revision: the sequence number of its newest checkpoint."""
    with connection.cursor() as cursor:
        return read_head(cursor, subject).seq


def revision_require(subject: Subject, *, watermark: int) -> int:
    """Return the current revision, or raise :class:`RevisionRollback` if below ``watermark``."""
    current = subject_revision(subject)
    if current < watermark:
        raise RevisionRollback(
            f"{subject} is at revision {current} but revision {watermark} was seen before: "
            "the stored state was rolled back. Do not act on it; open an integrity incident."
        )
    return current
