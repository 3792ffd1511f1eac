"""Replaying a chain from rows already read, and comparing it with the operation rows.

No database here: :func:`verify_rows` takes the checkpoints and the operation rows a
reader loaded (:mod:`.links`) and says whether they agree, or where they first do not.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any

from ..canonical import FingerprintKind, canonical_object, fingerprint
from ..db import GENESIS_LINK
from ..decided import result_mismatch
from ..keys import ChainKeys, chain_keys
from ..states import can_transition
from ..subjects import Subject
from .links import COMPARED, compute_link
from .marks import GENESIS_LIMIT, Mark, texts


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
    subject: Subject
    ops: dict[str, dict[str, Any]]
    length: int = 0
    projection: str = ""
    projection_seq: int = 0
    failure: Verification | None = None
    results: dict[Any, tuple[str, int]] = dataclass_field(default_factory=dict)
    """Decision id → the result fingerprint its request chained, and that checkpoint."""
    touched: set[str] = dataclass_field(default_factory=set)
    """The operations the replayed checkpoints changed."""

    def broken(self, position: int, reason: str) -> _Replayed:
        self.failure = Verification(self.subject, False, self.length, position, reason)
        return self


def _replay(
    subject: Subject,
    checkpoints: Iterable[Sequence[Any]],
    watermark: int | None,
    start: Mark | None = None,
) -> _Replayed:
    """Recompute the chain from its checkpoint rows in order, up to the first break.

    From the start, or from ``start`` (a mark: its checkpoint's link and its operations,
    which the replay moves on in place) when the rows are the ones after it.
    """
    keys = chain_keys()
    replayed = _Replayed(subject, ops={} if start is None else start.ops)
    prev = GENESIS_LINK
    if start is not None:
        replayed.length, prev = start.seq, start.link
    for row in checkpoints:
        seq, kind, _, _, _, link, _, projection_fp = row
        expected = replayed.length + 1
        if seq != expected:
            return replayed.broken(expected, f"checkpoint #{expected} is missing (next is #{seq})")
        fact, problem = _checkpoint_fact(keys, subject, prev, row)
        if problem:
            return replayed.broken(seq, problem)
        prev = link
        replayed.length = seq
        if projection_fp:
            replayed.projection, replayed.projection_seq = projection_fp, seq
        if kind == "decision.requested" and "result_fp" in fact:
            replayed.results[fact.get("decision")] = (fact["result_fp"], seq)
        problem = _apply(replayed.ops, seq, kind, fact)
        if "operation" in fact:
            replayed.touched.add(fact["operation"])
        if problem:
            return replayed.broken(seq, problem)
    if watermark is not None and replayed.length < watermark:
        return replayed.broken(
            replayed.length + 1,
            f"the chain ends at #{replayed.length} but #{watermark} was seen "
            "before: checkpoints were removed from its end",
        )
    return replayed


def _checkpoint_fact(
    keys: ChainKeys, subject: Subject, prev: str, row: Sequence[Any]
) -> tuple[dict[str, Any], str]:
    """The fact of one checkpoint whose row follows ``prev`` and verifies, or why it does not."""
    seq, kind, fact, fact_fp, prev_link, link, key_id, projection_fp = row
    if prev_link != prev:
        return {}, (
            f"checkpoint #{seq} does not follow #{seq - 1} (previous "
            "link differs: removed, reordered or rewritten)"
        )
    key = keys.get(key_id)
    if key is None:
        return {}, f"checkpoint #{seq} names an unknown chain key {key_id!r}"
    fact_bytes = fact.encode()
    parsed = canonical_object(fact, fact_bytes)
    if parsed is None:
        return {}, f"checkpoint #{seq}'s fact is not canonical JSON"
    if fingerprint(FingerprintKind.FACT, fact_bytes) != fact_fp:
        return {}, (
            f"checkpoint #{seq}'s fact does not match its fingerprint (the fact was changed)"
        )
    if compute_link(key, subject, seq, kind, fact_fp, prev_link) != link:
        return {}, (
            f"checkpoint #{seq}'s link does not verify with key "
            f"{key_id!r} (rewritten or re-hashed without the key)"
        )
    if parsed.get("projection", "") != projection_fp:
        return {}, (
            f"checkpoint #{seq}'s projection column does not match its fact "
            "(changed behind the chain's back)"
        )
    return parsed, ""


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
    position, reason = _first_difference(ops, list(rows), length)
    if not reason:
        return Verification(subject, True, length)
    return Verification(subject, False, length, position, reason)


def _first_difference(
    ops: dict[str, dict[str, Any]], rows: list[Sequence[Any]], length: int
) -> tuple[int, str]:
    """Where the rows first differ from the replayed operations, and how; (0, '') if nowhere."""
    # chain_seq is the last compared column. A row pointing past the chain's end means
    # checkpoints were removed from the end; blaming the row would send people astray.
    beyond = max(((row[-1], row[0]) for row in rows if row[-1] > length), default=None)
    if beyond is not None:
        return length + 1, (
            f"the chain ends at #{length} but operation {beyond[1]}'s row "
            f"points to checkpoint #{beyond[0]}: checkpoints were removed "
            "from its end"
        )
    seen = set()
    for row in rows:
        key, values = row[0], row[1:]
        seen.add(key)
        expected = ops.get(key)
        if expected is None:
            return length + 1, f"operation {key} has no checkpoint in the chain"
        for (column, field), value in zip(COMPARED, values, strict=True):
            if expected[field] != value:
                return expected["chain_seq"], (
                    f"operation {key}'s {column} is {value!r} in its row but "
                    f"{expected[field]!r} in the chain (changed behind the chain's back)"
                )
    for key, expected in ops.items():
        if key not in seen:
            return expected["chain_seq"], f"operation {key} is in the chain but its row is missing"
    return 0, ""


def verify_rows(
    subject: Subject,
    checkpoints: Sequence[Sequence[Any]],
    operations: Iterable[Sequence[Any]],
    watermark: int | None = None,
    results: Iterable[Sequence[Any]] = (),
) -> Verification:
    """Verify a chain against its operation rows and, given ``results`` (see
    :func:`~recovery.decided.result_mismatch`), against its decisions' stored results."""
    return _verified(_replay(subject, checkpoints, watermark), operations, results)


def verify_marking(
    subject: Subject,
    checkpoints: Sequence[Sequence[Any]],
    operations: Iterable[Sequence[Any]],
    results: Iterable[Sequence[Any]] = (),
) -> tuple[Verification, Mark | None]:
    """:func:`verify_rows` of the whole chain, and the mark it leaves when it verifies."""
    replayed = _replay(subject, checkpoints, None)
    result = _verified(replayed, operations, results)
    if not result.ok:
        return result, None
    last = checkpoints[-1] if checkpoints else (0, "", "", "", "", GENESIS_LINK)
    # The whole chain, verified: kept with the mark (ADR 0076) unless it is long.
    genesis = [texts(row) for row in checkpoints] if len(checkpoints) <= GENESIS_LIMIT else None
    return result, Mark(subject, replayed.length, last[5], replayed.ops, genesis=genesis)


def verify_tail(
    mark: Mark, checkpoints: Sequence[Sequence[Any]], operations: Sequence[Sequence[Any]]
) -> Verification | None:
    """Verify only what follows ``mark`` (ADR 0034); None when the mark no longer holds.

    ``checkpoints`` are the subject's checkpoints from the mark's own on (``seq >=``), in
    order; ``operations``, the operation rows whose ``chain_seq`` is past the mark and any
    other the caller is about to move. The mark's checkpoint must still carry the mark's
    link (else None: verify the whole chain). Each later checkpoint is verified as a full
    replay would, starting from the mark's link and operations; every operation the tail
    touches must have its row, and every row read must equal its replayed operation. On
    success the mark is moved to the new head, in place; on failure it must be dropped.
    """
    if not checkpoints or checkpoints[0][0] != mark.seq or checkpoints[0][5] != mark.link:
        return None
    replayed = _replay(mark.subject, checkpoints[1:], None, start=mark)
    if replayed.failure is not None:
        return replayed.failure
    ops = replayed.ops
    touched = {k: ops[k] for k in replayed.touched if k in ops and ops[k]["chain_seq"] > mark.seq}
    read = {row[0]: ops[row[0]] for row in operations if row[0] in ops}
    result = compare(mark.subject, touched | read, operations, replayed.length)
    if result.ok:
        mark.seq, mark.link = replayed.length, (checkpoints[-1][5])
        mark.genesis = None  # moved over rows read, not over the run's own writes
    return result


def _verified(
    replayed: _Replayed, operations: Iterable[Sequence[Any]], results: Iterable[Sequence[Any]]
) -> Verification:
    subject = replayed.subject
    if replayed.failure is not None:
        return replayed.failure
    result = compare(subject, replayed.ops, operations, replayed.length)
    if not result.ok:
        return result
    mismatch = result_mismatch(replayed.results, results, replayed.length)
    if mismatch is not None:
        return Verification(subject, False, replayed.length, *mismatch)
    return Verification(
        subject,
        True,
        replayed.length,
        projection=replayed.projection,
        projection_seq=replayed.projection_seq,
    )
