"""The chain's rows: computing a link, reading the head, appending, loading a subject's rows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from blake3 import blake3
from django.db import IntegrityError

from ..canonical import FingerprintKind, canonical_bytes, canonical_bytes_of_parsed, fingerprint
from ..db import GENESIS_LINK, dialect
from ..errors import ChainConflict
from ..keys import chain_keys
from ..models import Checkpoint, Operation, StoredMark
from ..states import TERMINAL
from ..subjects import Subject

_CP = Checkpoint._meta.db_table
CHECKPOINT_TABLE = _CP
_OP = Operation._meta.db_table

# The operation columns the chain replays and compares (row attribute, fact field).
COMPARED = (
    ("state", "state"),
    ("revision", "revision"),
    ("step_id", "step"),
    ("action", "action"),
    ("recovery_mode", "mode"),
    ("definition_fp", "definition_fp"),
    ("input_fp", "input_fp"),
    ("preview_fp", "preview_fp"),
    ("access_fp", "access_fp"),
    ("idempotency_fp", "idempotency_fp"),
    ("result_fp", "result_fp"),
    ("lease_key", "lease"),
    ("fence", "fence"),
    ("ordinal", "ordinal"),
    ("chain_seq", "chain_seq"),
)
OP_COLUMNS = ("key", *(column for column, _ in COMPARED))


@dataclass(frozen=True)
class Head:
    """The last link of a chain: its sequence number (the subject's revision) and link."""

    seq: int
    link: str


EMPTY = Head(0, GENESIS_LINK)


def compute_link(
    key: bytes, subject: Subject, seq: int, kind: str, fact_fp: str, prev_link: str
) -> str:
    # The canonical bytes of [type, id, seq, kind, fact_fp, prev_link], written directly:
    # every element is a str or an int, so there is nothing for canonical_bytes to check
    # (a lone surrogate still fails the UTF-8 encoding).
    data = canonical_bytes_of_parsed(
        [str(subject.type), str(subject.id), int(seq), str(kind), str(fact_fp), str(prev_link)]
    )
    return blake3(data, key=key).hexdigest()


def read_head(cursor, subject: Subject) -> Head:
    cursor.execute(
        f"SELECT seq, link FROM {_CP} WHERE subject_type = %s AND subject_id = %s "
        "ORDER BY seq DESC LIMIT 1",
        [subject.type, subject.id],
    )
    row = cursor.fetchone()
    return Head(row[0], row[1]) if row else EMPTY


@dataclass(frozen=True)
class Prepared:
    """One checkpoint as it will be inserted after a head: its row's values, link computed.

    Computed in Python (the chain key never reaches the database); inserted by
    :func:`append`, or passed as parameters to a one-call step commit that checks the head
    it was computed against.
    """

    subject: Subject
    seq: int
    kind: str
    fact: str
    fact_fp: str
    prev_link: str
    link: str
    key_id: str
    projection_fp: str

    @property
    def head(self) -> Head:
        """The chain's head once this checkpoint is in."""
        return Head(self.seq, self.link)

    def row(self) -> list[Any]:
        """The values of the INSERT, in :data:`CHECKPOINT_COLUMNS` order (no clock)."""
        return [
            self.subject.type,
            self.subject.id,
            self.seq,
            self.kind,
            self.fact,
            self.fact_fp,
            self.prev_link,
            self.link,
            self.key_id,
            self.projection_fp,
        ]


CHECKPOINT_COLUMNS = (
    "subject_type, subject_id, seq, kind, fact, fact_fp, prev_link, link, key_id, projection_fp"
)


def prepare(
    subject: Subject, head: Head, kind: str, fact: dict[str, Any], projection_fp: str = ""
) -> Prepared:
    """The checkpoint that follows ``head``: fact bytes, fingerprint and keyed link."""
    if projection_fp:
        fact = {**fact, "projection": projection_fp}
    keys = chain_keys()
    key = keys.keys[keys.active_id]
    # A fact is made by the ledger from what it admitted (fingerprints, states, checked
    # texts): a value that is not JSON still fails the encoding, with the walk's error.
    fact_bytes = canonical_bytes(fact, admitted=True)
    fact_fp = fingerprint(FingerprintKind.FACT, fact_bytes)
    seq = head.seq + 1
    link = compute_link(key, subject, seq, kind, fact_fp, head.link)
    return Prepared(
        subject,
        seq,
        kind,
        fact_bytes.decode(),
        fact_fp,
        head.link,
        link,
        keys.active_id,
        projection_fp,
    )


def conflict(subject: Subject, seq: int) -> ChainConflict:
    """The error of an append that lost the compare-and-swap on (subject, seq)."""
    return ChainConflict(
        f"Checkpoint #{seq} of {subject} was written by someone else first. Nothing was "
        "recorded; reload the subject and try again."
    )


def append(
    cursor,
    subject: Subject,
    head: Head,
    kind: str,
    fact: dict[str, Any],
    projection_fp: str = "",
) -> Head:
    """Append one checkpoint after ``head`` (internal: the caller holds a transaction).

    The unique (subject, seq) constraint is the compare-and-swap: if another writer
    appended first, this raises :class:`ChainConflict` and the transaction rolls back.
    ``projection_fp``, when given, is the fingerprint of the subject's projection (the
    owner's rows, e.g. an instance's variables and steps) as this checkpoint leaves it; it
    is part of the fact, so the chain covers it.
    """
    return insert_prepared(cursor, prepare(subject, head, kind, fact, projection_fp))


def insert_statement(checkpoint: Prepared) -> tuple[str, list[Any]]:
    """:func:`insert_prepared`'s ``INSERT`` as ``(sql, params)``, not run: for a caller
    that sends it as a part of its own statement (and maps a failure with
    :func:`conflict_of`)."""
    return (
        f"INSERT INTO {_CP} ({CHECKPOINT_COLUMNS}, recorded_at) "
        f"VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, {dialect().now})",
        checkpoint.row(),
    )


def insert_prepared(cursor, checkpoint: Prepared) -> Head:
    """Insert a checkpoint :func:`prepare` computed; :class:`ChainConflict` if its
    position was taken."""
    try:
        cursor.execute(*insert_statement(checkpoint))
    except IntegrityError as exc:
        raise conflict(checkpoint.subject, checkpoint.seq) from exc
    return checkpoint.head


POSITION_CONSTRAINT = next(
    c.name
    for c in Checkpoint._meta.constraints
    if list(c.fields) == ["subject_type", "subject_id", "seq"]
)
"""The unique (subject, seq) constraint's name: the chain's compare-and-swap."""


def conflict_of(exc: IntegrityError, subject: Subject, seq: int) -> ChainConflict | None:
    """The :class:`ChainConflict` that ``exc`` stands for when checkpoint #``seq`` of
    ``subject`` lost its position, or None when another constraint of the statement failed
    (PostgreSQL names it; elsewhere a failed statement holding the insert counts as lost)."""
    diag = getattr(exc.__cause__, "diag", None)
    name = getattr(diag, "constraint_name", None)
    if name is None or name == POSITION_CONSTRAINT:
        return conflict(subject, seq)
    return None


_READ = "seq, kind, fact, fact_fp, prev_link, link, key_id, projection_fp"


def load_checkpoints(cursor, subject: Subject, since: int = 0) -> list[Sequence[Any]]:
    """The subject's checkpoints in order: all, or from #``since`` on (a verified mark's
    own and those after it, ADR 0034)."""
    tail = " AND seq >= %s" if since else ""
    cursor.execute(
        f"SELECT {_READ} FROM {_CP} WHERE subject_type = %s AND subject_id = %s{tail} ORDER BY seq",
        [subject.type, subject.id, *([since] if since else [])],
    )
    return cursor.fetchall()


def load_operations(cursor, subject: Subject) -> list[Sequence[Any]]:
    cursor.execute(
        f"SELECT {', '.join(OP_COLUMNS)} FROM {_OP} WHERE subject_type = %s AND subject_id = %s",
        [subject.type, subject.id],
    )
    return cursor.fetchall()


_MARK = StoredMark._meta.db_table
MARK_TABLE = _MARK
SEAL_AS_CHECKPOINT = "seq, NULL, ops, mac, NULL, link, key_id, NULL"
"""A sealed mark's columns in a checkpoint row's places (``stored.Seal.of_row`` reads
them): seq, (kind), ops as the fact, mac as its fingerprint, (prev), link, key id,
(projection)."""


def load_sealed(cursor, subject: Subject) -> tuple[Sequence[Any] | None, list, list]:
    """A subject's checkpoints and operations in one statement (one round trip, ADR 0052),
    from its sealed mark on (ADR 0066); padded with NULLs to one row shape.

    Returns the sealed mark's row (``seq, link, ops, key_id, mac``; None when the subject
    has none), the checkpoints from its position on (all without one) and the operation
    rows past it or still able to move (all without one): what a run verifies from the
    mark once its seal holds. A seal that does not hold means reading the rest as well.
    """
    width, ops = _READ.count(",") + 1, len(OP_COLUMNS)
    where = "WHERE subject_type = %s AND subject_id = %s"
    since = "(SELECT coalesce(max(seq), 0) FROM sealed)"
    still = ", ".join(f"'{state}'" for state in sorted(TERMINAL))
    # The seal is read once (a CTE read twice is computed once); it rides in the
    # checkpoint columns (SEAL_AS_CHECKPOINT).
    cursor.execute(
        f"WITH sealed AS (SELECT seq, link, ops, key_id, mac FROM {_MARK} {where}) "
        f"SELECT 0, {_READ}, {', '.join(['NULL'] * ops)} FROM {_CP} {where} "
        f"AND seq >= {since} UNION ALL "
        f"SELECT 1, {', '.join(['NULL'] * width)}, {', '.join(OP_COLUMNS)} FROM {_OP} {where} "
        f"AND (chain_seq > {since} OR state NOT IN ({still})) UNION ALL "
        f"SELECT 2, {SEAL_AS_CHECKPOINT}, {', '.join(['NULL'] * ops)} FROM sealed ORDER BY 1, 2",
        [subject.type, subject.id] * 3,
    )
    rows = cursor.fetchall()
    checkpoints = [row[1 : 1 + width] for row in rows if row[0] == 0]
    operations = [row[1 + width :] for row in rows if row[0] == 1]
    sealed = next((row[1 : 1 + width] for row in rows if row[0] == 2), None)
    return sealed, checkpoints, operations
