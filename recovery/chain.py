"""The keyed BLAKE3 checkpoint chain: append, verify, revisions.

Link ``n`` is ``BLAKE3(key, canonical([subject type, subject id, n, kind, fact
fingerprint, link n-1]))``, with link 0 all zeros. A writer without the key cannot produce
a valid link, so a rewritten, removed, reordered or re-hashed checkpoint is detected.
Removing checkpoints from the *end* leaves a valid shorter chain: that is detected
against a watermark (a revision a reader saw earlier) and against the operation rows,
which remember the position of their latest checkpoint.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from blake3 import blake3
from django.db import IntegrityError, connection

from .canonical import FingerprintKind, canonical_bytes, canonical_bytes_of_parsed, fingerprint
from .db import GENESIS_LINK, dialect
from .errors import ChainConflict, RevisionRollback
from .keys import chain_keys
from .models import Checkpoint, Operation
from .states import can_transition
from .subjects import Subject

__all__ = ["Head", "Verification", "chain_verify", "revision_require", "subject_revision"]

_CP = Checkpoint._meta.db_table
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
    # every element is a str or an int, so there is nothing for canonical_bytes to check.
    data = json.dumps(
        [str(subject.type), str(subject.id), int(seq), str(kind), str(fact_fp), str(prev_link)],
        separators=(",", ":"),
        ensure_ascii=False,
    ).encode("utf-8")
    return blake3(data, key=key).hexdigest()


def read_head(cursor, subject: Subject) -> Head:
    cursor.execute(
        f"SELECT seq, link FROM {_CP} WHERE subject_type = %s AND subject_id = %s "
        "ORDER BY seq DESC LIMIT 1",
        [subject.type, subject.id],
    )
    row = cursor.fetchone()
    return Head(row[0], row[1]) if row else EMPTY


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
    if projection_fp:
        fact = {**fact, "projection": projection_fp}
    keys = chain_keys()
    key = keys.keys[keys.active_id]
    fact_bytes = canonical_bytes(fact)
    fact_fp = fingerprint(FingerprintKind.FACT, fact_bytes)
    seq = head.seq + 1
    link = compute_link(key, subject, seq, kind, fact_fp, head.link)
    try:
        cursor.execute(
            f"INSERT INTO {_CP} (subject_type, subject_id, seq, kind, fact, fact_fp, "
            f"prev_link, link, key_id, projection_fp, recorded_at) "
            f"VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, {dialect().now})",
            [
                subject.type,
                subject.id,
                seq,
                kind,
                fact_bytes.decode(),
                fact_fp,
                head.link,
                link,
                keys.active_id,
                projection_fp,
            ],
        )
    except IntegrityError as exc:
        raise ChainConflict(
            f"Checkpoint #{seq} of {subject} was written by someone else first. Nothing was "
            "recorded; reload the subject and try again."
        ) from exc
    return Head(seq, link)


@dataclass(frozen=True)
class Verification:
    """The result of verifying one subject's chain against its operation rows."""

    subject: Subject
    ok: bool
    length: int
    position: int | None = None
    reason: str = ""
    projection: str = ""
    """The newest projection fingerprint the chain records ('' when none)."""
    projection_seq: int = 0
    """The checkpoint that recorded it."""

    def __str__(self) -> str:
        if self.ok:
            return f"{self.subject}: ok ({self.length} checkpoints)"
        return f"{self.subject}: BROKEN at #{self.position}: {self.reason}"


@dataclass
class _Replayed:
    ops: dict[str, dict[str, Any]]
    length: int = 0
    projection: str = ""
    projection_seq: int = 0
    failure: Verification | None = None


def _replay(
    subject: Subject, checkpoints: Iterable[Sequence[Any]], watermark: int | None
) -> _Replayed:
    keys = chain_keys()
    replayed = _Replayed(ops={})
    ops = replayed.ops
    prev = GENESIS_LINK
    length = 0

    def broken(position: int, reason: str) -> _Replayed:
        replayed.length = length
        replayed.failure = Verification(subject, False, length, position, reason)
        return replayed

    for seq, kind, fact, fact_fp, prev_link, link, key_id, projection_fp in checkpoints:
        expected = length + 1
        if seq != expected:
            return broken(expected, f"checkpoint #{expected} is missing (next is #{seq})")
        if prev_link != prev:
            return broken(
                seq,
                f"checkpoint #{seq} does not follow #{seq - 1} (previous "
                "link differs: removed, reordered or rewritten)",
            )
        key = keys.get(key_id)
        if key is None:
            return broken(seq, f"checkpoint #{seq} names an unknown chain key {key_id!r}")
        fact_bytes = fact.encode()
        try:
            parsed = json.loads(fact)
            canonical = canonical_bytes_of_parsed(parsed) == fact_bytes
        except (ValueError, RecursionError):  # a lone surrogate; a fact nested past reason
            canonical = False
        if not canonical or not isinstance(parsed, dict):
            return broken(seq, f"checkpoint #{seq}'s fact is not canonical JSON")
        if fingerprint(FingerprintKind.FACT, fact_bytes) != fact_fp:
            return broken(
                seq,
                f"checkpoint #{seq}'s fact does not match its fingerprint (the fact was changed)",
            )
        if compute_link(key, subject, seq, kind, fact_fp, prev_link) != link:
            return broken(
                seq,
                f"checkpoint #{seq}'s link does not verify with key "
                f"{key_id!r} (rewritten or re-hashed without the key)",
            )
        if parsed.get("projection", "") != projection_fp:
            return broken(
                seq,
                f"checkpoint #{seq}'s projection column does not match its fact "
                "(changed behind the chain's back)",
            )
        prev = link
        length = seq
        if projection_fp:
            replayed.projection, replayed.projection_seq = projection_fp, seq
        problem = _apply(ops, seq, kind, parsed)
        if problem:
            return broken(seq, problem)
    if watermark is not None and length < watermark:
        return broken(
            length + 1,
            f"the chain ends at #{length} but #{watermark} was seen "
            "before: checkpoints were removed from its end",
        )
    replayed.length = length
    return replayed


def _apply(ops: dict[str, dict[str, Any]], seq: int, kind: str, fact: dict[str, Any]) -> str:
    key = fact.get("operation")
    if key is None or "state" not in fact:
        return ""
    if kind == "operation.recorded":
        if key in ops:
            return f"checkpoint #{seq} records operation {key} a second time"
        ops[key] = {field: fact.get(field) for _, field in COMPARED} | {"chain_seq": seq}
        return ""
    current = ops.get(key)
    if current is None:
        return f"checkpoint #{seq} changes operation {key} before it was recorded"
    if not can_transition(current["state"], fact["state"]):
        return (
            f"checkpoint #{seq} moves operation {key} from {current['state']} to "
            f"{fact['state']}, which is not an allowed transition"
        )
    if fact.get("revision") != current["revision"] + 1:
        return f"checkpoint #{seq} skips a revision of operation {key}"
    current.update(
        state=fact["state"],
        revision=fact["revision"],
        result_fp=fact.get("result_fp", current["result_fp"]),
        chain_seq=seq,
    )
    return ""


def compare(
    subject: Subject, ops: dict[str, dict[str, Any]], rows: Iterable[Sequence[Any]], length: int
) -> Verification:
    """Compare replayed operations with their rows (the fast projection)."""
    rows = list(rows)
    # chain_seq is the last compared column. A row pointing past the chain's end means
    # checkpoints were removed from the end; blaming the row would send people astray.
    beyond = max(((row[-1], row[0]) for row in rows if row[-1] > length), default=None)
    if beyond is not None:
        return Verification(
            subject,
            False,
            length,
            length + 1,
            f"the chain ends at #{length} but operation {beyond[1]}'s row "
            f"points to checkpoint #{beyond[0]}: checkpoints were removed "
            "from its end",
        )
    seen = set()
    for row in rows:
        key, values = row[0], row[1:]
        seen.add(key)
        expected = ops.get(key)
        if expected is None:
            return Verification(
                subject,
                False,
                length,
                length + 1,
                f"operation {key} has no checkpoint in the chain",
            )
        for (column, field), value in zip(COMPARED, values, strict=True):
            if expected[field] != value:
                return Verification(
                    subject,
                    False,
                    length,
                    expected["chain_seq"],
                    f"operation {key}'s {column} is {value!r} in its row but "
                    f"{expected[field]!r} in the chain (changed behind the chain's back)",
                )
    for key, expected in ops.items():
        if key not in seen:
            return Verification(
                subject,
                False,
                length,
                expected["chain_seq"],
                f"operation {key} is in the chain but its row is missing",
            )
    return Verification(subject, True, length)


def load_checkpoints(cursor, subject: Subject) -> list[Sequence[Any]]:
    cursor.execute(
        f"SELECT seq, kind, fact, fact_fp, prev_link, link, key_id, projection_fp FROM {_CP} "
        "WHERE subject_type = %s AND subject_id = %s ORDER BY seq",
        [subject.type, subject.id],
    )
    return cursor.fetchall()


def load_operations(cursor, subject: Subject) -> list[Sequence[Any]]:
    cursor.execute(
        f"SELECT {', '.join(OP_COLUMNS)} FROM {_OP} WHERE subject_type = %s AND subject_id = %s",
        [subject.type, subject.id],
    )
    return cursor.fetchall()


def verify_rows(
    subject: Subject,
    checkpoints: Sequence[Sequence[Any]],
    operations: Iterable[Sequence[Any]],
    watermark: int | None = None,
) -> Verification:
    replayed = _replay(subject, checkpoints, watermark)
    if replayed.failure is not None:
        return replayed.failure
    result = compare(subject, replayed.ops, operations, replayed.length)
    if not result.ok:
        return result
    return Verification(
        subject,
        True,
        replayed.length,
        projection=replayed.projection,
        projection_seq=replayed.projection_seq,
    )


VERIFY_ATTEMPTS = 5


def chain_verify(subject: Subject, *, watermark: int | None = None) -> Verification:
    """Recompute ``subject``'s chain and compare it with its rows and its projection.

    The operation rows are compared with the replayed chain; the projection (the rows of
    the subject's owner, read by the reader registered for its type with
    :func:`recovery.projections.projection_register`) is compared with the newest
    projection fingerprint the chain recorded. Chain and projection are read optimistically:
    if the chain moved while they were read, they are read again, so a commit landing in
    between is never mistaken for tampering.

    Returns a :class:`Verification`: ok, or the first broken position and why. This is a
    read; opening an incident is :func:`recovery.services.incidents.subject_verify`.
    """
    from .projections import projection_read

    for _ in range(VERIFY_ATTEMPTS):
        with connection.cursor() as cursor:
            before = read_head(cursor, subject)
            result = verify_rows(
                subject,
                load_checkpoints(cursor, subject),
                load_operations(cursor, subject),
                watermark,
            )
            if not result.ok or not result.projection:
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
