"""The database against its anchors: reads and comparisons, no writes.

Writing anchors is ``recovery/services/anchors.py``; the anchor store and its records are
``recovery/anchors/``. Three comparisons, each a :class:`~recovery.chain.Verification`:

- :func:`subject_compare`: a chain shorter than its anchored head, or whose link at the
  anchored position differs, was truncated or rewritten since it was anchored;
- :func:`ledger_verify`: the newest anchored checkpoint must still be there with its
  link, and at least as many checkpoints up to it as were anchored — otherwise the
  database was restored from an older backup or checkpoints were removed;
- :func:`store_verify`: the anchor store's own records verify, and it is not shorter than
  the newest record the database remembers appending (``AnchorMark``).

The last two are about no single chain, so their incidents name the subjects
:data:`LEDGER` and :data:`ANCHOR_STORE`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Iterator

from django.db import connection

from .anchors import AnchorIndex, AnchorRecord
from .chain import Verification
from .db import dialect
from .models import AnchorMark, Checkpoint
from .subjects import LEDGER_WATERMARK, Subject

__all__ = [
    "ANCHOR_STORE",
    "LEDGER",
    "ledger_verify",
    "store_verify",
    "subject_compare",
]

LEDGER = LEDGER_WATERMARK
"""The subject of an incident on the whole ledger: the database is behind its anchors."""

ANCHOR_STORE = Subject("recovery.anchors", "store")
"""The subject of an incident on the anchor store itself."""

_CP = Checkpoint._meta.db_table
Row = tuple[int, str, str, int, str]
"""A checkpoint as the anchors see it: id, subject type, subject id, seq, link."""


def db_now() -> str:
    """The database clock as ISO 8601 UTC (``…Z``), the form anchor records keep."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {dialect().now}", [])
        value = cursor.fetchone()[0]
    if isinstance(value, str):  # SQLite: 'YYYY-MM-DD HH:MM:SS.SSS', in UTC
        value = dt.datetime.fromisoformat(value).replace(tzinfo=dt.UTC)
    return value.astimezone(dt.UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def parse_time(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def checkpoints_after(after: int, limit: int) -> list[Row]:
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT id, subject_type, subject_id, seq, link FROM {_CP} WHERE id > %s "
            "ORDER BY id LIMIT %s",
            [after, limit],
        )
        return [tuple(row) for row in cursor.fetchall()]


def checkpoints_within(ranges: Iterable[tuple[int, int]]) -> list[Row]:
    """The checkpoints whose ids fall in any of the inclusive ``ranges``."""
    ranges = list(ranges)
    if not ranges:
        return []
    where = " OR ".join(["id BETWEEN %s AND %s"] * len(ranges))
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT id, subject_type, subject_id, seq, link FROM {_CP} WHERE {where} ORDER BY id",
            [bound for pair in ranges for bound in pair],
        )
        return [tuple(row) for row in cursor.fetchall()]


def chain_heads(chunk: int = 2000) -> Iterator[tuple[str, str, int, str]]:
    """Every subject's newest checkpoint: (type, id, seq, link), in subject order."""
    with connection.chunked_cursor() as cursor:
        cursor.execute(
            f"SELECT c.subject_type, c.subject_id, c.seq, c.link FROM {_CP} c JOIN ("
            f"  SELECT subject_type, subject_id, MAX(seq) AS seq FROM {_CP}"
            "  GROUP BY subject_type, subject_id"
            ") h ON c.subject_type = h.subject_type AND c.subject_id = h.subject_id "
            "AND c.seq = h.seq ORDER BY c.subject_type, c.subject_id",
            [],
        )
        while rows := cursor.fetchmany(chunk):
            yield from (tuple(row) for row in rows)


def _where(at: str, record: int) -> str:
    return f"anchored at {at} (anchor record #{record})"


def subject_compare(result: Verification, index: AnchorIndex) -> Verification:
    """``result`` (a chain verification), or why the chain contradicts its anchors.

    A chain that already failed keeps its own reason. An anchored subject whose chain is
    shorter than the anchored head, or whose link at that position differs (rewritten,
    even with a valid key), fails at the first position the anchors contradict.
    """
    if not result.ok:
        return result
    subject = result.subject
    head = index.head(subject)
    if head is None:
        return result
    if result.length < head.seq:
        return Verification(
            subject,
            False,
            result.length,
            result.length + 1,
            f"the chain ends at #{result.length} but #{head.seq} was "
            f"{_where(head.at, head.record)}: checkpoints were removed since anchored at "
            f"{head.at}",
        )
    link = (
        Checkpoint.objects.filter(subject_type=subject.type, subject_id=subject.id, seq=head.seq)
        .values_list("link", flat=True)
        .first()
    )
    if link != head.link:
        return Verification(
            subject,
            False,
            result.length,
            head.seq,
            f"checkpoint #{head.seq} is not the one {_where(head.at, head.record)}: the chain "
            f"was rewritten since anchored at {head.at}",
        )
    return result


def ledger_verify(latest: AnchorRecord | None, *, count: bool = True) -> Verification:
    """Compare the database with the ledger watermark of the newest anchor record.

    ``count`` also counts the checkpoints up to the anchored one (a scan: the sweeper
    leaves it to ``recovery_verify``).
    """
    if latest is None or latest.ledger.checkpoint == 0:
        return Verification(LEDGER, True, 0)
    mark, where = latest.ledger, _where(latest.at, latest.n)
    link = Checkpoint.objects.filter(pk=mark.checkpoint).values_list("link", flat=True).first()
    held = mark.count  # the length reported: the checkpoints anchored (counted, below)
    if link is None:
        reason = (
            f"checkpoint {mark.checkpoint}, the newest when {where}, is missing: the "
            "database was restored from an older backup, or checkpoints were removed"
        )
    elif link != mark.tip:
        reason = (
            f"checkpoint {mark.checkpoint} is not the one {where}: the database was restored "
            "from an older backup (its ids were reused), or the checkpoint was rewritten"
        )
    else:
        if count:
            held = Checkpoint.objects.filter(pk__lte=mark.checkpoint).count()
        if held >= mark.count:
            return Verification(LEDGER, True, held)
        reason = (
            f"{held} checkpoint(s) up to {mark.checkpoint} remain, but {mark.count} were "
            f"{where}: {mark.count - held} were removed"
        )
    return Verification(LEDGER, False, 0, None, reason)


def mark_problem(store: str, records: int, link_of) -> str:
    """Why ``store`` contradicts the newest record the database remembers, or ``""``.

    ``records`` is how many records the store holds; ``link_of(n)`` returns record n's
    link when known (``None`` otherwise).
    """
    mark = AnchorMark.objects.filter(store=store).first()
    if mark is None:
        return ""
    written = mark.written_at.astimezone(dt.UTC).isoformat(timespec="seconds")
    if mark.record > records:
        return (
            f"the database remembers appending anchor record #{mark.record} (at {written}) "
            f"but the anchor store {store} holds {records}: records were removed from its "
            "end, or the store was replaced"
        )
    link = link_of(mark.record)
    if link is not None and link != mark.link:
        return (
            f"anchor record #{mark.record} of {store} is not the one the database remembers "
            f"appending at {written}: the anchor store was rewritten or replaced"
        )
    return ""


def store_verify(index: AnchorIndex) -> Verification:
    """The anchor store's own records verify, and it holds what the database remembers."""
    if index.problem is not None:
        position, reason = index.problem
        return Verification(
            ANCHOR_STORE,
            False,
            index.records,
            position,
            f"{reason}; the records from there on are not used",
        )
    problem = mark_problem(index.store, index.records, index.links.get)
    if problem:
        return Verification(ANCHOR_STORE, False, index.records, index.records + 1, problem)
    return Verification(ANCHOR_STORE, True, index.records)
